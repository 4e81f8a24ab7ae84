"""HF checkpoint directories and GGUF rows in and out, checked against hand-written checkpoints.

The tiny checkpoints here are written WITHOUT the code under test: config.json dicts as
transformers writes them, tensors under HF names in HF's [out, in] layout, saved with
safetensors.numpy. The layout is then checked numerically by a numpy reference forward pass
written from Hugging Face's modelling code (rotate-half RoPE, GQA, SwiGLU) on those arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from cooper_jax.models.tolerance import float32_logit_atol, score_scale
from cooper_jax.models.transformer import forward
from cooper_jax.weights import load_hf_dir, load_pretrained, save_hf_dir
from cooper_jax.weights.gguf_io import load_gguf, unpermute_rope_rows

VOCAB, D, LAYERS, N_HEADS, N_KV, D_FF = 64, 32, 2, 4, 2, 48

# As transformers 4.4x writes them (LlamaConfig / Qwen2Config .to_json_file()).
LLAMA_TIED = {
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": False,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "head_dim": 16,  # != hidden_size / heads on purpose
  "hidden_act": "silu",
  "hidden_size": D,
  "initializer_range": 0.02,
  "intermediate_size": D_FF,
  "max_position_embeddings": 128,
  "mlp_bias": False,
  "model_type": "llama",
  "num_attention_heads": N_HEADS,
  "num_hidden_layers": LAYERS,
  "num_key_value_heads": N_KV,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": None,
  "rope_theta": 10000.0,
  "tie_word_embeddings": True,
  "torch_dtype": "float32",
  "transformers_version": "4.46.3",
  "use_cache": True,
  "vocab_size": VOCAB,
}
QWEN2_LM = {
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": [2, 3],
  "hidden_act": "silu",
  "hidden_size": D,
  "initializer_range": 0.02,
  "intermediate_size": D_FF,
  "max_position_embeddings": 256,
  "max_window_layers": LAYERS,
  "model_type": "qwen2",
  "num_attention_heads": N_HEADS,
  "num_hidden_layers": LAYERS,
  "num_key_value_heads": N_KV,
  "rms_norm_eps": 1e-06,
  "rope_scaling": None,
  "rope_theta": 1000000.0,
  "sliding_window": None,
  "tie_word_embeddings": False,
  "torch_dtype": "float32",
  "transformers_version": "4.46.3",
  "use_cache": True,
  "use_sliding_window": False,
  "vocab_size": VOCAB,
}
# transformers 5 style: rope_parameters, dtype; a reward model with one label.
QWEN2_SCORE = {
  "architectures": ["Qwen2ForSequenceClassification"],
  "attention_dropout": 0.0,
  "bos_token_id": None,
  "dtype": "float32",
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": D,
  "id2label": {"0": "LABEL_0"},
  "initializer_range": 0.02,
  "intermediate_size": D_FF,
  "label2id": {"LABEL_0": 0},
  "max_position_embeddings": 256,
  "model_type": "qwen2",
  "num_attention_heads": N_HEADS,
  "num_hidden_layers": LAYERS,
  "num_key_value_heads": N_KV,
  "num_labels": 1,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "tie_word_embeddings": False,
  "transformers_version": "5.0.0",
  "use_cache": True,
  "use_sliding_window": False,
  "vocab_size": VOCAB,
}


def hf_tensors(hf: dict, seed: int) -> dict[str, np.ndarray]:
  """Random float32 tensors under HF names, Linear weights [out, in]."""
  rng = np.random.default_rng(seed)
  d, f, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
  h, k = hf["num_attention_heads"], hf["num_key_value_heads"]
  e = hf.get("head_dim") or d // h
  w = lambda *shape: rng.normal(0.0, 0.2, shape).astype(np.float32)
  norm = lambda: (1.0 + rng.normal(0.0, 0.1, (d,))).astype(np.float32)
  t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": norm()}
  for i in range(hf["num_hidden_layers"]):
    p = f"model.layers.{i}."
    t[p + "input_layernorm.weight"] = norm()
    t[p + "post_attention_layernorm.weight"] = norm()
    t[p + "self_attn.q_proj.weight"] = w(h * e, d)
    t[p + "self_attn.k_proj.weight"] = w(k * e, d)
    t[p + "self_attn.v_proj.weight"] = w(k * e, d)
    t[p + "self_attn.o_proj.weight"] = w(d, h * e)
    if hf["model_type"] == "qwen2":
      t[p + "self_attn.q_proj.bias"] = w(h * e)
      t[p + "self_attn.k_proj.bias"] = w(k * e)
      t[p + "self_attn.v_proj.bias"] = w(k * e)
    t[p + "mlp.gate_proj.weight"] = w(f, d)
    t[p + "mlp.up_proj.weight"] = w(f, d)
    t[p + "mlp.down_proj.weight"] = w(d, f)
  arch = hf["architectures"][0]
  if arch.endswith("ForSequenceClassification"):
    t["score.weight"] = w(1, d)
  elif not hf.get("tie_word_embeddings", False):
    t["lm_head.weight"] = w(v, d)
  return t


def write_ckpt(path: Path, hf: dict, tensors: dict[str, np.ndarray], shards: int = 1) -> Path:
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps(hf, indent=2))
  if shards == 1:
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
  names = sorted(tensors)
  weight_map = {}
  for s in range(shards):
    fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = {n: tensors[n] for n in names[s::shards]}
    save_file(part, str(path / fname), metadata={"format": "pt"})
    weight_map.update({n: fname for n in part})
  index = {
    "metadata": {"total_size": int(sum(a.nbytes for a in tensors.values()))},
    "weight_map": weight_map,
  }
  (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
  return path


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
  with safe_open(str(path), framework="numpy") as f:
    return {n: f.get_tensor(n) for n in f.keys()}


def assert_tree_equal(a, b):
  la, ta = jax.tree_util.tree_flatten_with_path(a)
  lb, tb = jax.tree_util.tree_flatten_with_path(b)
  assert ta == tb, f"tree structures differ:\n{ta}\n{tb}"
  for (path, x), (_, y) in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, (path, x.dtype, y.dtype, x.shape, y.shape)
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


CASES = {"llama_tied": (LLAMA_TIED, 0), "qwen2_lm": (QWEN2_LM, 1), "qwen2_score": (QWEN2_SCORE, 2)}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  """name -> (dir, hf config, hand-written tensors)."""
  root = tmp_path_factory.mktemp("ckpts")
  out = {}
  for name, (hf, seed) in CASES.items():
    t = hf_tensors(hf, seed)
    out[name] = (write_ckpt(root / name, hf, t), hf, t)
  return out


# ------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_is_byte_identical(ckpts, tmp_path, name):
  src, hf, tensors = ckpts[name]
  cfg, params = load_hf_dir(src)
  assert cfg.head == ("score" if name == "qwen2_score" else "lm")
  assert cfg.tie_embeddings == (name == "llama_tied")
  assert cfg.qkv_bias == (hf["model_type"] == "qwen2")
  out = save_hf_dir(cfg, params, tmp_path / "export")
  exported = read_safetensors(out / "model.safetensors")
  assert set(exported) == set(tensors)
  for n, want in tensors.items():
    got = exported[n]
    assert got.dtype == np.float32 and got.shape == want.shape, (n, got.dtype, got.shape)
    assert got.tobytes() == want.tobytes(), f"{n}: exported bytes differ"
  hf_out = json.loads((out / "config.json").read_text())
  assert hf_out["architectures"] == hf["architectures"]
  assert hf_out["model_type"] == hf["model_type"]
  assert hf_out["tie_word_embeddings"] == hf["tie_word_embeddings"]
  cfg2, params2 = load_hf_dir(out)
  assert cfg2 == cfg
  assert_tree_equal(params2, params)
  assert not list(tmp_path.glob(".export.*")), "temporary export directory left behind"


@pytest.mark.parametrize("name", ["llama_tied", "qwen2_score"])
def test_bf16_export(ckpts, tmp_path, name):
  src, hf, tensors = ckpts[name]
  cfg, params = load_hf_dir(src)
  out = save_hf_dir(cfg, params, tmp_path / "bf16", dtype="bfloat16")
  exported = read_safetensors(out / "model.safetensors")
  assert set(exported) == set(tensors)
  for n, want in tensors.items():
    assert exported[n].dtype == ml_dtypes.bfloat16, (n, exported[n].dtype)
    np.testing.assert_array_equal(exported[n], want.astype(ml_dtypes.bfloat16), err_msg=n)
  hf_out = json.loads((out / "config.json").read_text())
  assert hf_out["architectures"] == hf["architectures"]
  assert hf_out["model_type"] == hf["model_type"]
  assert hf_out["torch_dtype"] == "bfloat16"
  # Loads back (as float32 by default, or as bf16 parameters on request).
  _, p32 = load_hf_dir(out)
  _, p16 = load_hf_dir(out, param_dtype="bfloat16")
  for a, b, c in zip(jax.tree.leaves(p32), jax.tree.leaves(p16), jax.tree.leaves(params)):
    assert a.dtype == np.float32 and b.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(a, np.asarray(c).astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(b).astype(np.float32), a)


def test_export_replaces_existing_dir(ckpts, tmp_path):
  src, _, _ = ckpts["qwen2_lm"]
  cfg, params = load_hf_dir(src)
  out = tmp_path / "export"
  out.mkdir()
  (out / "stale.safetensors").write_bytes(b"old")
  save_hf_dir(cfg, params, out)
  # the stale file is gone; an LM head also gets the generation config `generate` reads
  names = sorted(p.name for p in out.iterdir())
  assert names == ["config.json", "generation_config.json", "model.safetensors"]


@pytest.mark.parametrize("name", ["qwen2_lm", "qwen2_score"])
def test_sharded_index_loads_same_params(ckpts, tmp_path, name):
  src, hf, tensors = ckpts[name]
  sharded = write_ckpt(tmp_path / "sharded", hf, tensors, shards=2)
  assert len(list(sharded.glob("*.safetensors"))) == 2
  assert not (sharded / "model.safetensors").exists()
  cfg1, p1 = load_hf_dir(src)
  cfg2, p2 = load_hf_dir(sharded)
  assert cfg1 == cfg2
  assert_tree_equal(p2, p1)


# ---------------------------------------------------------------------------- bad checkpoints
def test_missing_tensor_is_named(ckpts, tmp_path):
  _, hf, tensors = ckpts["qwen2_lm"]
  bad = dict(tensors)
  del bad["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as e:
    load_hf_dir(write_ckpt(tmp_path / "missing", hf, bad))
  assert "missing" in str(e.value)


def test_wrong_shape_is_named_with_both_shapes(ckpts, tmp_path):
  _, hf, tensors = ckpts["qwen2_lm"]
  bad = dict(tensors)
  name = "model.layers.0.mlp.gate_proj.weight"
  bad[name] = np.ascontiguousarray(tensors[name].T)  # [in, out]: the classic layout slip
  with pytest.raises(ValueError) as e:
    load_hf_dir(write_ckpt(tmp_path / "shape", hf, bad))
  msg = str(e.value)
  assert name in msg and str((D, D_FF)) in msg and str((D_FF, D)) in msg, msg


def test_unexpected_tensor_is_reported(ckpts, tmp_path):
  _, hf, tensors = ckpts["llama_tied"]
  extra = dict(
    tensors, **{"model.layers.0.self_attn.extra_proj.weight": np.zeros((4, 4), np.float32)}
  )
  with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.extra_proj\.weight"):
    load_hf_dir(write_ckpt(tmp_path / "extra", hf, extra))


def test_tied_checkpoint_may_also_store_lm_head(ckpts, tmp_path):
  # Some exporters write lm_head.weight even when tied; it is the embedding and is ignored.
  src, hf, tensors = ckpts["llama_tied"]
  both = dict(tensors, **{"lm_head.weight": tensors["model.embed_tokens.weight"].copy()})
  _, p1 = load_hf_dir(src)
  _, p2 = load_hf_dir(write_ckpt(tmp_path / "tied_with_head", hf, both))
  assert_tree_equal(p2, p1)


def test_unsupported_configs_are_refused(ckpts, tmp_path):
  _, hf, tensors = ckpts["llama_tied"]
  for i, (key, value, pattern) in enumerate(
    [
      ("model_type", "mistral", "model_type"),
      ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope scaling"),
      ("attention_bias", True, "attention_bias"),
    ]
  ):
    with pytest.raises(ValueError, match=pattern):
      load_hf_dir(write_ckpt(tmp_path / f"bad{i}", dict(hf, **{key: value}), tensors))
  two_labels = dict(QWEN2_SCORE, id2label={"0": "A", "1": "B"}, label2id={"A": 0, "B": 1})
  del two_labels["num_labels"]
  with pytest.raises(ValueError, match="num_labels"):
    load_hf_dir(write_ckpt(tmp_path / "labels", two_labels, ckpts["qwen2_score"][2]))


# ------------------------------------------------------------------------ fresh score heads
@pytest.mark.parametrize("name", ["llama_tied", "qwen2_lm"])
def test_score_head_on_causal_lm(ckpts, tmp_path, name):
  src, hf, tensors = ckpts[name]
  cfg_lm, p_lm = load_hf_dir(src)
  cfg, params = load_hf_dir(src, head="score")
  assert cfg.head == "score"
  assert params["score"]["kernel"].shape == (D, 1)
  assert not np.any(np.asarray(params["score"]["kernel"]))
  assert "lm_head" not in params
  backbone = {k: v for k, v in p_lm.items() if k != "lm_head"}
  assert_tree_equal({k: v for k, v in params.items() if k != "score"}, backbone)
  tokens = np.arange(1, 9, dtype=np.int32).reshape(2, 4)
  scores = np.asarray(forward(cfg, params, tokens, np.ones_like(tokens, bool)))
  np.testing.assert_array_equal(scores, np.zeros(2, np.float32))
  # It exports as a sequence classifier: backbone + score, no lm_head.
  out = save_hf_dir(cfg, params, tmp_path / "rm")
  exported = read_safetensors(out / "model.safetensors")
  want = {n for n in tensors if n != "lm_head.weight"} | {"score.weight"}
  assert set(exported) == want
  hf_out = json.loads((out / "config.json").read_text())
  assert hf_out["architectures"] == [
    hf["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")
  ]
  assert hf_out["num_labels"] == 1
  cfg2, p2 = load_hf_dir(out)
  assert cfg2.head == "score"
  assert_tree_equal(p2, params)


# ------------------------------------------------------------- independent numerical check
def _rms_norm(x, w, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x):
  x1, x2 = np.split(x, 2, axis=-1)
  return np.concatenate([-x2, x1], axis=-1)


def reference_forward(hf: dict, t: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
  """HF's Llama/Qwen2 forward in float64 numpy on one unpadded row: [T] -> logits [T, V]
  (or the score [T, 1] at every position for a sequence classifier)."""
  t = {n: a.astype(np.float64) for n, a in t.items()}
  d, h, k = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
  e = hf.get("head_dim") or d // h
  eps = hf["rms_norm_eps"]
  theta = hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"]
  n = len(tokens)
  # LlamaRotaryEmbedding: inv_freq over even dims, emb = cat(freqs, freqs).
  inv_freq = 1.0 / (theta ** (np.arange(0, e, 2, dtype=np.float64) / e))
  freqs = np.outer(np.arange(n, dtype=np.float64), inv_freq)
  emb = np.concatenate([freqs, freqs], axis=-1)
  cos, sin = np.cos(emb)[None], np.sin(emb)[None]  # [1, T, e]
  causal = np.tril(np.ones((n, n), bool))

  x = t["model.embed_tokens.weight"][tokens]  # [T, d]
  for i in range(hf["num_hidden_layers"]):
    p = f"model.layers.{i}."
    y = _rms_norm(x, t[p + "input_layernorm.weight"], eps)

    def proj(name, heads, y=y, p=p):
      out = y @ t[p + f"self_attn.{name}_proj.weight"].T
      if p + f"self_attn.{name}_proj.bias" in t:
        out = out + t[p + f"self_attn.{name}_proj.bias"]
      return out.reshape(n, heads, e).transpose(1, 0, 2)  # [heads, T, e]

    q, kk, v = proj("q", h), proj("k", k), proj("v", k)
    q = q * cos + _rotate_half(q) * sin
    kk = kk * cos + _rotate_half(kk) * sin
    kk, v = np.repeat(kk, h // k, axis=0), np.repeat(v, h // k, axis=0)  # repeat_kv
    s = q @ kk.transpose(0, 2, 1) / np.sqrt(e)
    s = np.where(causal[None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = (s / s.sum(-1, keepdims=True)) @ v  # [h, T, e]
    x = x + a.transpose(1, 0, 2).reshape(n, h * e) @ t[p + "self_attn.o_proj.weight"].T
    y = _rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
    gate = y @ t[p + "mlp.gate_proj.weight"].T
    up = y @ t[p + "mlp.up_proj.weight"].T
    x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
  x = _rms_norm(x, t["model.norm.weight"], eps)
  if "score.weight" in t:
    return x @ t["score.weight"].T
  head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
  return x @ head.T


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_numpy_reference(ckpts, name):
  src, hf, tensors = ckpts[name]
  cfg, params = load_hf_dir(src)
  rng = np.random.default_rng(7)
  rows = [rng.integers(1, VOCAB, size=n).astype(np.int32) for n in (11, 7)]
  # One left-padded batch: also covers pad masking and per-row RoPE positions.
  width = 12
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r) :] = r
    mask[i, width - len(r) :] = True
  out = np.asarray(forward(cfg, params, tokens, mask))
  for i, r in enumerate(rows):
    ref = reference_forward(hf, tensors, r)
    # Our float32 forward against a float64 one: the float32 bound (tolerance.py) holds.
    if cfg.head == "score":
      # HF's sequence classifier reads the last non-pad token.
      atol = float32_logit_atol(cfg, score_scale(params), width)
      np.testing.assert_allclose(out[i], ref[-1, 0], atol=atol, rtol=0)
    else:
      assert np.abs(ref).max() > 1.0  # not a trivially small signal
      atol = float32_logit_atol(cfg, np.abs(ref).max(), width)
      np.testing.assert_allclose(out[i, mask[i]], ref, atol=atol, rtol=0)


# ------------------------------------------------------------------------------------- GGUF
def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half rows -> interleaved pairs)."""
  return (
    w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
  )


