"""The PyTorch peer: Hugging Face `generate` and a forward + backward + AdamW step, timed in a
throwaway torch venv (never a project dependency).

The project side (`TorchPeer`) starts this file under the torch venv's python once and sends it
JSON requests over stdin, one per line; the worker (`serve`) answers one JSON line per request
on the real stdout (library chatter is redirected to stderr). One long-lived worker means the
model loads once, while each run still times the peer right next to our side. Arrays travel
as .npz files. This module imports no jax and no cooper_jax: the torch venv has neither.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

DEFAULT_TORCH_PYTHON = "/tmp/ref/bin/python"


# ------------------------------------------------------------------------ project side (client)
class WorkerClient:
  """A long-lived peer worker: `script --serve` under another venv's python, one JSON request
  per line on its stdin, one JSON answer per line on its stdout; arrays travel as .npz files.
  `call(op, **kw)` returns the answer as a dict. The torch and tunix peers both use it."""

  name = "peer"

  def __init__(self, python: str, script: str, env: dict, hint: str):
    if not os.path.exists(python):
      raise FileNotFoundError(f"{self.name} venv python {python} not found; {hint}")
    self.tmp = tempfile.TemporaryDirectory(prefix=f"bench_{self.name}_")
    self.proc = subprocess.Popen(
      [python, os.path.abspath(script), "--serve"],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      env=dict(os.environ, **env),
    )
    self._n = 0
    self.info = self.call("hello")

  def path(self, stem: str) -> str:
    self._n += 1
    return os.path.join(self.tmp.name, f"{stem}{self._n}.npz")

  def save_arrays(self, **arrays) -> str:
    path = self.path("in")
    np.savez(path, **arrays)
    return path

  def call(self, op: str, **kw) -> dict:
    self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.name} worker exited (code {self.proc.wait()}) during {op!r}")
    out = json.loads(line)
    if "error" in out:
      raise RuntimeError(f"{self.name} worker, {op}: {out['error']}")
    return out

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.close()
      self.proc.wait(timeout=60)
    self.tmp.cleanup()


class TorchPeer(WorkerClient):
  """The torch worker (this file under the torch venv's python)."""

  name = "torch"

  def __init__(self, python: str = DEFAULT_TORCH_PYTHON):
    super().__init__(
      python,
      __file__,
      dict(TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1"),
      "create it with `python3.11 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 "
      "transformers==5.24.0 safetensors`",
    )


# ------------------------------------------------------------------------ torch venv (worker)
class _Worker:
  def __init__(self):
    import torch  # pylint: disable=import-outside-toplevel

    self.torch = torch
    self.models: dict[tuple[str, str], object] = {}
    self.warm: set = set()

  def model(self, hf_dir: str, purpose: str):
    """One instance per (directory, purpose): the train step changes its model's weights, so
    generation keeps its own copy."""
    from transformers import AutoModelForCausalLM  # pylint: disable=import-outside-toplevel

    key = (hf_dir, purpose)
    if key not in self.models:
      m = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=self.torch.float32)
      m.train(purpose == "train")
      self.models[key] = m
    return self.models[key]

  def hello(self):
    import transformers  # pylint: disable=import-outside-toplevel

    t = self.torch
    return {
      "torch": t.__version__,
      "transformers": transformers.__version__,
      "threads": t.get_num_threads(),
    }

  def generate(self, hf_dir, npz, new_tokens, reps, seed=0):
    t = self.torch
    z = np.load(npz)
    tokens = t.from_numpy(z["tokens"].astype(np.int64))
    mask = t.from_numpy(z["mask"].astype(np.int64))
    pad_id = int(z["pad_id"])
    model = self.model(hf_dir, "generate")

    def gen(n, s):
      t.manual_seed(s)
      with t.inference_mode():
        # min_new_tokens = max_new_tokens masks EOS until the end: every row makes n tokens,
        # as our side does with eos_ids=().
        return model.generate(
          tokens,
          attention_mask=mask,
          do_sample=True,
          temperature=1.0,
          top_p=1.0,
          top_k=0,
          min_new_tokens=n,
          max_new_tokens=n,
          pad_token_id=pad_id,
        )

    shape = ("generate", hf_dir, tuple(tokens.shape))
    if shape not in self.warm:  # first call of a shape pays one-off allocations
      gen(min(new_tokens, 8), seed)
      self.warm.add(shape)
    seconds, produced = [], None
    for r in range(reps):
      t0 = time.perf_counter()
      out = gen(new_tokens, seed + 1 + r)
      seconds.append(time.perf_counter() - t0)
      produced = int(out.shape[1] - tokens.shape[1])
    return {"seconds": seconds, "new_tokens": produced, "batch": int(tokens.shape[0])}

  def matmul(self, n, reps):
    """Seconds of an n-cube float32 matmul, `reps` times after a warm-up call."""
    t = self.torch
    a, b = t.randn(n, n), t.randn(n, n)
    a @ b
    seconds = []
    for _ in range(reps):
      t0 = time.perf_counter()
      a @ b
      seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "n": n}

  def train_step(self, hf_dir, npz, prompt_len, reps, lr=1e-6, weight_decay=0.01, clip=1.0):
    """GRPO's on-policy gradient (ratio 1): -mean(advantage x log p(response token)) over the
    response positions, the LM head applied only there, as the project's policy step does;
    then gradient clipping and AdamW with the project's defaults."""
    t = self.torch
    z = np.load(npz)
    tokens = t.from_numpy(z["tokens"].astype(np.int64))
    adv = t.from_numpy(z["advantages"].astype(np.float32))
    p = int(prompt_len)
    model = self.model(hf_dir, "train")
    key = ("opt", hf_dir)
    if key not in self.models:
      self.models[key] = t.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay
      )
    opt = self.models[key]
    resp = tokens[:, p:]

    def step():
      h = model.model(input_ids=tokens).last_hidden_state[:, p - 1 : -1]
      logp = t.log_softmax(model.lm_head(h).float(), dim=-1)
      logp = logp.gather(-1, resp[..., None])[..., 0]
      loss = -(adv[:, None] * logp).mean()
      opt.zero_grad(set_to_none=True)
      loss.backward()
      t.nn.utils.clip_grad_norm_(model.parameters(), clip)
      opt.step()
      return float(loss.detach())

    shape = ("train", hf_dir, tuple(tokens.shape))
    if shape not in self.warm:
      step()
      self.warm.add(shape)
    seconds, losses = [], []
    for _ in range(reps):
      t0 = time.perf_counter()
      losses.append(step())
      seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "tokens": int(tokens.numel()), "losses": losses}


