"""The tunix peer: tunix's own JAX `Sampler` on its Llama model, timed in a throwaway venv
(never a project dependency) next to cooper_jax `sample`, both in JAX on the same CPU.

Same protocol as torch_side.py: the project side (`TunixPeer`) starts this file under the
tunix venv's python once and sends JSON requests over stdin, one per line; the worker answers
one JSON line per request on the real stdout. Arrays travel as .npz files. At module level
this file imports only numpy and the standard library; the project side imports cooper_jax and
the worker tunix inside their functions, so the worker never touches cooper_jax.

Two traps of tunix 0.1.7 that would make the peer run a different model than ours:
- its Llama attention calls `apply_rope` without the config's `rope_theta`, so every model
  gets base 1e6; SmolLM2 uses 1e5. The worker rebinds the module's `apply_rope` to one that
  passes the config's base (`_use_rope_theta`) before anything is traced.
- its Sampler treats every token equal to the pad id as padding, in the prompt and in the
  generated text. SmolLM2's pad id is <|im_end|> (2), which ends every chat turn of our
  prompts, so the peer is given a pad id that occurs in no prompt (`peer_pad_id`: 16,
  <empty_output>, for the real model) and counts how often it sampled that id.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

if __package__:  # imported by the project side
  from benchmarks.torch_side import WorkerClient, serve
else:  # this file as the tunix venv's worker script: its sibling (stdlib and numpy only)
  from torch_side import WorkerClient, serve  # type: ignore[no-redef]

DEFAULT_TUNIX_PYTHON = "/tmp/tunix/bin/python"
# Threads each side may use: os.sched_setaffinity to this many CPUs before jax starts, in both
# processes (XLA sizes its CPU thread pool, tf_XLAEigen, from the CPUs a process may run on).
CPUS = 2
PREFERRED_PAD = 16  # <empty_output> in SmolLM2's vocabulary: not in chat prompts
DISABLED_EOS = -1  # no token id equals it, so no row ever stops
VENV_HINT = (
  "create it with `python3.11 -m venv /tmp/tunix && /tmp/tunix/bin/pip install "
  "google-tunix==0.1.7 jax==0.10.2 flax==0.12.8 safetensors numpy math-verify==0.9.0` "
  "(math-verify: the rule reward of the tunix_iteration section)"
)


def limit_cpus(n: int = CPUS) -> list[int]:
  """Pins the calling thread (and every thread it starts later) to the first n allowed CPUs.
  Must run before jax creates its thread pools to limit them."""
  cpus = sorted(os.sched_getaffinity(0))[:n]
  os.sched_setaffinity(0, cpus)
  return cpus


def peer_pad_id(*token_arrays: np.ndarray, prefer: int = PREFERRED_PAD) -> int:
  """A pad id for tunix that is none of the prompts' tokens (`prefer` if possible): tunix
  masks every occurrence of its pad id, so the chat template's <|im_end|> cannot be it."""
  used = set()
  for t in token_arrays:
    used |= set(np.unique(t).tolist())
  if prefer not in used:
    return prefer
  return next(i for i in range(3, 1 << 30) if i not in used)


