"""KL(pi_t || pi_0) at evaluations (cooper_jax/kl_monitor.py): the metrics by hand, exactly 0 at
the initial parameters, and the Monte-Carlo estimate against the exact KL of one-token
responses, summed over the whole vocabulary."""

import functools
from pathlib import Path

import jax
import numpy as np
import pytest

from cooper_jax import kl_monitor, sharding
from cooper_jax.config import base_config, validate
from cooper_jax.io import read_jsonl
from cooper_jax.logprobs import response_logprobs
from cooper_jax.prompts import build_prompts
from cooper_jax.tokenizer import load_tokenizer
from cooper_jax.weights import load_pretrained

ASSETS = Path(__file__).resolve().parents[1] / "experiments" / "assets" / "small_task"


def test_metrics_by_hand():
  now = np.array([[-1.0, -2.0, -9.0], [-0.5, -7.0, -7.0]], np.float32)
  init = np.array([[-1.5, -1.0, 0.0], [-1.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  m = kl_monitor.kl_metrics(now, init, mask)
  # Row 0: 0.5 - 1.0 = -0.5; row 1: 0.5. Per response 0/2 = 0; per token 0/3.
  assert m["eval/kl_init"] == 0.0 and m["eval/kl_init_token"] == 0.0
  m = kl_monitor.kl_metrics(now, init, np.array([[1, 0, 0], [1, 0, 0]], bool))
  assert m["eval/kl_init"] == pytest.approx(0.5) and m["eval/kl_init_token"] == pytest.approx(0.5)
  assert m["eval/kl_init_sqrt"] == pytest.approx(np.sqrt(0.5))


def test_validated():
  c = base_config()
  c.train.eval_kl_prompts = -1
  with pytest.raises(ValueError, match="eval_kl_prompts"):
    validate(c, 1)
  c = base_config()
  c.train.eval_kl_prompts, c.train.eval_kl_samples = 4, 0
  with pytest.raises(ValueError, match="eval_kl_samples"):
    validate(c, 1)


class _Run:
  """What KLMonitor reads of a train.Run: the small task's policy, one-token responses."""

  def __init__(self, prompts, samples):
    self.c = base_config()
    self.c.rollout.max_new_tokens = 1
    self.c.train.eval_kl_prompts, self.c.train.eval_kl_samples = prompts, samples
    self.policy_cfg, self.params = load_pretrained(str(ASSETS / "policy"))
    self.tokenizer = load_tokenizer(str(ASSETS / "policy"))
    self.eval_rows = [r for _, r in read_jsonl(ASSETS / "data" / "test.jsonl")][:prompts]
    self.mesh = sharding.make_mesh(data=-1)


def test_estimate_matches_the_exact_kl_of_one_token_responses():
  """pi_0 the shipped policy, pi_t it with noise on every weight; responses of one token, so
  KL(pi_t || pi_0) per prompt is sum_v p_t(v) log(p_t(v) / p_0(v)) over the vocabulary,
  computed by the same log-prob function on every token. The monitor's estimate from 2 x 512
  samples lies within 4 standard errors of it (the error's sd from the same exact sums);
  at pi_0 itself it is exactly 0."""
  run = _Run(prompts=2, samples=512)
  init = run.params
  leaves, tree = jax.tree.flatten(init)
  keys = jax.random.split(jax.random.key(3), len(leaves))
  noisy = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  params = jax.tree.unflatten(tree, noisy)
  mon = kl_monitor.KLMonitor(run, init)
  assert mon(init, 0)["eval/kl_init"] == 0.0
  est = mon(params, 0)["eval/kl_init"]

  prompts = build_prompts(
    run.tokenizer, [r["question"] for r in run.eval_rows], run.c.data.prompt_suffix
  )
  tok, mask = run.tokenizer.encode_prompts(
    prompts, max_len=run.c.rollout.max_prompt_len, pad_to_multiple=run.c.rollout.prompt_pad_multiple
  )
  v = run.policy_cfg.vocab_size
  logprobs = jax.jit(functools.partial(response_logprobs, run.policy_cfg))
  kls, variances = [], []
  for i in range(len(prompts)):
    ids = np.arange(v, dtype=np.int32)[:, None]
    args = (np.repeat(tok[i : i + 1], v, 0), np.repeat(mask[i : i + 1], v, 0), ids)
    lp_t = np.asarray(logprobs(params, *args, np.ones_like(ids, bool)))
    lp_0 = np.asarray(logprobs(init, *args, np.ones_like(ids, bool)))
    p, d = np.exp(lp_t[:, 0].astype(np.float64)), (lp_t - lp_0)[:, 0].astype(np.float64)
    p /= p.sum()  # the sampler's distribution (float32 softmax sums to 1 within ~1e-6)
    kls.append(float(np.sum(p * d)))
    variances.append(float(np.sum(p * d**2) - kls[-1] ** 2))
  exact = float(np.mean(kls))
  se = float(np.sqrt(np.mean(variances) / (len(prompts) * run.c.train.eval_kl_samples)))
  assert exact > 10 * se  # the noise moved the policy measurably
  assert abs(est - exact) < 4 * se, (est, exact, se)
