"""The Cooper host loop: prompts -> G rollouts -> rule verify -> reward -> policy_step -> pairs ->
rm_step -> monitors -> periodic eval -> checkpoint.

  python -m cooper_jax.train --config experiments/smollm2.py:cooper --workdir runs/x \
      --config.train.steps=10

reward_mode: "rule" (math-verify reward), "static_rm" (frozen RM reward), "cooper" (RM reward,
and the RM is updated every step on pairs from the policy's own rollouts). The reward at step t
comes from the RM as it was before step t's RM update (paper, and the reference code).
Everything random at step t derives from (seed, t), so a resumed run repeats a straight one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags
from tqdm.auto import tqdm

from cooper_jax import config as config_lib
from cooper_jax import losses, optim, sharding, steps
from cooper_jax.checkpoint import CheckpointStore, model_cfg_to_meta, rng_to_meta
from cooper_jax.data import PromptIterator, load_qa
from cooper_jax.evaluate import evaluate_model
from cooper_jax.metrics import MetricsWriter, reward_hacking_monitors
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import init_params
from cooper_jax.prompts import build_prompts, encode_rm_inputs
from cooper_jax.rewards.pairs import build_pairs, make_negative_generator
from cooper_jax.rewards.verify import RuleVerifier
from cooper_jax.sampling import sample
from cooper_jax.tokenizer import load_tokenizer
from cooper_jax.weights import load_pretrained

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file[:variant]", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "where metrics and checkpoints go")

_STOP = {"requested": False}


def _on_sigterm(signum, frame):  # pylint: disable=unused-argument
  logging.warning("signal %d: will checkpoint after this step and exit", signum)
  _STOP["requested"] = True


def load_model(mc, head: str, seed: int) -> tuple[ModelConfig, dict, str]:
  """(config, params, tokenizer source) for the policy/RM/assistant sub-config `mc`."""
  overrides = dict(dtype=mc.dtype, param_dtype=mc.param_dtype, remat=mc.remat)
  if mc.model == "random":
    if not mc.tokenizer:
      raise ValueError("a random model needs an explicit tokenizer (config.*.tokenizer)")
    cfg = ModelConfig(**mc.random_model.to_dict(), head=head, **overrides)
    return cfg, init_params(cfg, jax.random.key(seed)), mc.tokenizer
  cfg, params = load_pretrained(mc.model, head=head, **overrides)
  if head == "score" and not np.any(np.asarray(params["score"]["kernel"])):
    logging.warning("RM %s has no trained score head: starting from a fresh (zero) head", mc.model)
  return cfg, params, mc.tokenizer or mc.model


def _policy_batch(prompt_tok, prompt_mask, out, advantages_b):
  return {
    "prompt_tokens": np.asarray(prompt_tok, np.int32),
    "prompt_mask": prompt_mask,
    "response_tokens": np.asarray(out.tokens, np.int32),
    "response_mask": out.mask,
    "advantages": np.asarray(advantages_b, np.float32),
  }


def _rm_pair_batch(tokenizer, pairs, max_len: int, pad_multiple: int):
  """Positives and negatives tokenised together, so both halves share one width."""
  n = len(pairs.questions)
  pos = [p if v else "" for p, v in zip(pairs.positives, pairs.valid)]
  neg = [q if v else "" for q, v in zip(pairs.negatives, pairs.valid)]
  tok, mask, n_trunc = encode_rm_inputs(
    tokenizer,
    pairs.questions * 2,
    pairs.references * 2,
    pos + neg,
    max_len,
    pad_to_multiple=pad_multiple,
  )
  n_trunc = int(n_trunc.sum())
  return {
    "pos_tokens": tok[:n],
    "pos_mask": mask[:n],
    "neg_tokens": tok[n:],
    "neg_mask": mask[n:],
    "valid": np.asarray(pairs.valid, np.float32),
  }, n_trunc


class Run:
  """Everything one training run holds: models, states, compiled steps, data and workers."""

  def __init__(self, c, workdir: str):
    config_lib.validate(c, jax.device_count())
    self.c, self.workdir = c, Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    (self.workdir / "config.json").write_text(c.to_json_best_effort(indent=1))
    self.mesh = sharding.make_mesh(**c.mesh)
    self.mode = c.reward_mode
    self.n_prompts, self.group = c.rollout.prompts_per_step, c.rollout.group_size

    self.policy_cfg, policy_params, tok_src = load_model(c.policy, "lm", c.seed)
    self.tokenizer = load_tokenizer(tok_src)
    self.tok_src = tok_src
    self.policy_opt = optim.make_optimizer(c.policy.optim)
    self.policy_state = sharding.shard_tree(
      steps.init_state(policy_params, self.policy_opt), self.mesh
    )
    # The frozen reference gets its own buffers (via host), since policy_step donates the state.
    self.ref_params = (
      sharding.shard_tree(jax.device_get(policy_params), self.mesh)
      if c.policy.loss.kl_coef > 0
      else None
    )
    self.logprob_fn = steps.make_logprob_fn(self.policy_cfg, self.mesh, policy_params)

    self.rm_state = None
    if self.mode != "rule":
      self.rm_cfg, rm_params, rm_tok = load_model(c.rm, "score", c.seed + 1)
      self.rm_tokenizer = load_tokenizer(rm_tok)
      self.rm_opt = optim.make_optimizer(c.rm.optim)
      self.rm_state = sharding.shard_tree(steps.init_state(rm_params, self.rm_opt), self.mesh)
      self.reward_fn = steps.make_reward_fn(self.rm_cfg, self.mesh, rm_params)
    self._policy_step = self._rm_step = None

    dk = dict(
      question_key=c.data.question_key, answer_key=c.data.answer_key, on_bad_row=c.data.on_bad_row
    )
    self.train_rows, report = load_qa(c.data.train, **dk)
    logging.info(
      "train data %s: %d rows, %d skipped", c.data.train, len(self.train_rows), report.skipped
    )
    self.eval_rows = None
    if c.train.eval_every > 0:
      self.eval_rows, _ = load_qa(c.data.eval, limit=c.data.eval_limit or None, **dk)
    self.rm_eval_pairs = None
    if self.mode != "rule" and c.data.rm_eval_pairs:
      self.rm_eval_pairs = [
        json.loads(l) for l in Path(c.data.rm_eval_pairs).read_text().splitlines() if l.strip()
      ]
      for i, p in enumerate(self.rm_eval_pairs):
        missing = {"question", "answer", "positive", "negative"} - set(p)
        if missing:
          raise ValueError(f"{c.data.rm_eval_pairs}: line {i + 1}: missing {sorted(missing)}")
    self.iterator = PromptIterator(self.train_rows, seed=c.seed)
    self.verifier = RuleVerifier(c.verifier.workers or None)
    self.negatives = None
    if self.mode == "cooper":
      kw = {}
      if c.pairs.negatives == "llm_rewrite":
        a_cfg, a_params = load_pretrained(c.pairs.assistant_model)
        kw = dict(
          cfg=a_cfg,
          params=a_params,
          tokenizer=load_tokenizer(c.pairs.assistant_model),
          temperature=c.pairs.assistant_temperature,
          max_new_tokens=c.pairs.assistant_max_new_tokens,
        )
      self.negatives = make_negative_generator(c.pairs.negatives, **kw)
    self.store = CheckpointStore(self.workdir / "checkpoints", c.train.max_to_keep)
    self.step = 0
    restored = self.store.restore_latest(self.policy_state, self.rm_state)
    if restored is not None:
      self.policy_state, self.rm_state, meta = restored
      self.iterator.load_state_dict(meta["data_iterator"])
      self.step = int(meta["step"])
      logging.info("resumed from %s at step %d", self.store.directory, self.step)
    self.writer = MetricsWriter(self.workdir, resume_step=self.step)

  # ------------------------------------------------------------------------------ one step
  def rng(self, step: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(self.c.seed), step)

  def rollout(self, rows, rng):
    c = self.c
    prompts = build_prompts(self.tokenizer, [r["question"] for r in rows], c.data.prompt_suffix)
    prompts = [p for p in prompts for _ in range(self.group)]
    tok, mask = self.tokenizer.encode_prompts(
      prompts, max_len=c.rollout.max_prompt_len, pad_to_multiple=c.rollout.prompt_pad_multiple
    )
    bs = sharding.batch_sharding(self.mesh)
    out = sample(
      self.policy_state["params"],
      jax.device_put(tok, bs),
      jax.device_put(mask, bs),
      rng,
      cfg=self.policy_cfg,
      max_new_tokens=c.rollout.max_new_tokens,
      temperature=c.rollout.temperature,
      top_p=c.rollout.top_p,
      top_k=c.rollout.top_k,
      eos_ids=tuple(self.tokenizer.eos_ids),
      pad_id=self.tokenizer.pad_id,
    )
    out = jax.device_get(out)
    texts = [
      self.tokenizer.decode(out.tokens[i][out.mask[i]].tolist()) for i in range(len(prompts))
    ]
    return tok, mask, out, texts

  def rm_rewards(self, questions, refs, texts):
    tok, mask, n_trunc = encode_rm_inputs(
      self.rm_tokenizer, questions, refs, texts, self.c.rm.max_len, pad_to_multiple=64
    )
    bs = sharding.batch_sharding(self.mesh)
    r = self.reward_fn(self.rm_state["params"], jax.device_put(tok, bs), jax.device_put(mask, bs))
    return np.asarray(r), int(n_trunc.sum())

  def train_step(self) -> dict:
    c, step = self.c, self.step
    rng = self.rng(step)
    t0 = time.perf_counter()
    rows = self.iterator.next_batch(self.n_prompts)
    questions = [r["question"] for r in rows for _ in range(self.group)]
    refs = [r["answer"] for r in rows for _ in range(self.group)]
    tok, mask, out, texts = self.rollout(rows, jax.random.fold_in(rng, 0))
    t_sample = time.perf_counter()
    ver = self.verifier.verify(texts, refs, deadline_s=c.verifier.deadline_s)
    correct = np.asarray(ver.correct, bool)
    t_verify = time.perf_counter()
    m = {f"verify/{k}": v for k, v in ver.counts.items()}
    m["rule/acc"] = float(correct.mean())
    if self.mode == "rule":
      rewards = correct.astype(np.float32)
    else:
      rewards, n_trunc = self.rm_rewards(questions, refs, texts)
      m.update(reward_hacking_monitors(rewards, correct))
      m["rm/inputs_truncated"] = n_trunc
    m["reward/mean"] = float(rewards.mean())
    adv = np.asarray(
      losses.grpo_advantages(
        jnp.asarray(rewards), self.group, scale_by_std=c.policy.loss.scale_adv_by_std
      )
    )
    batch = _policy_batch(tok, mask, out, adv)
    bs = sharding.batch_sharding(self.mesh)
    if self.ref_params is not None:
      batch["ref_logp"] = self.logprob_fn(
        self.ref_params,
        {
          k: jax.device_put(v, bs)
          for k, v in batch.items()
          if k.startswith(("prompt_", "response_"))
        },
      )
    if self._policy_step is None:
      self._policy_step = steps.make_policy_step(
        self.policy_cfg, c.policy.loss, self.policy_opt, self.mesh, self.policy_state, batch
      )
    self.policy_state, pm = self._policy_step(self.policy_state, batch)
    m.update({f"policy/{k}": v for k, v in jax.device_get(pm).items()})
    resp_len = out.mask.sum(1)
    m["response/len_mean"] = float(resp_len.mean())
    m["response/truncated_frac"] = float(np.mean(resp_len == c.rollout.max_new_tokens))
    t_policy = time.perf_counter()

    if self.mode == "cooper":
      pairs, stats = build_pairs(
        [r["question"] for r in rows],
        [r["answer"] for r in rows],
        texts,
        correct,
        self.group,
        self.negatives,
        self.verifier,
        strategy=c.pairs.positive,
        rng=np.random.default_rng([c.seed, step]),
        max_tries=c.pairs.max_tries,
        deadline_s=c.verifier.deadline_s,
        accept_no_answer=c.pairs.accept_no_answer,
      )
      m["pairs/valid_rate"] = stats["valid_pair_rate"]
      m["pairs/n_valid"] = stats["n_valid"]
      m["pairs/negative_tries"] = stats["negative_tries"]
      m.update({f"pairs/reject_{k}": v for k, v in stats["rejects"].items()})
      if stats["n_valid"] > 0:
        rb, n_trunc = _rm_pair_batch(self.rm_tokenizer, pairs, c.rm.max_len, 64)
        m["rm/pair_inputs_truncated"] = n_trunc
        if self._rm_step is None:
          self._rm_step = steps.make_rm_step(
            self.rm_cfg, "bt", self.rm_opt, self.mesh, self.rm_state, rb
          )
        self.rm_state, rmm = self._rm_step(self.rm_state, rb)
        m.update({f"rm_train/{k}": v for k, v in jax.device_get(rmm).items()})
      m["rm_train/updated"] = float(stats["n_valid"] > 0)
    t_end = time.perf_counter()
    m.update(
      {
        "time/sample_s": t_sample - t0,
        "time/verify_s": t_verify - t_sample,
        "time/policy_s": t_policy - t_verify,
        "time/rm_s": t_end - t_policy,
        "time/step_s": t_end - t0,
      }
    )
    self.step += 1
    return m

  # ----------------------------------------------------------------------------- plumbing
  def evaluate_rm(self) -> dict:
    """RM on held-out (positive, negative) pairs: pair accuracy and classifier accuracy."""
    pairs = self.rm_eval_pairs
    q = [p["question"] for p in pairs] * 2
    a = [str(p["answer"]) for p in pairs] * 2
    r, _ = self.rm_rewards(q, a, [p["positive"] for p in pairs] + [p["negative"] for p in pairs])
    pos, neg = r[: len(pairs)], r[len(pairs) :]
    return {
      "eval/rm_pair_acc": float(np.mean(pos > neg)),
      "eval/rm_cls_acc": float(np.mean(np.concatenate([pos > 0.5, neg <= 0.5]))),
    }

  def evaluate(self) -> dict:
    c = self.c
    m = self.evaluate_rm() if self.rm_eval_pairs else {}
    if self.eval_rows is None:
      return m
    res = evaluate_model(
      self.policy_cfg,
      self.policy_state["params"],
      self.tokenizer,
      {c.data.eval: self.eval_rows},
      samples=c.train.eval_samples,
      temperature=c.train.eval_temperature,
      top_p=1.0,
      max_new_tokens=c.train.eval_max_new_tokens,
      batch_size=min(64, len(self.eval_rows) * c.train.eval_samples),
      seed=c.seed,
      verifier=self.verifier,
      suffix=c.data.prompt_suffix,
    )
    b = res["benchmarks"][c.data.eval]
    m.update({"eval/acc": b["accuracy"], "eval/ci_lo": b["ci95"][0], "eval/ci_hi": b["ci95"][1]})
    return m

  def save(self):
    meta = {
      "data_iterator": self.iterator.state_dict(),
      "rng": rng_to_meta(self.rng(self.step)),
      "config": json.loads(self.c.to_json_best_effort()),
      "policy_model": model_cfg_to_meta(self.policy_cfg),
      "tokenizer": self.tok_src,
    }
    if self.rm_state is not None:
      meta["rm_model"] = dataclasses.asdict(self.rm_cfg)
    path = self.store.save(self.step, self.policy_state, self.rm_state, meta)
    logging.info("checkpoint step %d -> %s", self.step, path)

  def close(self):
    self.writer.close()
    self.verifier.close()
    self.store.close()


def train(c, workdir: str) -> Run:
  run = Run(c, workdir)
  _STOP["requested"] = False  # a stop honoured by an earlier train() in this process is spent
  prev = signal.signal(signal.SIGTERM, _on_sigterm)
  try:
    total = c.train.steps
    if c.train.eval_every and run.step == 0:
      run.writer.write(0, run.evaluate())  # the curves start at the initial policy
    bar = tqdm(total=total, initial=run.step, desc=f"cooper[{c.reward_mode}]", dynamic_ncols=True)
    while run.step < total:
      m = run.train_step()
      if c.train.eval_every and run.step % c.train.eval_every == 0:
        m.update(run.evaluate())
      run.writer.write(run.step, m)
      bar.update(1)
      bar.set_postfix(
        reward=f"{m['reward/mean']:.3f}", rule=f"{m['rule/acc']:.3f}", s=f"{m['time/step_s']:.1f}"
      )
      if run.step % c.train.checkpoint_every == 0 or run.step == total or _STOP["requested"]:
        run.save()
      if _STOP["requested"]:
        logging.warning("stopped by signal after step %d (checkpoint saved)", run.step)
        break
    bar.close()
  finally:
    signal.signal(signal.SIGTERM, prev)
    run.close()
  print(
    f"metrics: {run.workdir / 'metrics.jsonl'}\ncheckpoints: {run.store.directory}\n"
    f"tensorboard: {run.workdir / 'tensorboard'}"
  )
  return run


def main(argv):
  del argv
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required")
  logging.getLogger().setLevel(logging.INFO)
  # Orbax logs every save step at INFO; keep the run's own INFO lines readable.
  for handler in logging.getLogger().handlers:
    handler.addFilter(lambda r: "/orbax/" not in r.pathname or r.levelno >= logging.WARNING)
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
