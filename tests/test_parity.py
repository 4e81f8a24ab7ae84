"""Parity of the JAX model and sampler with Hugging Face transformers on real SmolLM2 weights.

The reference (tests/fixtures/smollm2_hf_logits.npz) comes from tools/fixtures/make_hf_fixture.py:
transformers + torch float32 on the same embedded GGUF, each prompt run unpadded. Here the four
prompts run as ONE left-padded batch, so the test also covers pad masking and RoPE positions.

    python tests/test_parity.py [fixture.npz]   # prints the differences without pytest
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import prompts
from cooper_jax.models.tolerance import float32_logit_atol

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_hf_logits.npz"
PAD_ID = 2
PAD_TO_MULTIPLE = 16  # every row, the longest included, gets some left padding


def load_fixture(path=FIXTURE) -> dict:
  with np.load(path) as z:
    n = sum(1 for k in z.files if k.startswith("tokens_"))
    per = lambda key: [z[f"{key}_{i}"] for i in range(n)]
    return {
      "tokens": per("tokens"),
      "sub_logits": per("sub_logits"),
      "top_ids": per("top_ids"),
      "top_logits": per("top_logits"),
      "last_logits": per("last_logits"),
      "greedy": per("greedy"),
      "subset_ids": z["subset_ids"],
      "eos_ids": tuple(int(i) for i in z["eos_ids"]),
      "n_new": int(z["n_new"]),
      "meta": json.loads(str(z["meta_json"])),
    }


def left_pad(rows, pad_id=PAD_ID, multiple=PAD_TO_MULTIPLE):
  # Every row, the longest included, gets at least one pad in front.
  t = -(-(max(len(r) for r in rows) + 1) // multiple) * multiple
  tokens, mask, _ = prompts.left_pad(rows, pad_id, pad_to_multiple=t)
  return tokens, mask


def load_model():
  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  return load_pretrained("smollm2-135m-instruct")


def logit_atol(cfg, fx) -> float:
  """The float32 tolerance (cooper_jax.models.tolerance) at the fixture's largest |logit|."""
  scale = max(
    float(np.max(np.abs(x))) for key in ("sub_logits", "top_logits", "last_logits") for x in fx[key]
  )
  return float32_logit_atol(cfg, scale, max_position=max(len(t) for t in fx["tokens"]))


def logit_diffs(fx, logits_btv, mask_bt) -> dict[str, float]:
  """Max abs differences at real positions: subset ids, HF's top ids, full last position."""
  out = {"subset": 0.0, "top": 0.0, "last": 0.0}
  for i in range(len(fx["tokens"])):
    real_tv = logits_btv[i, mask_bt[i]]
    assert real_tv.shape[0] == len(fx["tokens"][i])
    out["subset"] = max(
      out["subset"], float(np.max(np.abs(real_tv[:, fx["subset_ids"]] - fx["sub_logits"][i])))
    )
    out["top"] = max(
      out["top"],
      float(
        np.max(np.abs(np.take_along_axis(real_tv, fx["top_ids"][i], axis=-1) - fx["top_logits"][i]))
      ),
    )
    out["last"] = max(out["last"], float(np.max(np.abs(real_tv[-1] - fx["last_logits"][i]))))
  return out


def run_greedy(cfg, params, fx, tokens, mask):
  from cooper_jax.sampling import SampleOptions, sample  # pylint: disable=import-outside-toplevel

  out = sample(
    params,
    jnp.asarray(tokens),
    jnp.asarray(mask),
    jax.random.PRNGKey(0),
    cfg=cfg,
    options=SampleOptions(
      max_new_tokens=fx["n_new"], temperature=0.0, eos_ids=fx["eos_ids"], pad_id=PAD_ID
    ),
  )
  toks, m = np.asarray(out.tokens), np.asarray(out.mask)
  return [toks[i][m[i]] for i in range(len(toks))]


# ------------------------------------------------------------------------------------ pytest
@pytest.fixture(scope="module")
def fx():
  if not FIXTURE.exists():
    pytest.skip(f"{FIXTURE} missing; run tools/fixtures/make_hf_fixture.py")
  return load_fixture()


@pytest.fixture(scope="module")
def model():
  try:
    return load_model()
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="module")
def batch(fx):
  return left_pad(fx["tokens"])


def test_fixture_is_self_consistent(fx):
  assert len(fx["tokens"]) == 4
  assert len({len(t) for t in fx["tokens"]}) == 4, "prompts should differ in length"
  for i, t in enumerate(fx["tokens"]):
    assert fx["sub_logits"][i].shape == (len(t), len(fx["subset_ids"]))
    assert fx["top_ids"][i].shape == fx["top_logits"][i].shape == (len(t), 8)
    np.testing.assert_array_equal(fx["last_logits"][i][fx["subset_ids"]], fx["sub_logits"][i][-1])
    g = fx["greedy"][i]
    assert 0 < len(g) <= fx["n_new"]
    assert len(g) == fx["n_new"] or g[-1] in fx["eos_ids"]


def test_logits_match_hf(model, fx, batch):
  from cooper_jax.models.transformer import forward  # pylint: disable=import-outside-toplevel

  cfg, params = model
  tokens, mask = batch
  logits = np.asarray(jax.jit(forward, static_argnums=0)(cfg, params, tokens, mask))
  assert logits.shape == (*tokens.shape, cfg.vocab_size)
  assert np.isfinite(logits[mask]).all()
  d = logit_diffs(fx, logits, mask)
  atol = logit_atol(cfg, fx)
  print(
    f"\nparity vs HF {fx['meta']['versions']['transformers']} (batch {tokens.shape}, left "
    f"padded): max |dlogit| subset {d['subset']:.3e}, top-8 {d['top']:.3e}, "
    f"last-position full vocab {d['last']:.3e} (bound {atol:.2e})"
  )
  assert max(d.values()) < atol, d


def test_greedy_matches_hf(model, fx, batch):
  cfg, params = model
  tokens, mask = batch
  ours = run_greedy(cfg, params, fx, tokens, mask)
  for i, (got, want) in enumerate(zip(ours, fx["greedy"])):
    print(f"\nprompt {i}: HF {len(want)} greedy tokens, ours {len(got)}")
    np.testing.assert_array_equal(got, want, err_msg=f"prompt {i}: greedy tokens differ from HF")


# --------------------------------------------------------------------------- script entry point
def main(path=FIXTURE) -> None:
  from cooper_jax.models.transformer import forward  # pylint: disable=import-outside-toplevel

  data = load_fixture(path)
  cfg, params = load_model()
  tokens, mask = left_pad(data["tokens"])
  logits = np.asarray(jax.jit(forward, static_argnums=0)(cfg, params, tokens, mask))
  d = logit_diffs(data, logits, mask)
  print(
    f"JAX vs HF max |dlogit| (left-padded batch {tokens.shape}): "
    + ", ".join(f"{k} {v:.3e}" for k, v in d.items())
    + f"  (bound {logit_atol(cfg, data):.2e})"
  )
  ours = run_greedy(cfg, params, data, tokens, mask)
  for i, (got, want) in enumerate(zip(ours, data["greedy"])):
    same = len(got) == len(want) and bool(np.all(got == want))
    print(f"greedy prompt {i}: {'MATCH' if same else 'DIFFER'} ({len(want)} HF tokens)")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else FIXTURE)
