"""The paper's negative generator: a frozen assistant LLM rewrites a rule-verified positive
into a plausible but wrong solution of similar length (`LLMRewriteNegatives`, registered as
pairs.negatives = "llm_rewrite"), with its prompts in one place. The acceptance of its
candidates and the pairs they form: cooper_jax/rewards/pairs.py.

Importing this module does not import jax (the registry and the CLIs' config checks read it).
"""

from __future__ import annotations

import functools

import numpy as np

from cooper_jax import distributed as dist
from cooper_jax.prompts import widen_left

# The system instruction for the assistant LLM. The paper's (code) instruction asks for wrong
# reasoning, a wrong result, similar length, a solution that looks right and plausible-
# sounding content; we add the \boxed{} answer so math-verify can check it differs.
REWRITE_SYSTEM = (
  "You turn correct solutions of math problems into convincing wrong ones. Given a math "
  "problem and a correct solution, write a new solution that:\n"
  "1. uses wrong reasoning or wrong calculations;\n"
  "2. reaches a final result different from the correct one;\n"
  "3. has about the same length as the correct solution;\n"
  "4. looks like a genuine, confident solution of the problem, with no hint that it is "
  "wrong;\n"
  "5. states its final answer as \\boxed{answer}."
)


def rewrite_prompt(question: str, positive: str) -> str:
  """The user message asking for a wrong rewrite of `positive` (pure; no template)."""
  return (
    f"Math problem:\n{question}\n\n"
    f"Correct solution:\n{positive}\n\n"
    "Reply with the wrong solution only: its steps and the final answer in "
    "\\boxed{}, nothing else."
  )


REWRITE_FORMATS = ("paper", "plain")


def rewrite_chat_prompt(tokenizer, question: str, positive: str, fmt: str = "paper") -> str:
  """The assistant's rendered prompt for one rewrite, in one place (the sampler and the tool
  that trains a small-task assistant both call it).

  "paper": the paper's instruction as the system message and `rewrite_prompt` as the user
  message (an instruction-following chat model). "plain": the question and the correct
  solution alone, one per line, as the user message, for an assistant trained on that format
  whose vocabulary has no instructions (experiments/assets/small_task/rewriter)."""
  if fmt == "paper":
    return tokenizer.chat_prompt(rewrite_prompt(question, positive), system=REWRITE_SYSTEM)
  if fmt == "plain":
    return tokenizer.chat_prompt(f"{question}\n{positive}")
  raise ValueError(f"rewrite format {fmt!r}: expected one of {REWRITE_FORMATS}")


def rewrite_token_budget(positive: str) -> int:
  """Paper (code): max tokens = number of words in the positive + 500."""
  return len(positive.split()) + 500


