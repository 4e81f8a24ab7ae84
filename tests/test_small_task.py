"""The small arithmetic task: generator, wrong solutions, tokenizer, and the SFT loss/step."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import final_params

from cooper_jax import optim, sft, sharding, steps
from cooper_jax.config import optim_config
from cooper_jax.data import load_qa
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import forward, init_params
from cooper_jax.prompts import build_prompts, build_rm_input
from cooper_jax.rewards.verify import RuleVerifier
from cooper_jax.tasks import arith
from cooper_jax.tasks.small_tokenizer import build_small_tokenizer
from cooper_jax.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
_LINE = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)$")


@pytest.fixture(scope="module")
def rows():
  return arith.generate_rows(300, seed=11)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  out = tmp_path_factory.mktemp("tok") / "small_tok"
  build_small_tokenizer(out)
  return load_tokenizer(out)


def _wrong(rows, seed=3):
  rng = np.random.default_rng(seed)
  return [arith.make_wrong_solution(r, rng) for r in rows]


# ------------------------------------------------------------------------------ generator
def test_generator_is_deterministic_and_prefix_stable():
  a = arith.generate_rows(40, seed=5)
  assert a == arith.generate_rows(40, seed=5)
  assert arith.generate_rows(10, seed=5) == a[:10]  # row i depends only on (seed, i)
  assert a != arith.generate_rows(40, seed=6)
  assert len({r["question"] for r in a}) == 40
  assert {r["difficulty"] for r in a} == {1, 2, 3}
  assert all(r["source"] == "arith" and r["id"].startswith("arith-5-") for r in a)


def test_solution_arithmetic_and_boxed_answer(rows):
  for r in rows:
    lines = r["solution"].split("\n")
    assert lines[-1] == f"The answer is \\boxed{{{r['answer']}}}."
    for line in lines[:-1]:
      x, op, y, z = _LINE.match(line).groups()
      assert int(z) == {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op]
    assert arith.boxed_answer(r["solution"]) == int(r["answer"]) >= 1
    # The numbers in the question are the ones the solution uses (nothing invented).
    q_nums = set(re.findall(r"\d+", r["question"]))
    first = arith.parse_solution(r["solution"])
    assert {str(x) for x, op, _, _ in first if op == "*"} <= q_nums
    assert {str(y) for _, op, y, _ in first if op != "+"} <= q_nums | {str(z) for *_, z in first}


def test_difficulty_shapes(rows):
  n_lines = {
    d: {len(arith.parse_solution(r["solution"])) for r in rows if r["difficulty"] == d}
    for d in (1, 2, 3)
  }
  assert n_lines[1] == {1} and n_lines[2] == {2} and n_lines[3] <= {3, 4}
  big = max(int(r["answer"]) for r in rows if r["difficulty"] == 3)
  assert big > max(int(r["answer"]) for r in rows if r["difficulty"] == 1)


def test_rule_verifier_agrees(rows):
  sub = rows[:60]
  wrong = _wrong(sub)
  with RuleVerifier(1) as v:
    right = v.verify([r["solution"] for r in sub], [r["answer"] for r in sub])
    bad = v.verify(wrong, [r["answer"] for r in sub])
  assert all(right.correct) and not any(bad.correct)
  assert set(right.status) == {"ok"} and set(bad.status) == {"ok"}


def test_wrong_solutions_differ_and_stay_consistent(rows):
  for r, w in zip(rows, _wrong(rows)):
    assert arith.boxed_answer(w) != int(r["answer"])
    got = arith.parse_solution(w)
    want = arith.parse_solution(r["solution"])
    assert len(got) == len(want)
    assert all(min(x, y, z) >= 0 for x, _, y, z in got)
    wrong_lines = [
      ln
      for ln in got
      if ln[3] != {"+": ln[0] + ln[2], "-": ln[0] - ln[2], "*": ln[0] * ln[2]}[ln[1]]
    ]
    assert len(wrong_lines) <= 1  # one slip (a misread operand leaves every line "correct")
  assert _wrong(rows[:20], seed=1) == _wrong(rows[:20], seed=1)


def test_bad_input_errors():
  with pytest.raises(ValueError, match="difficulty"):
    arith.make_problem(np.random.default_rng(0), 4)
  with pytest.raises(ValueError, match="difficulties"):
    arith.generate_rows(3, 0, difficulties=(0,))
  with pytest.raises(ValueError, match="not an arith solution line"):
    arith.make_wrong_solution({"solution": "I think 4.", "answer": "4"}, np.random.default_rng(0))


def test_write_split_loads_and_excludes(tmp_path):
  test = arith.write_split(tmp_path / "test.jsonl", 30, seed=1)
  train = arith.write_split(
    tmp_path / "train.jsonl", 30, seed=2, exclude_questions={r["question"] for r in test}
  )
  assert not {r["question"] for r in test} & {r["question"] for r in train}
  loaded, report = load_qa(str(tmp_path / "test.jsonl"))
  assert report.rows == 30 and [r["answer"] for r in loaded] == [r["answer"] for r in test]
  assert not list(tmp_path.glob(".*"))  # no temp files left behind


# ------------------------------------------------------------------------------ tokenizer
def test_tokenizer_round_trips_task_text(tok, rows):
  wrong = _wrong(rows)
  texts = [r["question"] for r in rows] + [r["solution"] for r in rows] + wrong
  texts += build_prompts(tok, [r["question"] for r in rows[:50]])
  texts += [build_rm_input(r["question"], r["answer"], w) for r, w in zip(rows[:50], wrong)]
  for t in texts:
    ids = tok.encode(t)
    assert tok.decode(ids, skip_special_tokens=False) == t
  assert tok.decode(tok.encode("Odd text: é ü 漢字 \t{}<>")) == "Odd text: é ü 漢字 \t{}<>"
  assert 300 <= tok.vocab_size <= 700


def test_tokenizer_digits_and_specials(tok):
  digit_ids = [tok.encode(str(d)) for d in range(10)]
  assert all(len(i) == 1 for i in digit_ids)
  assert tok.encode("Tom has 1204 apples")[-5:-1] == [digit_ids[d][0] for d in (1, 2, 0, 4)]
  for t in tok.hf.get_vocab():
    assert not any(c.isdigit() for c in t) or t.isdigit() and len(t) == 1, t
  for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"):
    assert len(tok.encode(s)) == 1
  assert tok.eos_id == tok.hf.convert_tokens_to_ids("<|im_end|>")
  assert tok.pad_id == tok.hf.convert_tokens_to_ids("<|pad|>") != tok.eos_id
  assert tok.chat_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ------------------------------------------------------------------------------ SFT
@pytest.fixture(scope="module")
def tiny(tok):
  cfg = ModelConfig(
    vocab_size=tok.vocab_size,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=64,
    tie_embeddings=True,
    pad_id=tok.pad_id,
  )
  # Jitted: eager Flax init runs the scanned layers op by op (tens of seconds on a busy CPU).
  params = jax.device_get(jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0)))
  return cfg, params


def test_sft_loss_matches_hand_computed_ce(tok, rows, tiny):
  cfg, params = tiny
  prompt = build_prompts(tok, [rows[0]["question"]])[0]
  batch = sft.encode_sft_batch(
    tok, [prompt], [rows[0]["solution"]], max_len=256, pad_to_multiple=32
  )
  p_ids, r_ids = tok.encode(prompt), tok.encode(rows[0]["solution"]) + [tok.eos_id]
  assert batch["tokens"].shape[1] % 32 == 0 and batch["tokens"].shape[1] > len(p_ids + r_ids)
  assert batch["loss_mask"].sum() == len(r_ids)

  logits = np.asarray(
    jax.jit(lambda p, t, m: forward(cfg, p, t, m))(params, batch["tokens"], batch["mask"]),
    np.float64,
  )[0]
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  # Response token k (at position len(p)+k) is predicted from position len(p)+k-1.
  want = -np.mean([logp[len(p_ids) + k - 1, r] for k, r in enumerate(r_ids)])
  loss, metrics = jax.jit(lambda p, b: sft.sft_loss_fn(cfg, p, b))(params, batch)
  # The same float32 logits on both sides; the loss's float32 log-softmax against float64 (its
  # max term, the sum over the vocabulary, the subtraction: tolerance.py's own-rounding term)
  # and the mean over the response tokens (their count, relative).
  u = 2.0**-24
  atol = 2 * u * (np.abs(logits).max() + np.sqrt(logits.shape[-1]) + abs(want) * len(r_ids))
  np.testing.assert_allclose(float(loss), want, rtol=0, atol=atol)
  assert float(metrics["response_tokens"]) == len(r_ids)


def test_sft_step_decreases_loss(tok, rows, tiny):
  cfg, params = tiny
  oc = optim_config(1e-2, warmup_steps=0, b2=0.95, weight_decay=0.0)
  oc.schedule = "constant"
  opt = optim.make_optimizer(oc)
  mesh = sharding.make_mesh(1, 1, 1)
  # A copy of the host params: the step donates its state.
  state = sharding.shard_tree(steps.init_state(jax.tree.map(np.array, params), opt), mesh)
  batch = sft.encode_sft_batch(
    tok,
    build_prompts(tok, [r["question"] for r in rows[:4]]),
    [r["solution"] for r in rows[:4]],
    max_len=256,
  )
  step = sft.make_sft_step(cfg, opt, mesh, state, batch)
  losses = []
  for _ in range(6):
    state, m = step(state, batch)
    losses.append(float(m["loss"]))
  assert losses[-1] < losses[0] - 0.5, losses
  assert int(state["step"]) == 6 and int(state["n_skipped"]) == 0


def test_sft_batch_errors(tok):
  with pytest.raises(ValueError, match="exceed max_len"):
    sft.encode_sft_batch(tok, ["a b c d"], ["1 2 3 4 5 6"], max_len=8)
  with pytest.raises(ValueError, match="same non-zero number"):
    sft.encode_sft_batch(tok, ["a"], [], max_len=8)
  with pytest.raises(ValueError, match="missing"):
    sft.make_sft_step(None, None, None, None, {"tokens": np.zeros((1, 2))})


def test_chain_is_correct_checks_every_line_not_just_the_answer():
  from cooper_jax.tasks.arith import chain_is_correct  # pylint: disable=import-outside-toplevel

  gold = "10 + 7 = 17\n17 + 8 = 25\n25 - 10 = 15\nThe answer is \\boxed{15}."
  assert chain_is_correct(gold, gold)
  # Right final answer through wrong intermediate arithmetic (seen in the policy's rollouts).
  assert not chain_is_correct(
    "10 + 7 = 18\n18 + 8 = 25\n25 - 10 = 15\nThe answer is \\boxed{15}.", gold
  )
  assert not chain_is_correct("10 + 7 = 17\nThe answer is \\boxed{15}.", gold)  # a line missing
  assert not chain_is_correct("8 + 8 = 1}.", gold)  # malformed


def test_tiny_small_task_run_steps_the_rm_on_its_schedule(tmp_path):
  """experiments/tiny.py:cooper,models=small_task: the RM takes a step at every one of the 4
  steps (the shipped policy answers some prompts right, so Cooper has pairs), logging the lr of
  each step from its own schedule: warmup_linear_decay, lr 1e-3, 2 warm-up steps, decay to 0
  over the run's 4, read at the RM's step count before its update (0, 1, 2, 3). Here with Lion,
  an RM-side ablation of one override."""
  cmd = [sys.executable, "-m", "cooper_jax.train", f"--workdir={tmp_path}"]
  cmd += [f"--config={ROOT}/experiments/tiny.py:cooper,models=small_task"]
  cmd += ["--config.rm.optim.name=lion", "--config.rm.optim.lion.b1=0.95"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  # by hand: k / 2 * 1e-3 while k < 2, then 1e-3 * (1 - (k - 2) / 2)
  assert [r["rm_train/lr"] for r in rows] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4], rel=1e-6)
  assert all(r["rm_train/updated"] == 1.0 and r["pairs/n_valid"] > 0 for r in rows)
  assert all(np.isfinite(r["rm_train/loss"]) for r in rows)
  step, state = final_params(tmp_path, ("rm",))
  assert step == 4 and int(state["rm"]["step"]) == 4  # four RM updates
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["rm"]["optim"]["name"] == "lion" and config["rm"]["optim"]["lion"]["b1"] == 0.95


# ------------------------------------------------------------------------------ rm_competent
COMPETENT = ROOT / "experiments" / "assets" / "small_task" / "rm_competent"


@pytest.mark.parametrize(
  "cond,mode", [("static_rm_competent", "static_rm"), ("cooper_competent_rewrite", "cooper")]
)
def test_competent_rm_conditions_use_the_shipped_rm(cond, mode):
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel

  c = load_config(f"{ROOT}/experiments/small_task.py:cond={cond},policy=wide")
  assert c.reward_mode == mode and Path(c.rm.model) == COMPETENT
  assert c.policy.model.endswith("small_task/policy_wide")
  for name in ("model.safetensors", "config.json", "tokenizer.json", "rm_report.json"):
    assert (COMPETENT / name).is_file(), name
  if mode == "cooper":  # the paper's Cooper: rewritten negatives, RM lr 10x, one RM step
    assert c.pairs.negatives == "llm_rewrite" and c.pairs.assistant_model.endswith("/rewriter")
    assert c.rm.optim.lr == pytest.approx(10 * c.policy.optim.lr, rel=1e-12)
    assert c.rm.updates_per_step == 1


def test_hybrid_label_keeps_agreements_and_counts_disagreements():
  """The rule verifier (math-verify, final answer) and the chain check (every line) label each
  rollout; agreement keeps the label, disagreement drops the rollout and counts its kind."""
  from cooper_jax.cli.annotate import hybrid_label  # pylint: disable=import-outside-toplevel

  gold = "10 + 7 = 17\n17 + 8 = 25\nThe answer is \\boxed{25}."
  completions = [
    gold,  # rule 1, chain 1: kept as 1
    "10 + 7 = 17\n17 + 8 = 26\nThe answer is \\boxed{26}.",  # rule 0, chain 0: kept as 0
    "10 + 7 = 18\n18 + 8 = 25\nThe answer is \\boxed{25}.",  # right answer, a wrong line
    "10 + 7 = 17\n17 + 8 = 25\nThe answer is \\boxed{26}.",  # every line right, wrong answer
    "10 + 7 = 18\n18 + 8 = 25\nThe answer is \\boxed{25}.",  # the same again: counted twice
  ]
  with RuleVerifier(1) as v:
    rule = v.verify(completions, ["25"] * len(completions))
  assert rule.correct.tolist() == [True, False, True, False, True]
  triples = [
    {"id": f"r{i}", "question": "q", "reference": "25", "completion": c, "label": int(y)}
    for i, (c, y) in enumerate(zip(completions, rule.correct))
  ]
  kept, dropped, stats = hybrid_label(triples, [gold] * len(triples))
  assert [(t["id"], t["label"]) for t in kept] == [("r0", 1), ("r1", 0)]
  assert [(d["id"], d["kind"]) for d in dropped] == [
    ("r2", "rule_correct_chain_wrong"),
    ("r3", "rule_wrong_chain_correct"),
    ("r4", "rule_correct_chain_wrong"),
  ]
  assert all("label" not in d for d in dropped)  # a disagreement is no label
  assert stats["dropped"] == {"rule_correct_chain_wrong": 2, "rule_wrong_chain_correct": 1}
  assert (stats["n"], stats["kept"], stats["kept_positive"]) == (5, 2, 1)
  with pytest.raises(ValueError, match="5 triples but 4 solutions"):
    hybrid_label(triples, [gold] * 4)


@pytest.mark.parametrize(
  "cond,negatives,ratio",
  [
    ("cooper_competent_rewrite", "llm_rewrite", 10),
    ("cooper_competent_rewrite_rmlr1x", "llm_rewrite", 1),
    ("cooper_competent_rewrite_rmlr0p1x", "llm_rewrite", 0.1),
    ("cooper_competent_onpolicy", "on_policy", 10),
    ("cooper_competent_onpolicy_rmlr1x", "on_policy", 1),
  ],
)
def test_competent_cooper_arms_set_negatives_and_rm_lr(cond, negatives, ratio):
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel

  c = load_config(f"{ROOT}/experiments/small_task.py:cond={cond},policy=wide")
  assert Path(c.rm.model) == COMPETENT and c.pairs.negatives == negatives
  assert c.rm.optim.lr == pytest.approx(ratio * 2e-4)  # the wide testbed's policy lr
  c.policy.optim.lr = 6e-4  # a policy-lr override moves the RM's with it
  assert c.rm.optim.lr == pytest.approx(ratio * 6e-4)
