"""A study folder's manifest: how it was made and what it produced, so it can be re-run or checked.

results/<study>/ keeps the summary in git (README.md, table.md, results.json, figures); its
per-run folders (runs/) are git-ignored. manifest.json records the command, the code commit, the
seeds, the machine and the sha256 of every file the study produced, per-run files included, and
where those per-run files can be fetched (a commit in this repository's history that still holds
them, for studies recorded before they were untracked).

  python -m cooper_jax.cli.manifest results/wide_fewshapes          # (re)write its manifest.json
  python -m cooper_jax.cli.manifest --check results/wide_fewshapes  # verify every checksum

cooper-study writes it at the end of every study (cooper_jax/cli/study.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

from cooper_jax.io import atomic_write_json

NAME = "manifest.json"


def sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def machine() -> dict:
  """This host, as far as Python sees it: enough to tell two recorded machines apart."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def checksums(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
  """sha256 of every file under folder but the manifest: (summary files, per-run files)."""
  summary, runs = {}, {}
  for p in sorted(folder.rglob("*")):
    if not p.is_file() or p.name == NAME:
      continue
    rel = p.relative_to(folder).as_posix()
    (runs if rel.startswith("runs/") or "/runs/" in rel else summary)[rel] = sha256(p)
  return summary, runs


def build(folder: Path, *, command=None, code_commit=None, seeds=None, host=None) -> dict:
  """The manifest of a study folder. Unknown fields are taken from what the folder records
  (command.txt, results.json's seeds) and otherwise left None, never guessed."""
  folder = Path(folder)
  if command is None and (folder / "command.txt").exists():
    command = (folder / "command.txt").read_text().strip()
  if seeds is None and (folder / "results.json").exists():
    seeds = json.loads((folder / "results.json").read_text()).get("seeds")
  summary, runs = checksums(folder)
  return {
    "study": folder.name,
    "command": command,
    "code_commit": code_commit,
    "seeds": seeds,
    "machine": host,
    "files": summary,
    "per_run_files": runs,
    "per_run_files_tracked": False,
  }


def write(folder: Path, **fields) -> Path:
  m = build(folder, **fields)
  old = folder / NAME
  if old.exists():  # a rewrite keeps what it cannot recompute
    prev = json.loads(old.read_text())
    for k in ("command", "code_commit", "seeds", "machine", "per_run_source"):
      if m.get(k) is None and prev.get(k) is not None:
        m[k] = prev[k]
    if not m["per_run_files"] and prev.get("per_run_files"):
      m["per_run_files"] = prev["per_run_files"]  # runs/ not on this machine: keep the record
  atomic_write_json(folder / NAME, m)
  return folder / NAME


def check(folder: Path) -> list[str]:
  """Problems found: a listed file missing or changed, an unlisted summary file. Per-run files
  are checked where present (they are not in git)."""
  folder = Path(folder)
  m = json.loads((folder / NAME).read_text())
  problems = []
  for rel, want in {**m["files"], **m["per_run_files"]}.items():
    p = folder / rel
    if not p.exists():
      if rel in m["files"]:
        problems.append(f"{folder / rel}: listed in {NAME} but missing")
    elif sha256(p) != want:
      problems.append(f"{folder / rel}: sha256 differs from {NAME}")
  summary, _ = checksums(folder)
  problems += [f"{folder / rel}: not listed in {NAME}" for rel in summary if rel not in m["files"]]
  return problems


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("folders", nargs="+", type=Path)
  p.add_argument("--check", action="store_true", help="verify checksums instead of writing")
  p.add_argument("--code_commit", default=None, help="the commit the study ran at, if known")
  p.add_argument("--per_run_source", default=None, help="where per-run files can be fetched")
  a = p.parse_args(argv)
  bad = 0
  for folder in a.folders:
    if a.check:
      problems = check(folder)
      print(f"{folder}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
      for line in problems:
        print("  " + line)
      bad += bool(problems)
      continue
    path = write(folder, code_commit=a.code_commit)
    if a.per_run_source:
      m = json.loads(path.read_text())
      m["per_run_source"] = a.per_run_source
      atomic_write_json(path, m)
    print(f"wrote {path}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
