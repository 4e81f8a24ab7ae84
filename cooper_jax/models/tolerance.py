"""How far two float32 implementations of one decoder may put a logit apart.

Parity checks (tests/test_parity.py, tests/test_llama3_rope.py,
tools/fixtures/check_export_with_transformers.py) compare our logits with transformers' on the same
weights and ids. The two differ only in summation order (XLA's kernels vs PyTorch's, and
those depend on the CPU: AVX-512 or AVX2 blocking), so the tolerance is derived from float32
error analysis, not from one machine's rounding. The same bounds hold two computations of our
own apart (padding, attention chunks, caches, mesh layouts: tests/test_model.py and others).
"""

from __future__ import annotations

import math

import numpy as np

from cooper_jax.models.config import ModelConfig

UNIT_ROUNDOFF = 2.0**-24  # float32


def float32_logit_atol(cfg: ModelConfig, logit_scale: float, max_position: int) -> float:
  """The tolerance on |logit difference| between two float32 forwards of `cfg` whose logits
  reach `logit_scale` in magnitude, at positions up to `max_position`.

  Two sources, as relative errors of the residual stream, each side its own:
  - matmuls: one with contraction length K rounds its output by about sqrt(K) u (the
    random-walk model of rounding errors: Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019;
    the worst case, K u, is far looser at these sizes); each layer adds two such results
    (attention output over n_heads * head_dim, MLP down projection over d_ff) and the LM
    head contracts d_model;
  - RoPE: an angle pos * inv_freq carries ~pos u of absolute rounding (the product, a 1-ulp
    different inv_freq, the sine and cosine), which rotates q and k: ~2 pos u relative per
    layer.
  Independent errors add in quadrature: 2 u sqrt(sum K + n_layers (2 max_position)^2) times
  logit_scale. Measured against it (float32 both sides, transformers on torch): SmolLM2-135M,
  112 positions, logits to ~35: bound 5.2e-3, difference 2.4e-4 on an AVX2 EPYC (below the
  old hand-set 2e-4 on AVX-512 ones); the 2-layer Llama-3 fixture, 300 positions, logits to
  9.1: bound 9e-4, difference 7.8e-5 (AVX2). What the parity tests must catch is far larger:
  a wrong RoPE base moves SmolLM2's logits by ~4, the Llama-3 fixture's rope scaling by 11, a
  pad-mask error by O(1).
  """
  return float32_forward_rtol(cfg, max_position) * float(logit_scale)


def _head_bound(rows, final_norm_scale) -> float:
  """max_i ||rows_i|| sqrt(d) max|scale|: an output w_i . h of a head whose input h is the final
  RMSNorm's output (||x / rms(x)|| = sqrt(d), so ||h|| <= sqrt(d) max|scale|) is at most
  that in magnitude, and each of its terms' sum of magnitudes is too."""
  w = np.asarray(rows, np.float64)
  g = np.asarray(final_norm_scale, np.float64)
  return float(np.linalg.norm(w, axis=-1).max() * math.sqrt(g.size) * np.abs(g).max())


def score_scale(params) -> float:
  """The scale a score head's rounding is relative to: its terms w_i h_i sum to at most
  ||w|| ||h||, and the final RMSNorm gives ||h|| <= sqrt(d_model) max|scale| (the score itself
  may be near 0 by cancellation). params: a score model's tree (its "score" kernel [d, 1] and
  "final_norm" scale [d] are read; host or device arrays)."""
  return _head_bound(np.asarray(params["score"]["kernel"]).T, params["final_norm"]["scale"])


def logit_scale(params) -> float:
  """A bound on |logit| from a causal LM's parameters alone, where no forward on the compared
  inputs is at hand (two whole training runs: tests/run_bounds.py): a logit is e_v . h with
  e_v the head's row for token v (the tied embedding's row, or lm_head's column), so
  max_v ||e_v|| sqrt(d_model) max|final norm scale|. Looser than a forward's largest logit
  (rows and h need not align), never smaller."""
  rows = params["lm_head"]["kernel"].T if "lm_head" in params else params["embed"]["embedding"]
  return _head_bound(rows, params["final_norm"]["scale"])


def float32_forward_rtol(cfg: ModelConfig, max_position: int) -> float:
  """The relative error of one float32 forward's outputs (the residual stream's, as above):
  2 u sqrt(sum of contraction lengths + n_layers (2 max_position)^2). A backward pass runs the
  transposed contractions of the same lengths, so a gradient carries about twice as many
  rounding steps; compare gradients at 2x this, relative to the gradient's norm."""
  k_total = cfg.n_layers * (cfg.n_heads * cfg.head_dim + cfg.d_ff) + cfg.d_model
  rope = cfg.n_layers * (2 * max_position) ** 2
  return 2 * UNIT_ROUNDOFF * math.sqrt(k_total + rope)


def float32_logprob_atol(cfg: ModelConfig, logit_scale: float, max_position: int) -> float:
  """The tolerance on |log-prob difference| between two float32 forwards of `cfg`, each
  followed by log_softmax. log_softmax(z)_i = z_i - logsumexp(z): a logit error d moves z_i by
  d and the logsumexp by at most d (it is 1-Lipschitz in the max norm), so 2 d; the logsumexp's
  own rounding, each side: its max term (logit_scale u), the sum of vocab_size exponentials
  (sqrt(vocab_size) u relative, random walk) and the log, about u (logit_scale +
  sqrt(vocab_size)) each, 2x that for the two sides."""
  d = float32_logit_atol(cfg, logit_scale, max_position)
  own = 2 * UNIT_ROUNDOFF * (float(logit_scale) + math.sqrt(cfg.vocab_size))
  return 2 * d + own


def float32_gradient_roundoff(cfg: ModelConfig, rows: int, seq: int) -> float:
  """The worst-case rounding difference of a gradient entry between two summation orders of
  one loss over `rows` x `seq` tokens, as a fraction of the gradient's largest entry:
  gamma_m = m u / (1 - m u) ~ m u (Higham, Accuracy and Stability of Numerical Algorithms,
  Lemma 3.1), m the additions along the entry's longest path: each layer's contractions forward
  (q, k, v and output projections over d_model, scores over head_dim, values over the sequence,
  the MLP over d_model then d_ff), the same backward, the head, and the sum over the batch's
  rows x seq tokens. Worst case, not random walk: the gradients of two layouts (sharded vs one
  device, micro-batched vs one shot) are compared entry by entry."""
  per_layer = 5 * cfg.d_model + cfg.head_dim + seq + cfg.d_ff
  m = 2 * (cfg.n_layers * per_layer + cfg.d_model) + rows * seq
  return m * UNIT_ROUNDOFF
