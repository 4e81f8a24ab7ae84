"""cooper_jax/cli/pipeline.py end to end at a tiny size (a random 1-layer model over the SmolLM2
tokenizer in all four roles, a few questions): every stage runs, records its counts, and a
second invocation resumes by skipping every recorded stage."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_jax.io import write_jsonl
from cooper_jax.weights.hf_io import save_hf_dir

ROOT = Path(__file__).resolve().parents[1]
# One GRPO mode (cooper: the one that uses the VerifyRM and the assistant) keeps the test short;
# the smoke run in results/ has all three.
STAGES = [
  "judge_control",
  "annotate",
  "verifyrm",
  "select",
  "grpo/cooper",
  "evaluate/untrained",
  "evaluate/cooper",
]


def _pipeline(out, model, data):
  args = ["--out", str(out), "--size", "smoke", "--train_data", str(data)]
  for role in ("policy", "judge", "rm_backbone", "assistant"):
    args += [f"--{role}", str(model)]
  args += ["--annotate_limit", "4", "--annotate_samples", "2", "--annotate_temperatures", "1.0"]
  args += ["--judge_control", "3"]
  args += ["--max_new_tokens", "8", "--rm_steps", "2", "--rm_batch", "4", "--rm_max_len", "128"]
  args += ["--steps", "1", "--eval_limit", "1", "--eval_samples", "1"]
  args += ["--eval_max_new_tokens", "8", "--benchmarks", "gsm8k/test,odyssey_math/test"]
  args += ["--modes", "cooper", "--grpo_overrides", "rollout.max_new_tokens=8"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  p = subprocess.run(
    [sys.executable, "cooper_jax/cli/pipeline.py", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=1800,
  )
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return p


def test_pipeline_end_to_end_and_resume(tmp_path, tiny_smol):
  cfg, params, tok = tiny_smol
  model = save_hf_dir(cfg, params, tmp_path / "tiny", tokenizer=tok)
  data = tmp_path / "qa.jsonl"
  write_jsonl(data, [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)])
  out = tmp_path / "pipe"
  _pipeline(out, model, data)
  recs = {s: json.loads((out / s / "record.json").read_text()) for s in STAGES}
  ann, rm = recs["annotate"], recs["verifyrm"]
  assert ann["n_triples"] == 4 * 2  # 4 questions x 2 samples x 1 temperature
  assert ann["n_kept"] + ann["n_dropped"] == 8 and ann["n_kept"] >= 1
  assert ann["kept_positive"] + ann["kept_negative"] == ann["n_kept"]
  assert rm["n_train"] + rm["n_heldout"] == ann["n_kept"]
  control = recs["judge_control"]  # the judge's positive control: 3 questions, 6 items
  assert control["n_items"] == 6 and 0.0 <= control["auc"] <= 1.0
  assert control["prefers_right"] + control["prefers_wrong"] + control["ties"] == 3
  assert (Path(rm["rm"]) / "config.json").exists()
  sel = recs["select"]
  assert sel["n_questions"] == 4 and sel["n_mixed"] + sel["n_all_wrong"] + sel["n_all_right"] == 4
  assert [s["step"] for s in recs["grpo/cooper"]["per_step"]] == [1]
  grpo_cfg = json.loads((out / "grpo" / "cooper" / "config.json").read_text())
  assert grpo_cfg["rollout"]["max_new_tokens"] == 8  # --grpo_overrides reached the run
  coop = recs["grpo/cooper"]["per_step"][0]
  rejected = sum(coop["negatives_rejected"].values())
  assert coop["negatives_tried"] == coop["pairs"] + rejected  # every try accounted for
  for name in ("untrained", "cooper"):
    bench = recs[f"evaluate/{name}"]["benchmarks"]
    assert len(bench) == 2 and all(b["n_problems"] == 1 for b in bench.values())
  report = (out / "pipeline.md").read_text()
  assert "judge control (3 questions" in report
  assert "odyssey_math/test" in report and report.count("| cooper |") == 2  # GRPO, Table 3
  mtimes = {s: (out / s / "record.json").stat().st_mtime_ns for s in STAGES}
  again = _pipeline(out, model, data)  # resumes: every stage is recorded, none reruns
  assert {s: (out / s / "record.json").stat().st_mtime_ns for s in STAGES} == mtimes
  assert again.stderr.count(": done (") == len(STAGES)


def test_select_keeps_the_questions_with_a_mixed_pass_rate(tmp_path):
  """Rule labels by hand: q1 right 1 of 2, q0 never, q2 always, q3 undecided (None, not
  counted); another generator's (the judge's) triples are ignored."""
  from cooper_jax.cli import pipeline as paper_pipeline  # pylint: disable=import-outside-toplevel

  def t(q, label, gen="pol@0.7"):
    return {
      "question_id": q,
      "question": f"Q{q}",
      "reference": q[-1],
      "generator": gen,
      "rule_label": label,
    }

  triples = [t("q0", 0), t("q0", 0), t("q1", 1), t("q1", 0), t("q2", 1), t("q2", 1, "pol@1")]
  triples += [t("q3", None), t("q0", 1, "other@0.7")]
  write_jsonl(tmp_path / "triples.jsonl", triples)
  rec = paper_pipeline.stage_select(tmp_path, tmp_path / "triples.jsonl", "pol")
  assert (rec["n_questions"], rec["n_mixed"], rec["n_all_wrong"], rec["n_all_right"]) == (
    3,
    1,
    1,
    1,
  )
  assert rec["pass_rates"] == {"q1": 0.5}
  rows = [json.loads(x) for x in Path(rec["data"]).read_text().splitlines()]
  assert rows == [{"id": "q1", "question": "Qq1", "answer": "1"}]


def test_a_grpo_data_typo_stops_before_any_stage(tmp_path, capsys):
  from cooper_jax.cli import pipeline as paper_pipeline  # pylint: disable=import-outside-toplevel

  with pytest.raises(SystemExit):
    paper_pipeline.main(["--out", str(tmp_path / "pipe"), "--grpo_data", "mix"])
  assert "--grpo_data 'mix'" in capsys.readouterr().err
  assert not (tmp_path / "pipe").exists()  # nothing written


@pytest.mark.parametrize(
  "stop_after, ran",
  [
    ("annotate", ["annotate"]),
    ("verifyrm", ["annotate", "verifyrm"]),
    ("grpo", ["annotate", "verifyrm", "select", "grpo/rule"]),
  ],
)
def test_stop_after_runs_the_stages_up_to_it(tmp_path, monkeypatch, stop_after, ran):
  """--stop_after: the stages up to it run (the VerifyRM alone, to share with a slice's hosts),
  none after it; the stages are stand-ins recording their calls."""
  from cooper_jax.cli import pipeline as paper_pipeline  # pylint: disable=import-outside-toplevel

  calls = []

  def stage(name, rec):
    def run(*args, **kw):
      del args, kw
      calls.append(name)
      return rec

    return run

  monkeypatch.setattr(
    paper_pipeline, "stage_annotate", stage("annotate", {"n_kept": 3, "kept": "k"})
  )
  monkeypatch.setattr(paper_pipeline, "stage_verifyrm", stage("verifyrm", {"rm": "rm_dir"}))
  monkeypatch.setattr(paper_pipeline, "stage_select", stage("select", {"data": ""}))
  monkeypatch.setattr(paper_pipeline, "stage_grpo", stage("grpo/rule", {"run": "r"}))
  monkeypatch.setattr(paper_pipeline, "stage_evaluate", stage("evaluate", {}))
  args = ["--out", str(tmp_path / "pipe"), "--judge_control", "0", "--modes", "rule"]
  args += ["--train_data", "gsm8k/train", "--stop_after", stop_after]
  paper_pipeline.main(args)
  assert calls == ran


def test_paper_preset_trains_the_rm_on_paper_py_backbone():
  from cooper_jax.cli import pipeline as paper_pipeline  # pylint: disable=import-outside-toplevel
  from experiments import paper  # pylint: disable=import-outside-toplevel

  assert paper_pipeline.PRESETS["paper"]["rm_backbone"] == paper.VERIFY_RM
