"""Config schema, validation and loading: errors name the key; parsing imports nothing heavy;
the optimizers' total_steps follow train.steps."""

import subprocess
import sys
from pathlib import Path

import pytest

from cooper_jax import config as config_lib
from cooper_jax import optim

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
  "key,value,needle",
  [
    ("rollout.group_size", -2, "rollout.group_size"),
    ("rollout.max_new_tokens", 0, "rollout.max_new_tokens"),
    ("reward_mode", "static", "reward_mode"),
    ("policy.optim.schedule", "cosine", "policy.optim.schedule"),
    ("pairs.negatives", "llm", "pairs.negatives"),
    ("mesh.data", 0, "mesh.data"),
    ("rollout.cache_segments", 0, "rollout.cache_segments"),
    ("policy.remat", "True", "policy.remat"),
    ("rm.remat", "dots", "rm.remat"),
    ("rollout.decode_weights", "gathered", "rollout.decode_weights"),
    ("policy.logprob_micro_batch_size", -8, "policy.logprob_micro_batch_size"),
    ("policy.attn_chunk_bytes", -1, "config.policy.attn_chunk_bytes"),
    ("rm.attn_chunk_bytes", -4, "config.rm.attn_chunk_bytes"),
    ("train.stop_after", 101, "config.train.stop_after"),  # past train.steps (100)
  ],
)
def test_validate_names_the_key(key, value, needle):
  c = config_lib.base_config()
  c.unlock()
  node = c
  *path, last = key.split(".")
  for part in path:
    node = node[part]
  node[last] = value
  with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
    config_lib.validate(c, n_devices=8)


def test_logprob_micro_batch_size_falls_back_to_the_policy_step_one():
  c = config_lib.base_config()
  c.policy.micro_batch_size = 32
  assert config_lib.logprob_micro_batch_size(c) == 32
  c.policy.logprob_micro_batch_size = 128
  assert config_lib.logprob_micro_batch_size(c) == 128
  c.rollout.prompts_per_step, c.rollout.group_size = 8, 4
  c.policy.logprob_micro_batch_size = 12  # splits the batch unevenly over 8 devices
  with pytest.raises(ValueError, match=r"policy\.logprob_micro_batch_size=12"):
    config_lib.validate(c, n_devices=8)


def test_mesh_must_divide_the_batch():
  c = config_lib.base_config()
  c.rollout.prompts_per_step, c.rollout.group_size = 3, 3  # 9 rows on data=8
  c.mesh.data = 8
  with pytest.raises(ValueError, match="not divisible"):
    config_lib.validate(c, n_devices=8)
  c.mesh.data = 3
  with pytest.raises(ValueError, match="does not fit"):
    config_lib.validate(c, n_devices=8)


def test_config_parsing_imports_nothing_heavy():
  code = (
    "import sys, cooper_jax.config as c; c.load_config('experiments/paper.py:qwen,cooper'); "
    "print(sorted(m for m in ('jax', 'optax', 'flax', 'transformers', 'scipy') if m in sys.modules))"
  )
  p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == "[]"


def test_total_steps_follow_train_steps_unless_set():
  c = config_lib.load_config(
    f"{ROOT}/experiments/paper.py:qwen,cooper",
    ["train.steps=500", "policy.optim.schedule=warmup_cosine"],
  )
  sched = optim.make_schedule(c.policy.optim, c.train.steps)
  # warmup 20 then cosine to 0 over the run's 500 steps: still high at 200, ~0 only at 500.
  assert float(sched(200)) > 0.5 * c.policy.optim.lr
  assert float(sched(500)) == pytest.approx(0.0, abs=1e-12)
  c.policy.optim.total_steps = 100  # explicit wins
  assert float(optim.make_schedule(c.policy.optim, c.train.steps)(100)) == pytest.approx(0.0)
  c.policy.optim.total_steps = None
  with pytest.raises(ValueError, match="total_steps"):
    optim.make_schedule(c.policy.optim)  # a decaying schedule with no length is an error


def test_load_config_overrides_parse_literals_and_name_unknown_keys():
  c = config_lib.load_config(
    f"{ROOT}/experiments/tiny.py:rule", ["rollout.group_size=8", "policy.remat=none"]
  )
  assert c.reward_mode == "rule" and c.rollout.group_size == 8 and c.policy.remat == "none"
  with pytest.raises(KeyError, match="rollout.groupsize"):
    config_lib.load_config(f"{ROOT}/experiments/tiny.py", ["rollout.groupsize=8"])
  with pytest.raises((TypeError, ValueError)):
    config_lib.load_config(f"{ROOT}/experiments/tiny.py", ["rm.optim.lr=fast"])
  for removed in ("rm.loss=bt", "train.log_every=1"):  # keys nothing read are gone
    with pytest.raises(KeyError):
      config_lib.load_config(f"{ROOT}/experiments/tiny.py", [removed])