def rule_reward_fn(verify_py: str):
  """(reward, status) for a peer worker: `reward(prompts, completions, answer, **_)` scores each
  completion against its reference answer with our own rule verdict (`verify_one` of
  cooper_jax/rewards/verify.py, loaded by path: stdlib + math-verify, no package, no jax) as
  1.0 / 0.0; an exception scores 0 and is counted in `status` with the verdicts."""
  import importlib.util  # pylint: disable=import-outside-toplevel

  spec = importlib.util.spec_from_file_location("_cooper_rule_verify", verify_py)
  verify = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = verify  # its dataclasses look their module up there
  spec.loader.exec_module(verify)
  status: dict[str, int] = {}

  def rule_reward(prompts, completions, answer, **_):
    out = []
    for text, ref in zip(completions, answer):
      try:
        st, ok, _ = verify.verify_one(str(text), str(ref))
      except Exception:  # noqa: BLE001 - counted and reported, as our verifier does
        st, ok = "error", False
      status[st] = status.get(st, 0) + 1
      out.append(float(ok))
    return out

  return rule_reward, status


def serve(make_worker=None) -> None:
  """The worker loop of a peer (WorkerClient's other end): `make_worker()` (default this file's
  torch worker) answers each request line's op with its method of that name."""
  proto = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)  # whatever the libraries print goes to stderr, not into the protocol
  sys.stdout = sys.stderr
  worker = (make_worker or _Worker)()
  for line in sys.stdin:
    req = json.loads(line)
    op = req.pop("op")
    try:
      out = getattr(worker, op)(**req)
    except Exception as e:  # noqa: BLE001 - reported to the client, which raises
      out = {"error": f"{type(e).__name__}: {e}"}
    proto.write(json.dumps(out) + "\n")
    proto.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  serve()