# ------------------------------------------------------------------------ project side (client)
class TunixPeer(WorkerClient):
  """The tunix worker (this file under the tunix venv's python)."""

  name = "tunix"

  def __init__(self, python: str = DEFAULT_TUNIX_PYTHON, gpu: bool = False):
    # On a GPU the worker takes the GPU and every CPU (its host loop is not what is compared);
    # on a CPU both sides get the same CPUS threads.
    env = dict(TQDM_DISABLE="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.update(JAX_PLATFORMS="cuda", PEER_CPUS="0") if gpu else env.update(JAX_PLATFORMS="cpu")
    super().__init__(python, __file__, env, VENV_HINT)


def gate(
  cfg,
  params,
  tokens,
  mask,
  peer: TunixPeer,
  hf_dir: str,
  greedy_tokens: int = 16,
  precision: str | None = None,
):
  """The peer runs our model, or no timing: (ok, figures). Logits of every real position of
  the same left-padded ids (the last one is what the first new token is drawn from) within
  1e-3 of `forward`'s, and `greedy_tokens` greedy tokens equal to `sample`'s. Both sides in
  float32 (the peer casts the exported weights up), at matmul `precision` when given (a GPU's
  default float32 matmul is TF32, about 1e-3 relative: "highest" both sides)."""
  import contextlib  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks.harness import gate_figures, our_gate_side  # pylint: disable=import-outside-toplevel

  pad = peer_pad_id(tokens[mask])
  npz = peer.save_arrays(tokens=tokens, mask=mask, pad_id=pad)
  out = peer.path("logits")
  kw = dict(hf_dir=hf_dir, npz=npz, dtype="float32", precision=precision)
  theirs = peer.call("logits", out=out, **kw)
  ctx = jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()
  with ctx:
    ours_l, ours_g = our_gate_side(cfg, params, tokens, mask, greedy_tokens)
  with np.load(out) as z:
    peer_l, unpatched = z["logits"], z["unpatched"]
  peer_g = peer.call("greedy", new_tokens=greedy_tokens, **kw)["tokens"]
  return gate_figures(
    ours_l,
    peer_l,
    mask,
    ours_g,
    peer_g,
    theirs["load_s"],
    max_abs_logit_diff_without_rope_fix=float(np.abs(ours_l - unpatched)[mask].max()),
    peer_pad_id=pad,
  )


def tunix_sampler_section(
  report, cfg, params, prompts, batches, new_tokens, python, hf_dir, runs, reps, gpu=None
) -> None:
  """Per batch: cooper_jax `sample` vs tunix `Sampler`, new tokens/s, temperature 1.0, EOS
  disabled on both sides, the peer (a worker under `python`) timed right before ours in each
  run. No timing unless the correctness gate passes; without the tunix venv the figures stay
  empty ("peer not run"). `gpu` (GPU mode, `GpuRun`): both sides on the GPU in the model's
  dtype, the gate in float32 on its own prompts, figures keyed by the shape's name."""
  try:
    import jax  # pylint: disable=import-outside-toplevel

    peer = TunixPeer(python, gpu=gpu is not None and jax.default_backend() == "gpu")
  except FileNotFoundError as e:
    print(f"(no tunix peer: {e})", flush=True)
    peer = None
  try:
    _section(report, cfg, params, prompts, batches, new_tokens, peer, hf_dir, runs, reps, gpu)
  finally:
    if peer is not None:
      peer.close()


class GpuRun:
  """What the GPU mode changes in the section: figure keys prefixed by the shape's `name`, the
  timed calls in `dtype` on both sides, the gate on `gate_prompts` (tokens, mask) in float32
  at matmul precision "highest"."""

  def __init__(self, name: str, dtype: str, gate_prompts):
    self.name, self.dtype, self.gate_prompts = name, dtype, gate_prompts


def _gate_side(cfg, params, prompts, gpu):
  """(cfg, params, tokens, mask, precision) the gate runs: as timed on a CPU; in float32 on
  the gate's own prompts at matmul precision "highest" on a GPU."""
  if gpu is None:
    tokens, mask, _ = prompts(2)
    return cfg, params, tokens, mask, None
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  f32 = cfg.replace(param_dtype="float32", dtype="float32")
  cast = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  return f32, cast, *gpu.gate_prompts, "highest"


def _section(report, cfg, params, prompts, batches, new_tokens, peer, hf_dir, runs, reps, gpu):
  from benchmarks import harness  # pylint: disable=import-outside-toplevel
  from benchmarks.sections import OurSampler  # pylint: disable=import-outside-toplevel

  label = "tunix Sampler"
  if peer is not None:
    report.meta["tunix"] = peer.info
    label += f" (tunix {peer.info['tunix']}, jax {peer.info['jax']})"
  prefix = f"{gpu.name}_" if gpu else ""
  section = f"{prefix}tunix_sampler"
  dtype = gpu.dtype if gpu else "float32"
  figs = {}
  for b in batches:
    figs[b] = report.figure(
      key=f"{section}_b{b}",
      label=f"{prefix}sampler batch {b}, {new_tokens} new, vs tunix: new tok/s",
      unit="tok/s",
      ours_label="cooper_jax sample",
      peer_label=label,
    )
  extras = report.extras.setdefault(section, {})

  if peer is None:
    return report.refuse(section, figs.values(), "peer not run (no tunix venv)")
  gcfg, gparams, tokens, mask, precision = _gate_side(cfg, params, prompts, gpu)
  ok, res = gate(gcfg, gparams, tokens, mask, peer, hf_dir, precision=precision)
  del gparams
  if not report.gate(section, figs.values(), "tunix", ok, res, "without_rope_fix"):
    return None
  for b in batches:
    fig = figs[b]
    tokens, mask, pad_id = prompts(b)
    pad = peer_pad_id(tokens[mask])
    npz = peer.save_arrays(tokens=tokens, mask=mask, pad_id=pad)
    ours = OurSampler(cfg, params, tokens, mask, new_tokens, pad_id)
    lens = mask.sum(1)
    fig.label = (
      f"{prefix}sampler batch {b}, prompts {int(lens.min())}-{int(lens.max())} (width "
      f"{tokens.shape[1]}), {new_tokens} new, vs tunix: new tok/s"
    )
    answers = harness.paired_peer_runs(
      report,
      fig,
      runs,
      reps,
      b * new_tokens,
      ours,
      lambda: peer.call(
        "generate", hf_dir=hf_dir, npz=npz, new_tokens=new_tokens, reps=reps, dtype=dtype
      ),
      "tunix",
      peer_pad_sampled="pad_sampled",
    )
    first = answers[0]["first_call_s"]
    split = peer.call("split", hf_dir=hf_dir, npz=npz, new_tokens=new_tokens, dtype=dtype)
    fig.notes.append(
      f"best of {reps} calls per side per run; our compile {ours.compile_s:.1f} s; tunix's "
      f"first call (compile) {first:.1f} s; tunix pad id {pad}; tunix split "
      f"(one extra call): prefill {split['prefill_s']:.2f} s, decode {split['decode_s']:.2f} s"
    )
    extras[f"b{b}"] = {
      "prompt_lens": lens.tolist(),
      "width": int(tokens.shape[1]),
      "new_tokens": new_tokens,
      "peer_pad_id": pad,
      "peer_first_call_s": first,
      "peer_split": split,
      "our_compile_s": ours.compile_s,
      "our_first_call_s": ours.first_call_s,
    }
    report.save_partial()


# ------------------------------------------------------------------------ tunix venv (worker)
class _IdsTokenizer:
  """Sampler takes strings and tokenizes them; this 'tokenizer' reads space-separated ids, so
  the peer runs the exact ids our side runs. No BOS added (the ids already hold the chat
  template's), EOS from the call, pad as chosen by the client."""

  def __init__(self, pad_id: int):
    self._pad = pad_id

  def encode(self, text: str, **_) -> list[int]:
    return [int(x) for x in text.split()]

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return None

  def eos_id(self) -> int:
    return DISABLED_EOS

  def pad_id(self) -> int:
    return self._pad


def _shard_map_shim() -> bool:
  """tunix 0.1.7's models import `jax.experimental.shard_map` (for TPU splash attention, never
  called on a CPU or GPU); a jax without that module gets one naming `jax.shard_map`. True
  when the shim was needed (recorded in the worker's hello)."""
  try:
    import jax.experimental.shard_map  # pylint: disable=import-outside-toplevel,unused-import  # noqa: F401
  except ImportError:
    import types  # pylint: disable=import-outside-toplevel

    import jax  # pylint: disable=import-outside-toplevel

    mod = types.ModuleType("jax.experimental.shard_map")
    mod.shard_map = jax.shard_map
    sys.modules["jax.experimental.shard_map"] = mod
    return True
  return False


class _Worker:
  def __init__(self):
    self.shimmed = _shard_map_shim()
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from tunix.generate import sampler as sampler_lib  # pylint: disable=import-outside-toplevel
    from tunix.generate import utils  # pylint: disable=import-outside-toplevel
    from tunix.models.llama3 import model as model_lib  # pylint: disable=import-outside-toplevel

    self.jax, self.jnp, self.sampler_lib, self.utils = jax, jnp, sampler_lib, utils
    self.model_lib = model_lib  # Llama (SmolLM2); Qwen2 through _family
    self.original_rope = model_lib.apply_rope
    self.models: dict[str, object] = {}
    self.samplers: dict[tuple, object] = {}
    self.warm: set = set()

  def hello(self):
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel

    import flax  # pylint: disable=import-outside-toplevel

    d = self.jax.devices()[0]
    return {
      "tunix": version("google-tunix"),
      "jax": self.jax.__version__,
      "flax": flax.__version__,
      "device": f"{d.platform} ({d.device_kind})",
      "cpus": sorted(os.sched_getaffinity(0)),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "shard_map_shim": self.shimmed,
    }

  def _use_rope_theta(self, theta) -> None:
    """tunix 0.1.7's Attention calls apply_rope(x, pos, head_dim=...) and so always gets the
    default base 1e6; rebinding the module-level name makes it use `theta` (None: as shipped).
    Attention looks the name up when traced, so this holds for everything traced after."""
    orig = self.original_rope
    if theta is None:
      self.model_lib.apply_rope = orig
      return

    def apply_rope(inputs, positions, head_dim, rope_theta=None):
      del rope_theta  # the config's base, whatever the caller passes
      return orig(inputs, positions, head_dim=head_dim, rope_theta=theta)

    self.model_lib.apply_rope = apply_rope

  @staticmethod
  def _family(hf_dir: str):
    """(config.json, tunix model module, its params module): Llama3 for a llama export
    (SmolLM2), Qwen2 for a qwen2 one (Qwen2.5)."""
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
      hf = json.load(f)
    if hf.get("model_type") == "qwen2":
      from tunix.models.qwen2 import model, params  # pylint: disable=import-outside-toplevel
    else:
      from tunix.models.llama3 import model, params  # pylint: disable=import-outside-toplevel
    return hf, model, params

  def config(self, hf_dir: str, sampling: bool = True, dtype: str = "float32"):
    """tunix's ModelConfig from the config.json our side exported (sampling or training
    sharding), with the rope fix in place for a Llama (tunix's Qwen2 passes its base)."""
    hf, ml, _ = self._family(hf_dir)
    kw = dict(
      num_layers=hf["num_hidden_layers"],
      vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"],
      head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
      num_kv_heads=hf["num_key_value_heads"],
      rope_theta=hf["rope_theta"],
      norm_eps=hf["rms_norm_eps"],
      shd_config=ml.ShardingConfig.get_default_sharding(is_sampling=sampling),
    )
    tied = hf.get("tie_word_embeddings", False)
    if ml is self.model_lib:
      cfg = ml.ModelConfig(**kw, weight_tying=tied)
      self._use_rope_theta(cfg.rope_theta)
    else:  # Qwen2 computes in its config's dtype, not the weights'
      dt = getattr(self.jnp, dtype)
      cfg = ml.ModelConfig(**kw, use_tied_embedding=tied, dtype=dt, param_dtype=dt)
    return cfg

  def model(self, hf_dir: str, dtype: str = "float32"):
    """tunix's model from the safetensors our side exported, weights cast to `dtype`,
    sampling sharding (no mesh: one device)."""
    key = (hf_dir, dtype)
    if key not in self.models:
      _, _, params_lib = self._family(hf_dir)
      cfg = self.config(hf_dir, dtype=dtype)
      t0 = time.perf_counter()
      m = params_lib.create_model_from_safe_tensors(hf_dir, cfg, dtype=getattr(self.jnp, dtype))
      self.models[key] = (m, time.perf_counter() - t0)
    return self.models[key]

  def sampler(self, hf_dir: str, cache_size: int, pad_id: int, dtype: str = "float32"):
    key = (hf_dir, cache_size, pad_id, dtype)
    if key not in self.samplers:
      m, _ = self.model(hf_dir, dtype)
      c = m.config
      cache = self.sampler_lib.CacheConfig(
        cache_size=cache_size,
        num_layers=c.num_layers,
        num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim,
      )
      self.samplers[key] = self.sampler_lib.Sampler(m, _IdsTokenizer(pad_id), cache)
    return self.samplers[key]

  @staticmethod
  def _prompts(npz):
    z = np.load(npz)
    tokens, mask = z["tokens"], z["mask"].astype(bool)
    texts = [" ".join(str(int(i)) for i in t[m]) for t, m in zip(tokens, mask)]
    return texts, tokens.shape[1], int(z["pad_id"])

  def _call(self, hf_dir, texts, width, pad, n, dtype="float32", **kw):
    """One Sampler call as a user makes it, prompts left-padded to our width (not tunix's
    next power of two), cache exactly width + n slots."""
    s = self.sampler(hf_dir, width + n, pad, dtype)
    return s(
      texts,
      max_generation_steps=n,
      max_prompt_length=width,
      echo=False,
      eos_tokens=[DISABLED_EOS],
      **kw,
    )

  def _precision(self, precision):
    import contextlib  # pylint: disable=import-outside-toplevel

    return self.jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()

  def logits(self, hf_dir, npz, out, dtype="float32", precision=None):
    """Full-sequence logits [b, t, v] of the ids as our side lays them out (left padding,
    positions counted from the first real token), with the rope fix and, for the record,
    without it (a Qwen2 needs none: both are the same)."""
    m, load_s = self.model(hf_dir, dtype)
    z = np.load(npz)
    tokens = self.jnp.asarray(z["tokens"])
    mask = self.jnp.asarray(z["mask"].astype(bool))
    pos = self.utils.build_positions_from_mask(mask)
    attn = self.utils.make_causal_attn_mask(mask, tokens.shape[1])
    res = {}
    llama = isinstance(m, self.model_lib.Llama3)
    for name, theta in (("logits", m.config.rope_theta), ("unpatched", None)):
      if llama:
        self._use_rope_theta(theta)
      with self._precision(precision):
        res[name] = np.asarray(m(tokens, pos, None, attn)[0], np.float32)
    if llama:
      self._use_rope_theta(m.config.rope_theta)
    np.savez(out, **res)
    return {"load_s": load_s, "shape": list(res["logits"].shape)}

  def greedy(self, hf_dir, npz, new_tokens, dtype="float32", precision=None):
    texts, width, pad = self._prompts(npz)
    with self._precision(precision):
      out = self._call(hf_dir, texts, width, pad, new_tokens, dtype, temperature=0.0)
    return {"tokens": [np.asarray(t).tolist() for t in out.tokens]}

  def generate(self, hf_dir, npz, new_tokens, reps, seed=0, dtype="float32"):
    texts, width, pad = self._prompts(npz)
    gen = lambda s: self._call(
      hf_dir, texts, width, pad, new_tokens, dtype, temperature=1.0, top_p=1.0, top_k=None, seed=s
    )
    shape = ("generate", hf_dir, len(texts), width, new_tokens)
    first = None
    if shape not in self.warm:  # the first call of a shape compiles prefill and decode
      t0 = time.perf_counter()
      gen(seed)
      first = time.perf_counter() - t0
      self.warm.add(shape)
    seconds, out = [], None
    for r in range(reps):
      t0 = time.perf_counter()
      out = gen(seed + 1 + r)  # returns host lists: the call has finished
      seconds.append(time.perf_counter() - t0)
    lens = {len(t) for t in out.tokens}
    if len(lens) != 1:
      raise RuntimeError(f"rows made different numbers of tokens: {sorted(lens)}")
    return {
      "seconds": seconds,
      "new_tokens": lens.pop(),
      "batch": len(texts),
      "made": sum(len(t) for t in out.tokens),
      "first_call_s": first,
      "pad_sampled": int(sum(int(np.sum(np.asarray(t) == pad)) for t in out.tokens)),
    }

  def split(self, hf_dir, npz, new_tokens, seed=0, dtype="float32"):
    """Prefill and decode seconds of one more call, through the Sampler's own jitted prefill
    and decode functions (what its __call__ runs between host-side steps, not public API)."""
    texts, width, pad = self._prompts(npz)
    s = self.sampler(hf_dir, width + new_tokens, pad, dtype)
    s.eos_ids = self.jnp.array([DISABLED_EOS])
    ids = np.array([[pad] * (width - len(t.split())) + s.tokenize(t).tolist() for t in texts])
    jax = self.jax
    t0 = time.perf_counter()
    state = s.init_sample_state(
      self.jnp.array(ids),
      total_sampling_steps=width + new_tokens,
      include_logits=False,
      forbidden_token_ids=None,
      temperature=1.0,
      top_p=1.0,
      top_k=None,
      seed=jax.random.PRNGKey(seed),
      beam_size=None,
    )
    state = jax.block_until_ready(
      s._compiled_prefill_fn(s._flattened_transformer_state, state, None, echo=False)
    )
    t1 = time.perf_counter()
    state = jax.block_until_ready(s._compiled_decode_fn(s._flattened_transformer_state, state))
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1}


def _serve() -> None:
  n = int(os.environ.get("PEER_CPUS", CPUS))  # 0: every CPU (the GPU mode)
  if n:
    limit_cpus(n)  # before jax starts its thread pools
  serve(_Worker)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  _serve()