@pytest.mark.parametrize(
  "cond,ratio",
  [("cooper", 10), ("cooper_rmlr3x", 3), ("cooper_rmlr30x", 30), ("cooper_rmlr0p1x", 0.1)],
)
def test_small_task_rm_lr_is_a_multiple_of_the_policy_lr(cond, ratio):
  """A policy-lr override moves the RM's lr with it (the paper's ratio is what an ablation
  varies); an explicit RM lr replaces the multiple."""
  spec = f"{ROOT}/experiments/small_task.py:{cond}"
  assert config_lib.load_config(spec).rm.optim.lr == pytest.approx(ratio * 1e-4, rel=1e-12)
  moved = config_lib.load_config(spec, ["policy.optim.lr=6e-4"])
  assert moved.rm.optim.lr == pytest.approx(ratio * 6e-4, rel=1e-12)
  fixed = config_lib.load_config(spec, ["policy.optim.lr=6e-4", "rm.optim.lr=2e-3"])
  assert fixed.rm.optim.lr == 2e-3 and fixed.policy.optim.lr == 6e-4


@pytest.mark.parametrize("cond", ["rule", "static_rm_weak", "cooper_weak_rewrite"])
def test_small_task_wide_is_small_task_with_the_wide_policy_and_its_schedule(cond):
  """small_task_wide.py:<cond> = small_task.py:cond=<cond>,policy=wide = small_task.py + the
  wider policy, lr 2e-4, cosine, 300 steps, evaluation every 20: the settings results/wide_study
  ran as small_task.py overrides (written out here by hand)."""
  wide = config_lib.load_config(f"{ROOT}/experiments/small_task_wide.py:{cond}")
  named = config_lib.load_config(f"{ROOT}/experiments/small_task.py:cond={cond},policy=wide")
  base = config_lib.load_config(
    f"{ROOT}/experiments/small_task.py:{cond}",
    [
      "policy.optim.lr=2e-4",
      "policy.optim.schedule=warmup_cosine",
      "rm.optim.schedule=warmup_cosine",
      "train.steps=300",
      "train.eval_every=20",
    ],
  )
  assert wide.policy.model == str(ROOT / "experiments/assets/small_task/policy_wide")
  assert (Path(wide.policy.model) / "model.safetensors").is_file()
  assert named.to_dict() == wide.to_dict()
  base.policy.model = wide.policy.model
  assert wide.to_dict() == base.to_dict()
  if cond.startswith("cooper"):  # the paper's ratio, following the policy's lr
    assert wide.rm.optim.lr == pytest.approx(2e-3, rel=1e-12)
    assert wide.rm.model.endswith("small_task/rm_weak")
    for c in (wide, named):  # still a reference: a policy-lr override moves the RM's
      c.policy.optim.lr = 3e-4
      assert c.rm.optim.lr == pytest.approx(3e-3, rel=1e-12)


def test_small_task_args_named_or_positional(tmp_path):
  """The positional "<condition>,<workdir>" of recorded commands and cooper-study's jobs reads
  as the named form; a wrong name is an error listing the names."""
  st, wide = f"{ROOT}/experiments/small_task.py", f"{ROOT}/experiments/small_task_wide.py"
  load = lambda spec: config_lib.load_config(spec).to_dict()
  work = tmp_path / "w"
  assert load(f"{st}:cooper_weak,{work}") == load(f"{st}:work={work},cond=cooper_weak")
  assert load(f"{wide}:cooper_weak,{work}") == load(f"{st}:cooper_weak,{work},policy=wide")
  c = config_lib.load_config(f"{wide}:rule,{work}")
  assert c.policy.model == f"{work}/policy_wide" and c.data.train == f"{work}/data/train.jsonl"
  assert load(wide) == load(f"{st}:cond=cooper_weak_rewrite,policy=wide")  # wide's default
  assert load(st) == load(f"{st}:cooper")
  for arg, needle in [
    (
      "cond=cooper,polcy=wide",
      r"unknown name 'polcy', expected one of \('cond', 'work', 'policy'\)",
    ),
    ("cooper,policy=huge", r"policy='huge': expected one of \('small', 'wide'\)"),
    ("coper", r"small_task condition 'coper': expected one of"),
    ("cooper,cond=rule", r"'cond' given twice"),
  ]:
    with pytest.raises(ValueError, match=needle):
      config_lib.load_config(f"{st}:{arg}")
  with pytest.raises(ValueError, match="small_task_wide.py is policy=wide"):
    config_lib.load_config(f"{wide}:rule,policy=small")


def test_experiment_configs_import_each_other_from_any_directory(tmp_path):
  """small_task_wide.py imports small_task.py as `experiments.small_task` (the package is
  installed with cooper_jax), so loading it works outside the repository root too."""
  code = (
    "import cooper_jax.config as c; "
    f"print(c.load_config({str(ROOT / 'experiments/small_task_wide.py')!r} + ':rule').train.steps)"
  )
  p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == "300"


def test_tiny_args():
  """tiny.py:<mode>[,models=...]: the random models by default (what the plumbing tests run);
  models=small_task: the shipped small-task policy, RM and data (files that exist)."""
  c = config_lib.load_config(f"{ROOT}/experiments/tiny.py:rule")
  assert (c.reward_mode, c.policy.model, c.rm.model) == ("rule", "random", "random")
  c = config_lib.load_config(f"{ROOT}/experiments/tiny.py:mode=cooper,models=small_task")
  assert c.reward_mode == "cooper" and c.pairs.negatives == "perturb"
  for path in (c.policy.model, c.rm.model):
    assert (Path(path) / "model.safetensors").is_file()
  assert Path(c.data.train).is_file()
  config_lib.validate(c, n_devices=1)
  with pytest.raises(
    ValueError, match=r"models='smol': expected one of \('random', 'small_task'\)"
  ):
    config_lib.load_config(f"{ROOT}/experiments/tiny.py:cooper,models=smol")
