"""The llama.cpp peer: what people use to decode on a CPU, through `llama-cpp-python`'s
low-level API (llama.cpp's own batched decode and sampler chain), in a throwaway venv (never a
project dependency), timed next to cooper_jax `sample` in the same run.

Same protocol as torch_side.py: the project side (`LlamaCppPeer`) starts this file under the
venv's python once and sends JSON requests over stdin, one per line; the worker answers one JSON
line per request. At module level this file imports only numpy and the standard library.

Same weights: `f32_gguf` writes the embedded Q4_1 GGUF with every tensor dequantised to F32,
metadata unchanged (so llama.cpp keeps its own q/k row layout) — the very values cooper_jax
loads from that file. The original Q4_1 file is timed too, as a labelled extra (other weights:
no correctness gate, not a ratio of like with like).

Traps written down (llama-cpp-python 0.3.36):
- its KV cache defaults to F16 (`type_k`/`type_v`): with it the logits of fp32 weights differ
  from ours well above 1e-3. The worker asks for an F32 cache.
- `n_ctx` is the whole cache: with one KV stream per sequence (the default) each of the
  `n_seq_max` rows gets n_ctx / n_seq_max cells, so n_ctx must be rows x (longest prompt + new
  tokens), or llama_decode returns 1 ("failed to find a memory slot").
- `n_batch` caps the tokens one `llama_decode` call takes: the batched prefill of every prompt
  needs it at least their total (the call splits it into `n_ubatch` pieces itself).
- EOS off: the loop never asks the vocabulary whether a token ends generation, so every row
  makes exactly the requested number of tokens.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

if __package__:  # imported by the project side
  from benchmarks.torch_side import WorkerClient, serve
  from benchmarks.tunix_side import CPUS, limit_cpus
else:  # the venv's worker script: its siblings (stdlib and numpy only)
  from torch_side import WorkerClient, serve  # type: ignore[no-redef]
  from tunix_side import CPUS, limit_cpus  # type: ignore[no-redef]

DEFAULT_LLAMACPP_PYTHON = "/tmp/llamacpp/bin/python"
VENV_HINT = (
  "create it with `python3.11 -m venv /tmp/llamacpp && CMAKE_ARGS='-DGGML_NATIVE=ON' "
  "/tmp/llamacpp/bin/pip install llama-cpp-python==0.3.36 numpy` (builds llama.cpp, ~15 min "
  "on 2 cores)"
)


def f32_gguf(src: str, dst: str) -> str:
  """`src` with every tensor dequantised to F32 and `general.file_type` set to ALL_F32, all
  other metadata copied; written to `dst` under a temporary name, renamed when complete (removed
  if the write fails: nothing half-written is left)."""
  import gguf  # pylint: disable=import-outside-toplevel

  reader = gguf.GGUFReader(src)
  tmp = dst + ".partial"
  try:
    writer = gguf.GGUFWriter(tmp, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
      if name.startswith("GGUF.") or name == "general.architecture":
        continue  # the header's own fields, and the one the writer was given
      value = field.contents()
      if name == "general.file_type":
        value = int(gguf.LlamaFileType.ALL_F32)
      array = field.types[0] == gguf.GGUFValueType.ARRAY
      writer.add_key_value(name, value, field.types[0], field.types[1] if array else None)
    for t in reader.tensors:
      a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
      writer.add_tensor(t.name, a.reshape([int(d) for d in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)  # nothing half-written left behind
    raise
  os.replace(tmp, dst)
  return dst


# ------------------------------------------------------------------------ project side (client)
class LlamaCppPeer(WorkerClient):
  """The llama.cpp worker (this file under the llama-cpp-python venv's python)."""

  name = "llama.cpp"

  def __init__(self, python: str = DEFAULT_LLAMACPP_PYTHON):
    super().__init__(python, __file__, {}, VENV_HINT)


def gate(cfg, params, tokens, mask, peer, gguf_path: str, greedy_tokens: int = 16):
  """(ok, figures): logits at every real position of each prompt (decoded alone, no padding)
  within 1e-3 of `forward`'s on the left-padded batch, and `greedy_tokens` greedy tokens equal
  to `sample`'s."""
  from benchmarks.harness import gate_figures, our_gate_side  # pylint: disable=import-outside-toplevel

  npz = peer.save_arrays(tokens=tokens, mask=mask)
  out = peer.path("logits")
  theirs = peer.call("logits", gguf=gguf_path, npz=npz, out=out)
  ours_l, ours_g = our_gate_side(cfg, params, tokens, mask, greedy_tokens)
  with np.load(out) as z:
    peer_l = z["logits"]
  peer_g = peer.call("greedy", gguf=gguf_path, npz=npz, new_tokens=greedy_tokens)["tokens"]
  return gate_figures(ours_l, peer_l, mask, ours_g, peer_g, theirs["load_s"])


def llamacpp_sampler_section(
  report, cfg, params, prompts, batches, new_tokens, python, workdir, runs, reps
) -> None:
  """Per batch: cooper_jax `sample` vs llama.cpp's batched decode (F32 GGUF of the same
  weights), new tokens/s, temperature 1.0, EOS off, the peer timed right before ours in each
  run; then the Q4_1 original, labelled. No timing unless the gate passes."""
  from benchmarks import harness  # pylint: disable=import-outside-toplevel
  from benchmarks.sections import OurSampler  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights.embedded import embedded_gguf_path  # pylint: disable=import-outside-toplevel

  try:
    peer = LlamaCppPeer(python)
  except FileNotFoundError as e:
    print(f"(no llama.cpp peer: {e})", flush=True)
    peer = None
  label = "llama.cpp batched decode, F32 GGUF"
  if peer is not None:
    report.meta["llama.cpp"] = peer.info
    label += f" (llama-cpp-python {peer.info['llama_cpp_python']})"
  figs = {}
  for b in batches:
    for quant in ("f32", "q4_1"):
      figs[b, quant] = report.figure(
        key=f"llamacpp_{quant}_b{b}",
        label=f"sampler batch {b}, {new_tokens} new, vs llama.cpp {quant.upper()}: new tok/s",
        unit="tok/s",
        ours_label="cooper_jax sample (fp32)",
        peer_label=label if quant == "f32" else label.replace("F32", "Q4_1 (other weights)"),
      )
  extras = report.extras.setdefault("llamacpp_sampler", {})
  if peer is None:
    return report.refuse("llamacpp_sampler", figs.values(), "peer not run (no llama.cpp venv)")
  try:
    src = str(embedded_gguf_path())
    files = {"f32": f32_gguf(src, os.path.join(workdir, "smollm2_f32.gguf")), "q4_1": src}
    tokens, mask, _ = prompts(2)
    ok, res = gate(cfg, params, tokens, mask, peer, files["f32"])
    if not report.gate("llamacpp_sampler", figs.values(), "llama.cpp", ok, res, "first_position"):
      return None
    for b in batches:
      tokens, mask, pad_id = prompts(b)
      npz = peer.save_arrays(tokens=tokens, mask=mask)
      ours = OurSampler(cfg, params, tokens, mask, new_tokens, pad_id)
      for quant, path in files.items():
        fig = figs[b, quant]
        p = harness.paired_peer_runs(
          report,
          fig,
          runs,
          reps,
          b * new_tokens,
          ours,
          lambda path=path: peer.call(
            "generate", gguf=path, npz=npz, new_tokens=new_tokens, reps=reps
          ),
          "llama.cpp",
          peer_prefill_s="prefill_s",
        )[-1]
        fig.notes.append(
          f"best of {reps} calls per side per run; our compile {ours.compile_s:.1f} s; "
          f"llama.cpp prefill (all prompts, one llama_decode) {min(p['prefill_s']):.2f} s of "
          f"its best call; {peer.info['threads']} threads, KV cache F32"
        )
      extras[f"b{b}"] = {"prompt_lens": mask.sum(1).tolist(), "width": int(tokens.shape[1])}
      report.save_partial()
  finally:
    peer.close()


# ------------------------------------------------------------------- llama-cpp-python (worker)
class _Worker:
  def __init__(self):
    import llama_cpp  # pylint: disable=import-outside-toplevel

    self.ll = llama_cpp
    # llama.cpp logs every graph node at load; keep warnings and errors (levels 3, 4).
    self._log = llama_cpp.llama_log_callback(
      lambda level, text, _: (
        sys.stderr.write(text.decode(errors="replace")) if level in (3, 4) else None
      )
    )
    llama_cpp.llama_log_set(self._log, None)
    llama_cpp.llama_backend_init()
    self.models: dict[str, object] = {}
    self.load_s: dict[str, float] = {}

  def hello(self):
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel

    return {
      "llama_cpp_python": version("llama-cpp-python"),
      "system_info": self.ll.llama_print_system_info().decode(),
      "cpus": sorted(os.sched_getaffinity(0)),
      "threads": CPUS,
    }

  def model(self, path: str):
    if path not in self.models:
      t0 = time.perf_counter()
      mp = self.ll.llama_model_default_params()
      mp.use_mmap = False  # the weights in memory before the first timed call
      m = self.ll.llama_model_load_from_file(path.encode(), mp)
      if not m:
        raise RuntimeError(f"llama.cpp could not load {path}")
      self.models[path] = m
      self.load_s[path] = time.perf_counter() - t0
    return self.models[path]

  def context(self, path: str, n_ctx: int, n_batch: int, n_seq: int):
    ll = self.ll
    cp = ll.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_batch
    cp.n_ubatch = min(512, n_batch)
    cp.n_seq_max = n_seq
    cp.n_threads = cp.n_threads_batch = CPUS
    cp.type_k = cp.type_v = ll.GGML_TYPE_F32
    if hasattr(cp, "flash_attn_type"):
      cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.no_perf = True
    ctx = ll.llama_init_from_model(self.model(path), cp)
    if not ctx:
      raise RuntimeError(f"llama.cpp could not make a context (n_ctx {n_ctx}, n_seq {n_seq})")
    return ctx

  @staticmethod
  def _rows(npz) -> list[list[int]]:
    z = np.load(npz)
    return [t[m.astype(bool)].tolist() for t, m in zip(z["tokens"], z["mask"])]

  def _decode(self, ctx, batch) -> None:
    rc = self.ll.llama_decode(ctx, batch)
    if rc != 0:
      raise RuntimeError(f"llama_decode returned {rc}")

  def _fill(self, batch, entries) -> None:
    """entries: (token, position, sequence, want logits) in batch order."""
    for n, (tok, pos, seq, want) in enumerate(entries):
      batch.token[n] = tok
      batch.pos[n] = pos
      batch.n_seq_id[n] = 1
      batch.seq_id[n][0] = seq
      batch.logits[n] = want
    batch.n_tokens = len(entries)

  def _vocab(self, path: str) -> int:
    ll = self.ll
    return ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model(path)))

  def _logits(self, ctx, i: int, n_vocab: int) -> np.ndarray:
    p = self.ll.llama_get_logits_ith(ctx, i)
    return np.ctypeslib.as_array(p, shape=(n_vocab,)).copy()

  def logits(self, gguf, npz, out):
    """[b, width, vocab] logits, each prompt decoded alone with logits at every position,
    placed at its real (right-aligned) positions; padding positions are zero."""
    z = np.load(npz)
    width = z["tokens"].shape[1]
    rows = self._rows(npz)
    n_vocab = self._vocab(gguf)
    res = np.zeros((len(rows), width, n_vocab), np.float32)
    longest = max(map(len, rows))
    for r, row in enumerate(rows):
      ctx = self.context(gguf, longest, longest, 1)
      batch = self.ll.llama_batch_init(longest, 0, 1)
      try:
        self._fill(batch, [(t, j, 0, True) for j, t in enumerate(row)])
        self._decode(ctx, batch)
        for j in range(len(row)):
          res[r, width - len(row) + j] = self._logits(ctx, j, n_vocab)
      finally:
        self.ll.llama_batch_free(batch)
        self.ll.llama_free(ctx)
    np.savez(out, logits=res)
    return {"load_s": self.load_s[gguf], "shape": list(res.shape)}

  def _run(self, gguf, rows, new_tokens, pick):
    """Batched decode as llama.cpp's `batched` example does it: every prompt in one
    llama_decode (sequence i = row i), then one token per row per llama_decode, each drawn by
    `pick(ctx, index in batch)`. Returns (tokens per row, prefill seconds, total seconds)."""
    ll = self.ll
    b = len(rows)
    total = sum(map(len, rows))
    # One KV stream per sequence (kv_unified off, the default): each gets n_ctx / n_seq cells.
    ctx = self.context(gguf, b * (max(map(len, rows)) + new_tokens), max(total, b), b)
    batch = ll.llama_batch_init(max(total, b), 0, b)
    try:
      t0 = time.perf_counter()
      entries, last = [], []
      for s, row in enumerate(rows):
        entries += [(t, j, s, j == len(row) - 1) for j, t in enumerate(row)]
        last.append(len(entries) - 1)
      self._fill(batch, entries)
      self._decode(ctx, batch)
      t1 = time.perf_counter()
      made = [[] for _ in rows]
      for step in range(new_tokens):
        nxt = [pick(ctx, last[s]) for s in range(b)]
        for s, t in enumerate(nxt):
          made[s].append(int(t))
        if step == new_tokens - 1:
          break
        self._fill(batch, [(t, len(rows[s]) + step, s, True) for s, t in enumerate(nxt)])
        last = list(range(b))
        self._decode(ctx, batch)
      t2 = time.perf_counter()
    finally:
      ll.llama_batch_free(batch)
      ll.llama_free(ctx)
    return made, t1 - t0, t2 - t0

  def greedy(self, gguf, npz, new_tokens):
    n_vocab = self._vocab(gguf)
    made, _, _ = self._run(
      gguf, self._rows(npz), new_tokens, lambda ctx, i: int(self._logits(ctx, i, n_vocab).argmax())
    )
    return {"tokens": made}

  def generate(self, gguf, npz, new_tokens, reps, seed=0):
    """`reps` timed calls after one untimed (the model in memory, the pages touched); each
    samples at temperature 1 with llama.cpp's own sampler (a chain holding only `dist`: the
    softmax of the raw logits), from its own seed."""
    ll = self.ll
    rows = self._rows(npz)
    seconds, prefill, made = [], [], 0
    for r in range(reps + 1):
      chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
      ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed + r))
      try:
        out, pre, tot = self._run(
          gguf, rows, new_tokens, lambda ctx, i, c=chain: ll.llama_sampler_sample(c, ctx, i)
        )
      finally:
        ll.llama_sampler_free(chain)
      if r:  # the first call is the warm-up
        seconds.append(tot)
        prefill.append(pre)
        made = sum(map(len, out))
    return {"seconds": seconds, "prefill_s": prefill, "made": made, "load_s": self.load_s[gguf]}


def _serve() -> None:
  limit_cpus(CPUS)
  serve(_Worker)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  _serve()
