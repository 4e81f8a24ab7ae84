"""cooper_jax/cli/manifest.py: a study folder's manifest lists every file it produced with its
sha256 (per-run files apart), takes seeds and command from the folder, and --check finds a
changed, missing or unlisted summary file."""

import json

from cooper_jax.cli import manifest

ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256(b"abc")


def _study(tmp_path):
  d = tmp_path / "study"
  (d / "runs" / "rule_s0").mkdir(parents=True)
  (d / "table.md").write_bytes(b"abc")
  (d / "results.json").write_text(json.dumps({"seeds": [0, 1]}))
  (d / "command.txt").write_text("cooper-study --out x --seeds 0,1\n")
  (d / "runs" / "rule_s0" / "metrics.jsonl").write_bytes(b"abc")
  return d


def test_manifest_lists_files_and_reads_the_folders_record(tmp_path):
  d = _study(tmp_path)
  manifest.main([str(d), "--code_commit", "deadbeef"])
  m = json.loads((d / "manifest.json").read_text())
  assert m["files"]["table.md"] == ABC
  assert set(m["files"]) == {"table.md", "results.json", "command.txt"}
  assert m["per_run_files"] == {"runs/rule_s0/metrics.jsonl": ABC}
  assert (m["seeds"], m["command"], m["code_commit"]) == (
    [0, 1],
    "cooper-study --out x --seeds 0,1",
    "deadbeef",
  )
  assert manifest.check(d) == []
  assert manifest.main(["--check", str(d)]) == 0


def test_check_finds_changed_missing_and_unlisted_files(tmp_path):
  d = _study(tmp_path)
  manifest.write(d)
  (d / "table.md").write_bytes(b"abd")
  (d / "command.txt").unlink()
  (d / "new.png").write_bytes(b"x")
  (d / "runs" / "rule_s0" / "metrics.jsonl").write_bytes(b"changed")
  problems = "\n".join(manifest.check(d))
  assert "table.md: sha256 differs" in problems
  assert "command.txt: listed in manifest.json but missing" in problems
  assert "new.png: not listed" in problems
  assert "metrics.jsonl: sha256 differs" in problems
  assert manifest.main(["--check", str(d)]) == 1


def test_per_run_files_absent_here_are_not_problems_and_a_rewrite_keeps_their_record(tmp_path):
  d = _study(tmp_path)
  manifest.write(d, code_commit="abc1234")
  (d / "runs" / "rule_s0" / "metrics.jsonl").unlink()  # a fresh clone has no runs/
  assert manifest.check(d) == []
  manifest.write(d)
  m = json.loads((d / "manifest.json").read_text())
  assert m["per_run_files"] == {"runs/rule_s0/metrics.jsonl": ABC}
  assert m["code_commit"] == "abc1234"