class LLMRewriteNegatives:
  """Negatives written by a frozen assistant LLM (the paper's generator).

  The assistant is loaded like any policy (`load_pretrained`), sampled at temperature 0.7.
  The sampler takes one static length per batch, so the batch runs for
  min(max_new_tokens, max over rows of words + 500) tokens and each row is then cut to its
  own budget, as the per-request max_tokens of the reference code would. Rows are padded to
  a power of two, at least `min_rows` (from_config: the groups a process holds, the most
  positives a step can bring), and prompts to a multiple of `batch_pad_multiple` tokens, so
  the first try and the retries on a few rows run one compiled shape per prompt width (each
  row has its own key: the filler rows change no real row's draw).

  With a `mesh` (the training run's) the assistant's params are global arrays and each call
  is collective: every process brings its own rows (those of the groups it holds), the row
  count, prompt width and token budget are agreed over processes (the largest, rows padded
  to a power of two that the process's batch devices divide), the prompts become one global
  array with each process's rows on its own devices, and each process reads back its rows.
  Every row is drawn with its own key (`row_seeds`), so a row's rewrite does not depend on
  the batch it sits in: N processes draw what one draws.
  """

  name = "llm_rewrite"
  per_row_seeds = True

  def __init__(
    self,
    cfg,
    params,
    tokenizer,
    *,
    temperature: float = 0.7,
    max_new_tokens: int,
    batch_pad_multiple: int = 64,
    top_p: float = 1.0,
    prompt_format: str = "paper",
    mesh=None,
    decode_weights: str = "sharded",
    min_rows: int = 1,
  ):
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prompt_format not in REWRITE_FORMATS:
      raise ValueError(f"prompt_format {prompt_format!r}: expected one of {REWRITE_FORMATS}")
    self.prompt_format = prompt_format
    self.cfg, self.params, self.tokenizer = cfg, params, tokenizer
    self.temperature, self.top_p = temperature, top_p
    self.max_new_tokens, self.batch_pad_multiple = max_new_tokens, batch_pad_multiple
    self.mesh = mesh
    self.min_rows = max(1, int(min_rows))
    self.collective = mesh is not None
    # The sampler's weight layout on the mesh (config pairs.assistant_decode_weights).
    self.decode_weights = decode_weights if mesh is not None else "sharded"
    from cooper_jax import sharding  # pylint: disable=import-outside-toplevel
    from cooper_jax.sampling import SampleOptions  # pylint: disable=import-outside-toplevel

    # The assistant sampler's options, but for each call's budget (`_sample`).
    self.options = SampleOptions(
      max_new_tokens=max_new_tokens,
      temperature=temperature,
      top_p=top_p,
      eos_ids=tuple(tokenizer.eos_ids),
      pad_id=tokenizer.pad_id,
      weights_sharding=None if mesh is None else sharding.decode_weights(mesh, decode_weights),
    )

  @classmethod
  def from_config(cls, c, mesh) -> LLMRewriteNegatives:
    """The config's assistant (pairs.assistant_*), loaded in its dtype and sharded over the
    run's mesh like the policy (a 7B model in float32 on one device does not fit an
    accelerator), or in its decode layout's own (pairs.assistant_decode_weights=mlp_split:
    sharding.decode_tree_shardings); sampled as global arrays, each process its own rows."""
    import logging  # pylint: disable=import-outside-toplevel

    import jax  # pylint: disable=import-outside-toplevel

    from cooper_jax import sharding  # pylint: disable=import-outside-toplevel
    from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
    from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

    p = c.pairs
    cfg, params = load_pretrained(
      p.assistant_model, dtype=p.assistant_dtype, param_dtype=p.assistant_dtype
    )
    logging.info(
      "assistant %s: %s, sharded over %s", p.assistant_model, p.assistant_dtype, mesh.shape
    )
    placed = jax.device_put(
      params, sharding.decode_tree_shardings(params, mesh, p.assistant_decode_weights)
    )
    return cls(
      cfg,
      placed,
      load_tokenizer(p.assistant_model),
      temperature=p.assistant_temperature,
      max_new_tokens=p.assistant_max_new_tokens,
      prompt_format=p.rewrite_format,
      mesh=mesh,
      decode_weights=p.assistant_decode_weights,
      min_rows=-(-c.rollout.prompts_per_step // dist.process_count()),
    )

  def _rows(self, n: int) -> int:
    """The batch rows for n prompts: a power of two, at least min_rows."""
    return 1 << (max(n, self.min_rows) - 1).bit_length()

  def chat_prompts(self, questions: list[str], positives: list[str]) -> list[str]:
    return [
      rewrite_chat_prompt(self.tokenizer, q, p, self.prompt_format)
      for q, p in zip(questions, positives)
    ]

  def generate(
    self,
    questions: list[str],
    positives: list[str],
    attempt: int,
    rng: np.random.Generator,
    row_seeds: list[int] | None = None,
  ) -> list[str]:
    del attempt  # a fresh sample per try is what the reference code retries with
    n = len(positives)
    if n == 0 and not self.collective:
      return []
    budgets = [min(self.max_new_tokens, rewrite_token_budget(p)) for p in positives]
    if row_seeds is None:
      row_seeds = [int(x) for x in rng.integers(2**31 - 1, size=n)]
    if self.collective:
      toks, mask = self._sample_global(self.chat_prompts(questions, positives), budgets, row_seeds)
    else:
      toks, mask = self._sample_local(self.chat_prompts(questions, positives), budgets, row_seeds)
    return [self.tokenizer.decode(toks[i][mask[i]][: budgets[i]].tolist()) for i in range(n)]

  def _sample_local(self, prompts, budgets, row_seeds):
    import jax  # pylint: disable=import-outside-toplevel

    rows = self._rows(len(prompts))
    tokens, mask = self.tokenizer.encode_prompts(
      prompts + [prompts[-1]] * (rows - len(prompts)),  # filler rows, discarded
      pad_to_multiple=self.batch_pad_multiple,
    )
    seeds = np.zeros(rows, np.uint32)
    seeds[: len(row_seeds)] = row_seeds
    out = self._sample(tokens, mask, jax.vmap(jax.random.key)(seeds), max(budgets))
    return np.asarray(out.tokens), np.asarray(out.mask)

  def _sample_global(self, prompts, budgets, row_seeds):
    """The collective path (see the class doc): this process's rows of one global batch."""
    from cooper_jax import sharding  # pylint: disable=import-outside-toplevel

    n, procs = len(prompts), dist.process_count()
    per_proc = max(1, self.mesh.shape["data"] * self.mesh.shape["fsdp"] // procs)
    # One allgather agrees on rows, prompt width and budget (each the largest of any process).
    filler = self.chat_prompts([""], [""])[0]
    tokens, mask = self.tokenizer.encode_prompts(
      prompts or [filler], pad_to_multiple=self.batch_pad_multiple
    )
    n_max, width, budget = (
      int(v)
      for v in dist.allgather(np.asarray([n, tokens.shape[1], max(budgets, default=1)])).max(0)
    )
    rows = -(-self._rows(n_max) // per_proc) * per_proc
    fill = rows - len(tokens)  # filler rows (copies of the last), discarded on the way back
    tokens = np.concatenate([tokens, np.repeat(tokens[-1:], fill, 0)])
    mask = np.concatenate([mask, np.repeat(mask[-1:], fill, 0)])
    tokens, mask = widen_left(tokens, mask, width, self.tokenizer.pad_id)
    seeds = np.zeros(rows, np.uint32)
    seeds[:n] = row_seeds
    shape = (rows * procs,)
    rows_sh = sharding.batch_sharding(self.mesh, 1)
    put = lambda x, sh: dist.put_local_rows(x, sh, shape + x.shape[1:])
    bs = sharding.batch_sharding(self.mesh)
    keys = _row_keys(rows_sh)(put(seeds, rows_sh))
    out = self._sample(put(tokens, bs), put(mask, bs), keys, budget)
    return dist.fetch_local_rows(out.tokens), dist.fetch_local_rows(out.mask)

  def _sample(self, tokens, mask, keys, max_new_tokens):
    from cooper_jax.sampling import sample  # pylint: disable=import-outside-toplevel

    options = self.options.replace(max_new_tokens=max_new_tokens)
    return sample(self.params, tokens, mask, keys, cfg=self.cfg, options=options)


@functools.cache
def _row_keys(out_sharding):
  """One compiled seeds -> keys map per output sharding (a jit built per call compiles anew
  at every call)."""
  import jax  # pylint: disable=import-outside-toplevel

  return jax.jit(jax.vmap(jax.random.key), out_shardings=out_sharding)