@pytest.mark.parametrize("n_heads", [9, 3])
def test_unpermute_inverts_llama_cpp_permute(n_heads):
  rng = np.random.default_rng(n_heads)
  w = rng.normal(size=(n_heads * 64, 5)).astype(np.float32)
  permuted = llama_cpp_permute(w, n_heads)
  assert not np.array_equal(permuted, w)
  np.testing.assert_array_equal(unpermute_rope_rows(permuted, n_heads), w)
  b = rng.normal(size=(n_heads * 64,)).astype(np.float32)  # 1-D rows too (biases)
  np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(b, n_heads), n_heads), b)


def _write_tiny_gguf(path, ckpts, extra_tensors=()):
  """The llama_tied checkpoint as a float32 GGUF written as llama.cpp does (names, permuted
  q/k), plus any (name, array) extras."""
  gguf = pytest.importorskip("gguf")
  _, hf, tensors = ckpts["llama_tied"]
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_context_length(hf["max_position_embeddings"])
  w.add_embedding_length(D)
  w.add_block_count(LAYERS)
  w.add_feed_forward_length(D_FF)
  w.add_head_count(N_HEADS)
  w.add_head_count_kv(N_KV)
  w.add_rope_dimension_count(hf["head_dim"])
  w.add_rope_freq_base(hf["rope_theta"])
  w.add_layer_norm_rms_eps(hf["rms_norm_eps"])
  w.add_vocab_size(VOCAB)
  w.add_bos_token_id(hf["bos_token_id"])
  w.add_eos_token_id(hf["eos_token_id"])
  names = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
  }
  w.add_tensor("token_embd.weight", tensors["model.embed_tokens.weight"])
  w.add_tensor("output_norm.weight", tensors["model.norm.weight"])
  for i in range(LAYERS):
    for suffix, gname in names.items():
      a = tensors[f"model.layers.{i}.{suffix}"]
      if suffix.startswith("self_attn.q_proj"):
        a = llama_cpp_permute(a, N_HEADS)
      elif suffix.startswith("self_attn.k_proj"):
        a = llama_cpp_permute(a, N_KV)
      w.add_tensor(f"blk.{i}.{gname}", np.ascontiguousarray(a))
  for name, a in extra_tensors:
    w.add_tensor(name, a)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_gguf_f32_loads_like_hf_dir(ckpts, tmp_path):
  """A float32 GGUF written as llama.cpp does (names, permuted q/k) gives the HF dir's params."""
  src, hf, _ = ckpts["llama_tied"]
  _write_tiny_gguf(tmp_path / "tiny.gguf", ckpts)
  cfg_g, p_g = load_gguf(tmp_path / "tiny.gguf")
  cfg_h, p_h = load_hf_dir(src)
  assert cfg_g.tie_embeddings and cfg_g.head_dim == hf["head_dim"]
  for field in (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "rope_theta",
    "qkv_bias",
    "tie_embeddings",
    "bos_id",
    "eos_id",
  ):
    assert getattr(cfg_g, field) == getattr(cfg_h, field), field
  assert cfg_g.rms_eps == pytest.approx(cfg_h.rms_eps)
  assert_tree_equal(p_g, p_h)
  via_pretrained = load_pretrained(str(tmp_path / "tiny.gguf"))[1]
  assert_tree_equal(via_pretrained, p_h)


