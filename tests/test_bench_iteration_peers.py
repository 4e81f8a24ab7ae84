"""benchmarks/: the GRPO-iteration peer sections (TRL's GRPOTrainer, tunix's GRPOLearner): our
config mapped onto theirs, steps paired by index, figures and notes; fake peers and train loops
here (the real ones need their venvs), nothing asserted to be fast."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from benchmarks import harness, iteration, run  # noqa: E402


def test_trl_config_follows_our_run_config():
  from benchmarks import trl_side  # pylint: disable=import-outside-toplevel

  c = iteration.run_config("experiments/smollm2.py:cpu_smoke")
  kw = trl_side.grpo_config(c, 4)
  assert kw["per_device_train_batch_size"] == 8 and kw["num_generations"] == 4
  assert kw["gradient_accumulation_steps"] == 1 and kw["num_iterations"] == 1
  assert kw["max_completion_length"] == 64 and kw["temperature"] == 1.0 and kw["max_steps"] == 4
  assert kw["beta"] == c.policy.loss.kl_coef == 0.001 and kw["learning_rate"] == 1e-6
  assert kw["weight_decay"] == 0.01 and kw["max_grad_norm"] == 1.0 and kw["seed"] == c.seed
  assert kw["lr_scheduler_type"] == "constant" and kw["loss_type"] == "dapo"
  assert kw["scale_rewards"] == "group" and kw["epsilon"] == 0.2 and kw["epsilon_high"] is None
  for off in ("bf16", "fp16", "activation_checkpointing", "use_vllm", "shuffle_dataset"):
    assert kw[off] is False, off
  c.policy.optim.warmup_steps = 5
  kw = trl_side.grpo_config(c, 4)
  assert kw["lr_scheduler_type"] == "constant_with_warmup" and kw["warmup_steps"] == 5
  c.policy.loss.agg = "seq_mean_token_sum"
  with pytest.raises(ValueError, match="agg"):
    trl_side.grpo_config(c, 4)


def _trl_steps(n, step_s=5.0, gen_s=2.0):
  return [
    {
      "step": i + 1,
      "step_s": step_s + i,
      "generate_s": gen_s,
      "generate_calls": 1,
      "completions/mean_length": 60.0,
    }
    for i in range(n)
  ]


def test_pair_steps_splits_generation_from_the_rest():
  ours = [
    {"time/step_s": 10.0 + i, "time/sample_s": 4.0, "response/len_mean": 64.0} for i in range(3)
  ]
  theirs = [dict(t, len=t["completions/mean_length"]) for t in _trl_steps(3)]
  pairs = iteration.pair_steps(ours, theirs, 1)
  assert [p["step"] for p in pairs] == [2, 3]
  assert pairs[0]["ours"] == {"generate": 4.0, "update": 7.0, "step": 11.0, "len": 64.0}
  assert pairs[1]["peer"] == {"generate": 2.0, "update": 5.0, "step": 7.0, "len": 60.0}
  with pytest.raises(ValueError):
    iteration.pair_steps(ours, theirs[:2], 1)  # not the same steps on both sides
  with pytest.raises(ValueError):
    iteration.pair_steps(ours, theirs, 3)  # nothing left after the warm-up
  theirs[0]["generate_calls"] = 0  # even in a warm-up step: the timer missed generate
  with pytest.raises(RuntimeError, match="generate calls"):
    iteration.pair_steps(ours, theirs, 1)


def _prepared():
  """What iteration.prepare_peer_run hands a section: cpu_smoke's config, one prompt, a
  passed gate."""
  c = iteration.run_config("experiments/smollm2.py:cpu_smoke")
  prompts = [{"prompt": "q", "answer": "1", "ids": [1]}]
  gate = {"max_abs_logit_diff": 1e-4, "max_abs_logit_diff_last_position": 5e-5}
  gate.update(positions_compared=152, greedy_equal=True, greedy_ours=[[1] * 16] * 2, ok=True)
  return c, prompts, gate


def _fake_train(spec, mode, steps, workdir, overrides):
  """Our train loop's metrics rows, 8 s a step of which 3 s sampling."""
  assert mode == "rule" and steps == 3 and overrides == ()
  return [{"time/step_s": 8.0, "time/sample_s": 3.0} for _ in range(steps)]


def test_trl_section_pairs_the_steps(tmp_path, monkeypatch):
  from benchmarks import trl_side  # pylint: disable=import-outside-toplevel

  class FakePeer:
    info = {"trl": "1.16.0", "torch": "x", "threads": 2, "cpus": [0, 1]}

    def __init__(self, python):
      self.tmp = type("Tmp", (), {"name": str(tmp_path)})()

    def call(self, op, **kw):
      assert op == "iteration" and kw["config"]["max_steps"] == 3 and kw["eos_ids"] == [2, 0]
      assert len(json.loads(Path(kw["prompts"]).read_text())) == 1
      steps = [dict(t, len=t["completions/mean_length"]) for t in _trl_steps(3)]
      return {"steps": steps, "resolved": {}, "reward_status": {"ok": 6}, "init_s": 0.1}

    def close(self):
      pass

  c, prompts, gate = _prepared()
  monkeypatch.setattr(trl_side, "TrlPeer", FakePeer)
  monkeypatch.setattr(iteration, "prepare_peer_run", lambda *a: (c, "hf", (2, 0), prompts, gate))

  rep = harness.Report("t", {})
  trl_side.trl_iteration_section(rep, "s", (), 1, 2, tmp_path, "py", run_train=_fake_train)
  step, gen, upd = rep.figures
  assert [f.key for f in rep.figures] == [
    "trl_iteration",
    "trl_iteration_generate",
    "trl_iteration_update",
  ]
  assert [r["step"] for r in step.runs] == [2, 3] and not step.higher_is_better
  assert step.ratios == [pytest.approx(8 / 6), pytest.approx(8 / 7)]
  assert gen.ratios == [1.5, 1.5] and upd.ratios == [pytest.approx(5 / 4), 1.0]
  assert any("best of the 2 timed steps: ours 8.00 s, TRL 6.00 s" in n for n in step.notes)
  ((title, header, rows),) = rep.tables
  assert ["2", "TRL", "2.00", "4.00", "6.00", "60.0"] in rows and ["3", "cooper_jax"] == rows[2][:2]


@pytest.mark.parametrize("key", ["trl_iteration", "tunix_iteration"])
def test_section_without_its_venv_records_no_ratio(tmp_path, key):
  from benchmarks import trl_side, tunix_grpo_side  # pylint: disable=import-outside-toplevel

  section = {
    "trl_iteration": trl_side.trl_iteration_section,
    "tunix_iteration": tunix_grpo_side.tunix_iteration_section,
  }[key]
  rep = harness.Report("t", {})
  never = lambda *a: pytest.fail("our side does not run when the peer is absent")
  section(rep, "experiments/tiny.py", (), 1, 3, tmp_path, str(tmp_path / "no" / "python"), never)
  assert [f.key for f in rep.figures] == [key, f"{key}_generate", f"{key}_update"]
  for f in rep.figures:
    assert f.runs == [] and f.worst_ratio is None and "peer not run" in f.notes[0]
  assert key in run.PEER_SECTIONS


def test_run_py_sizes_and_venv_flags_of_the_iteration_peers():
  a = run.parse_args(["--only", "trl_iteration", "--trl-python", "/x/python"])
  assert a.only == ["trl_iteration"] and a.trl_python == "/x/python"
  full = run.sizes(run.parse_args([]))
  assert full["trl_iteration"] == ("experiments/smollm2.py:cpu_smoke", (), 2)
  assert full["tunix_iteration"] == full["trl_iteration"]