def test_gguf_rope_freqs_and_unknown_tensors_are_refused(ckpts, tmp_path):
  # Llama-3 GGUFs carry RoPE scaling as a rope_freqs tensor: loading without it would be
  # plain RoPE, silently wrong, so the loader must refuse and say what to do instead.
  e = ckpts["llama_tied"][1]["head_dim"]
  _write_tiny_gguf(
    tmp_path / "l3.gguf", ckpts, [("rope_freqs.weight", np.ones(e // 2, np.float32))]
  )
  with pytest.raises(ValueError, match="rope_freqs.weight.*Hugging Face directory"):
    load_gguf(tmp_path / "l3.gguf")
  _write_tiny_gguf(tmp_path / "odd.gguf", ckpts, [("mystery.weight", np.ones(3, np.float32))])
  with pytest.raises(ValueError, match="unexpected GGUF tensor 'mystery.weight'"):
    load_gguf(tmp_path / "odd.gguf")


# ------------------------------------------------------------------ load_pretrained errors
def test_missing_gguf_names_the_path(tmp_path):
  path = str(tmp_path / "nope" / "model.Q4_0.gguf")
  with pytest.raises(FileNotFoundError, match="model.Q4_0.gguf"):
    load_pretrained(path)


def test_dir_without_config_json(tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match="config.json") as e:
    load_pretrained(str(tmp_path))
  assert str(tmp_path) in str(e.value)


def test_dir_without_safetensors(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(QWEN2_LM))
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    load_pretrained(str(tmp_path))


def test_existing_non_checkpoint_file(tmp_path):
  p = tmp_path / "weights.bin"
  p.write_bytes(b"\0")
  with pytest.raises(ValueError, match="weights.bin"):
    load_pretrained(str(p))


def test_load_pretrained_dir_matches_load_hf_dir(ckpts):
  src, _, _ = ckpts["qwen2_score"]
  cfg1, p1 = load_pretrained(str(src))
  cfg2, p2 = load_hf_dir(src)
  assert cfg1 == cfg2
  assert_tree_equal(p1, p2)