def test_tunix_learner_config_follows_our_run_config():
  from benchmarks import tunix_grpo_side  # pylint: disable=import-outside-toplevel

  c = iteration.run_config("experiments/smollm2.py:cpu_smoke")
  kw = tunix_grpo_side.learner_config(c, 5)
  assert kw["steps"] == 5 and kw["prompts_per_step"] == 2 and kw["seed"] == c.seed
  assert kw["rollout"] == {
    "max_tokens_to_generate": 64,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": None,  # ours 0: off
  }
  assert kw["grpo"] == {
    "num_generations": 4,
    "num_iterations": 1,
    "beta": 0.001,
    "epsilon": 0.2,
    "loss_agg_mode": "token-mean",
    "kl_loss_mode": "low_var_kl",
    "kl_clamp_value": 10.0,
  }
  assert kw["extra"] == {"epsilon_c": 3.0, "epsilon_high": None}
  assert kw["optim"] == {
    "lr": 1e-6,
    "b1": 0.9,
    "b2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
  }
  c.policy.loss.clip_eps_high = 0.28
  assert tunix_grpo_side.learner_config(c, 5)["extra"]["epsilon_high"] == 0.28
  for key, value, match in (
    ("policy.loss.kl_kind", "k1", "kl_kind"),
    ("policy.loss.agg", "seq_mean_token_sum", "agg"),
    ("policy.optim.warmup_steps", 20, "constant lr"),
    ("policy.loss.scale_adv_by_std", False, "std"),
  ):
    bad = iteration.run_config("experiments/smollm2.py:cpu_smoke", (f"{key}={value}",))
    with pytest.raises(ValueError, match=match):
      tunix_grpo_side.learner_config(bad, 5)


def test_tunix_section_pairs_the_steps(tmp_path, monkeypatch):
  from benchmarks import tunix_grpo_side  # pylint: disable=import-outside-toplevel

  class FakePeer:
    info = {"tunix": "0.1.7", "jax": "x", "cpus": [0, 1]}

    def __init__(self, python):
      self.tmp = type("Tmp", (), {"name": str(tmp_path)})()

    def call(self, op, **kw):
      assert op == "iteration" and kw["config"]["steps"] == 3 and kw["eos_ids"] == [2, 0]
      assert kw["config"]["grpo"]["num_generations"] == 4
      assert len(json.loads(Path(kw["prompts"]).read_text())) == 1
      steps = [dict(t, len=t["completions/mean_length"]) for t in _trl_steps(3)]
      return {"steps": steps, "width": 192, "pad_id": 16, "pad_sampled": 0}

    def close(self):
      pass

  c, prompts, gate = _prepared()
  monkeypatch.setattr(tunix_grpo_side, "TunixGrpoPeer", FakePeer)
  monkeypatch.setattr(iteration, "prepare_peer_run", lambda *a: (c, "hf", (2, 0), prompts, gate))

  rep = harness.Report("t", {})
  tunix_grpo_side.tunix_iteration_section(rep, "s", (), 1, 2, tmp_path, "py", _fake_train)
  step, gen, upd = rep.figures
  assert [f.key for f in rep.figures] == [
    "tunix_iteration",
    "tunix_iteration_generate",
    "tunix_iteration_update",
  ]
  assert step.label.endswith("cooper_jax s / tunix s")
  assert [r["step"] for r in step.runs] == [2, 3] and not step.higher_is_better
  assert step.ratios == [pytest.approx(8 / 6), pytest.approx(8 / 7)]
  assert gen.ratios == [1.5, 1.5] and upd.ratios == [pytest.approx(5 / 4), 1.0]
  assert any("ours 8.00 s, tunix 6.00 s (ratio 1.33)" in n for n in step.notes)
  assert any("prompt width 192, pad id 16 sampled 0 times" in n for n in step.notes)
  ((title, header, rows),) = rep.tables
  assert ["2", "tunix", "2.00", "4.00", "6.00", "60.0"] in rows
  assert rep.extras["tunix_iteration"]["config"]["steps"] == 3
