"""benchmarks/: the table and JSON have their structure, and every ratio is ours / peer from the
two sides' own measurements (fake peers and clocks here); nothing is asserted to be fast."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from benchmarks import gpu_mode, harness, iteration, run, sections  # noqa: E402


def fake_clock(*steps):
  """A clock that advances by the given steps, one per reading pair (start, end)."""
  t = [0.0]
  seq = iter(x for s in steps for x in (0.0, s))

  def clock():
    t[0] += next(seq)
    return t[0]

  return clock


def test_time_calls_uses_the_clock():
  assert harness.time_calls(lambda: None, 3, clock=fake_clock(2.0, 1.0, 3.0)) == [2.0, 1.0, 3.0]


def test_load_gate():
  busy = lambda: (3.5, 1.0, 1.0)
  with pytest.raises(harness.NoisyMachine, match="--allow-noisy"):
    harness.load_gate(False, load_fn=busy)
  assert harness.load_gate(True, load_fn=busy) == ((3.5, 1.0, 1.0), True)
  assert harness.load_gate(False, load_fn=busy, refuse=False)[1] is True
  assert harness.load_gate(False, load_fn=lambda: (0.5, 0.4, 0.3))[1] is False


def test_figure_ratios_worst_and_target():
  speed = harness.Figure("s", "speed", "tok/s", "ours", "peer", target=2.0)
  for ours, peer in ((300.0, 100.0), (150.0, 100.0), (250.0, 100.0)):
    speed.add_run(ours, peer, load=1.0)
  assert speed.ratios == [3.0, 1.5, 2.5]
  assert speed.worst_ratio == 1.5 and speed.meets_target is False
  over = harness.Figure("o", "overhead", "s", "cooper", "rule", higher_is_better=False, target=1.3)
  over.add_run(12.0, 10.0, load=3.0)
  over.add_run(11.0, 10.0, load=0.5)
  assert over.worst_ratio == pytest.approx(1.2) and over.meets_target is True
  assert [r["noisy"] for r in over.runs] == [True, False]
  with pytest.raises(ValueError):
    over.add_run(1.0, 0.0, load=0.0)


def test_report_markdown_and_json(tmp_path):
  rep = harness.Report("bench", {"quick": True, "noisy": False, "loadavg_start": [1.0, 1, 1]})
  f = rep.figure(key="k", label="thing", unit="tok/s", ours_label="we", peer_label="they")
  f.add_run(20.0, 10.0, load=1.0)
  f.notes.append("a note")
  rep.figure(key="empty", label="not run", unit="s", ours_label="we", peer_label="they")
  rep.add_table("breakdown", ["a", "b"], [[1, 2.5]])
  md = rep.markdown()
  assert "QUICK" in md and "NOISY" not in md
  assert "| thing | we: 20.00 tok/s | they: 10.00 tok/s | 2.00 | 2.00x |" in md
  assert "we: not run" in md and "### breakdown" in md and "| 1 | 2.5 |" in md
  d = json.loads(rep.write_json(tmp_path / "sub" / "b.json").read_text())
  assert set(d) == {"name", "noisy", "meta", "figures", "extras", "tables"}
  assert d["figures"][0]["runs"][0]["ratio"] == 2.0 and d["figures"][0]["worst_ratio"] == 2.0
  assert d["figures"][1]["runs"] == [] and d["figures"][1]["worst_ratio"] is None


def test_flop_counts_follow_the_shape():
  cfg = sections.gpu_shapes()["smollm2-135m"]
  # ~2 x 134.5M params per generated token (the 0.27 GFLOP), plus attention.
  f = sections.sample_flops(cfg, [1], 1)
  assert 0.26e9 < f["decode"] < 0.28e9
  # One training token is three forwards of the decode of one token with nothing before it.
  one = sections.sample_flops(cfg, [0], 1)["decode"]
  assert sections.step_flops(cfg, 1, 0, 1) == pytest.approx(3 * one)


def _fake_peak():
  return {"flops_per_s": 100e9, "seconds": [0.1]}


def test_sampler_section_pairs_ours_with_the_peer():
  cfg = sections.tiny_cfg()
  params = sections.random_params(cfg)
  calls = []

  def peer(tokens, mask, pad_id, n, reps):
    calls.append((tokens.shape, n, reps))
    return {"seconds": [2.0, 1.0][:reps], "new_tokens": n, "batch": tokens.shape[0]}

  rep = harness.Report("t", {})
  sections.sampler_section(
    rep,
    cfg,
    params,
    lambda b: sections.random_prompts(b, 8, cfg.vocab_size),
    [2],
    4,
    peer,
    _fake_peak,
    runs=2,
    reps=2,
    targets={("hf", 2): 2.0},
  )
  assert calls == [((2, 8), 4, 2)] * 2
  hf, peak = rep.figures
  assert hf.target == 2.0 and len(hf.runs) == 2 and len(peak.runs) == 2
  for r in hf.runs:
    assert r["peer"] == 2 * 4 / 1.0  # the peer's best call
    assert r["ours"] == pytest.approx(2 * 4 / min(r["ours_seconds"]))
    assert r["ratio"] == pytest.approx(min(r["peer_seconds"]) / min(r["ours_seconds"]))
  flops = rep.extras["sampler"]["b2"]["flops"]["total"]
  assert peak.runs[0]["ours"] == pytest.approx(flops / min(peak.runs[0]["ours_seconds"]) / 1e9)
  assert peak.runs[0]["peer"] == 100.0


def test_policy_step_and_checkpoint_sections(tmp_path):
  cfg = sections.tiny_cfg()
  params = sections.random_params(cfg)
  data = sections.policy_batch(cfg, 2, 4, 4)

  def peer(tokens, prompt_len, adv, reps):
    assert tokens.shape == (2, 8) and prompt_len == 4 and adv.shape == (2,)
    return {"seconds": [0.5] * reps, "tokens": tokens.size}

  rep = harness.Report("t", {})
  ours = sections.policy_step_section(rep, cfg, params, data, peer, _fake_peak, 1, 2, target=1.1)
  r = rep.figures[0].runs[0]
  assert r["peer"] == 16 / 0.5 and r["ratio"] == pytest.approx(r["ours"] / r["peer"])
  assert int(ours.state["step"]) == 4  # two untimed warm-up steps + two timed

  from cooper_jax import optim, steps  # pylint: disable=import-outside-toplevel
  from cooper_jax.config import base_config  # pylint: disable=import-outside-toplevel

  rm_cfg = cfg.replace(head="score")
  rm_state = steps.init_state(
    sections.random_params(rm_cfg), optim.make_optimizer(base_config().rm.optim, 10)
  )
  sections.checkpoint_section(rep, ours.state, rm_state, 1, tmp_path, "tiny")
  save, restore = rep.figures[-2:]
  assert save.key == "checkpoint_save" and not save.higher_is_better and len(save.runs) == 1
  assert restore.runs[0]["ratio"] == pytest.approx(
    restore.runs[0]["ours"] / restore.runs[0]["peer"]
  )
  assert not list(tmp_path.iterdir())  # each run's files are removed


def test_iteration_section_pairs_steady_steps(tmp_path):
  step_s = {"rule": [30.0, 10.0, 11.0], "cooper": [40.0, 12.0, 15.0]}

  def fake_train(spec, mode, steps, workdir, overrides):
    assert steps == 3 and spec == "experiments/tiny.py"
    rows = []
    for i, s in enumerate(step_s[mode]):
      m = {"time/step_s": s, "time/sample_s": s / 2, "time/rm_s": 1.0 if mode == "cooper" else 0}
      if mode == "cooper":
        m["rm_train/updated"] = float(i == 2)
      rows.append(m)
    return rows

  rep = harness.Report("t", {})
  iteration.iteration_section(rep, "experiments/tiny.py", 2, tmp_path, run_train=fake_train)
  (fig,) = rep.figures
  assert fig.ratios == [pytest.approx(1.2), pytest.approx(15 / 11)]  # step 1 (compile) unused
  assert fig.worst_ratio == pytest.approx(15 / 11) and fig.meets_target is False
  assert any("first RM update" in n for n in fig.notes)
  ((title, header, rows),) = rep.tables
  assert header[-1] == "cooper - rule" and ["3", "time/rm_s", "0", "1.00", "+1.00"] in rows


def test_iteration_section_warmup_and_rm_update_count(tmp_path):
  # Steps 1-2 warm up; the RM updates at steps 2 and 4 only, so one of the 2 timed steps has it.
  def fake_train(spec, mode, steps, workdir, overrides):
    assert steps == 4 and overrides == ("data.train=x.jsonl",)
    return [
      {"time/step_s": 10.0 + i, "rm_train/updated": float(mode == "cooper" and i in (1, 3))}
      for i in range(steps)
    ]

  rep = harness.Report("t", {})
  iteration.iteration_section(
    rep, "s", 2, tmp_path, ("data.train=x.jsonl",), run_train=fake_train, warmup=2
  )
  (fig,) = rep.figures
  assert [r["step"] for r in fig.runs] == [3, 4] and [r["rm_update"] for r in fig.runs] == [
    False,
    True,
  ]
  assert "1 of the 2 timed Cooper steps updated the RM" in fig.notes
  assert not any("first RM update" in n for n in fig.notes)  # it fell in the warm-up


def test_easy_arithmetic_rows_load_and_verify(tmp_path):
  from cooper_jax.data import load_qa  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import verify_one  # pylint: disable=import-outside-toplevel

  rows, report = load_qa(str(iteration.easy_arithmetic(tmp_path / "e.jsonl", n=5)))
  assert report.rows == 5 and report.skipped == 0
  for row in rows:
    a, b = (int(x) for x in row["question"].removeprefix("What is ").rstrip("?").split(" + "))
    assert verify_one(f"So \\boxed{{{a + b}}}", row["answer"])[1]
    assert not verify_one(f"So \\boxed{{{a + b + 1}}}", row["answer"])[1]


def test_cli_sizes():
  a = run.parse_args(["--quick"])
  assert a.runs == 3 and a.name == "cpu_quick" and a.out.endswith("results/bench/cpu_quick.json")
  assert run.sizes(a)["batches"] == [2, 4]
  full = run.sizes(run.parse_args([]))
  assert full["iteration"] == ("experiments/smollm2.py:cpu_smoke", (), 2, True)
  assert full["batches"] == [16, 64] and full["new_tokens"] == 128 and full["step"] == (8, 128, 128)
  g = run.sizes(run.parse_args(["--gpu"]))
  assert g["batches"] == [256] and g["prompt"] == 256 and g["new_tokens"] == 512
  assert g["step"] == (16, 512, 512)
  with pytest.raises(SystemExit):
    run.parse_args(["--only", "nope"])


def test_recorded_peer_reproduces_its_rate():
  gen, step = gpu_mode.recorded_peer(1000.0, "x")
  out = gen(np.zeros((4, 3), np.int32), None, 0, 50, 1)
  assert 4 * 50 / min(out["seconds"]) == pytest.approx(1000.0)
  out = step(np.zeros((2, 10), np.int32), 5, None, 1)
  assert out["tokens"] / min(out["seconds"]) == pytest.approx(1000.0)


def test_tunix_pad_id_is_no_prompt_token():
  from benchmarks import tunix_side  # pylint: disable=import-outside-toplevel

  chat = np.array([[1, 9690, 2, 198, 1, 4093]])  # <|im_start|> ... <|im_end|> ...
  assert tunix_side.peer_pad_id(chat) == 16  # <empty_output>, not <|im_end|> (2)
  assert tunix_side.peer_pad_id(np.array([3, 4, 16, 6]), np.array([5])) == 7
  tok = tunix_side._IdsTokenizer(16)
  assert tok.encode(tok.decode([1, 42, 2])) == [1, 42, 2] and tok.bos_id() is None


def test_tunix_section_without_its_venv_records_no_ratio(tmp_path):
  rep = harness.Report("t", {})
  never = lambda b: pytest.fail("prompts are not needed when the peer is absent")
  run.tunix_side.tunix_sampler_section(
    rep, None, None, never, [16, 64], 128, str(tmp_path / "no" / "python"), "hf", 3, 2
  )
  assert [f.key for f in rep.figures] == ["tunix_sampler_b16", "tunix_sampler_b64"]
  for f in rep.figures:
    assert f.runs == [] and f.worst_ratio is None and "peer not run" in f.notes[0]
  a = run.parse_args(["--only", "tunix_sampler", "--tunix-python", "/x/python"])
  assert a.only == ["tunix_sampler"] and a.tunix_python == "/x/python"


def test_gate_figures_count_real_positions_only():
  """Every peer's gate: padding positions never count; one real position past 1e-3 or one
  differing greedy token fails it."""
  mask = np.array([[False, True, True], [True, True, True]])
  ours = np.zeros((2, 3, 4), np.float32)
  peer = ours.copy()
  peer[0, 0, 1] = 5.0  # padding: ignored
  peer[0, 1, 2] = 4e-4  # row 0's first real position
  peer[1, 2, 0] = -6e-4  # row 1's last position
  greedy = np.array([[1, 2], [3, 4]])
  ok, res = harness.gate_figures(ours, peer, mask, greedy, greedy.tolist(), 0.5, extra=7)
  assert ok and res["positions_compared"] == 5 and res["extra"] == 7
  assert res["max_abs_logit_diff"] == pytest.approx(6e-4)
  assert res["max_abs_logit_diff_first_position"] == pytest.approx(4e-4)
  assert res["max_abs_logit_diff_last_position"] == pytest.approx(6e-4)
  assert not harness.gate_figures(ours, peer, mask, greedy, [[1, 2], [3, 5]], 0.5)[0]
  peer[1, 1, 3] = 1.5e-3
  ok, res = harness.gate_figures(ours, peer, mask, greedy, greedy, 0.5)
  assert not ok and res["max_abs_logit_diff"] == pytest.approx(1.5e-3)


def test_report_gate_records_prints_and_refuses_only_a_failed_gate(capsys, tmp_path):
  rep = harness.Report("t", {})
  rep.partial_path = str(tmp_path / "partial.json")
  fig = rep.figure(key="k", label="l", unit="tok/s", ours_label="o", peer_label="p")
  res = {
    "max_abs_logit_diff": 2e-4,
    "max_abs_logit_diff_first_position": 1e-4,
    "positions_compared": 9,
    "greedy_equal": True,
    "greedy_ours": [[1, 2, 3], [4, 5, 6]],
  }
  assert rep.gate("sec", [fig], "peer", True, res, "first_position")
  out = capsys.readouterr().out
  assert "over 9 positions (max_abs_logit_diff_first_position: 1.00e-04)" in out
  assert "3 greedy tokens x 2 prompts equal" in out
  assert rep.extras["sec"]["gate"] is res and fig.notes == []
  res = dict(res, greedy_equal=False)
  assert not rep.gate("sec", [fig], "peer", False, res, "first_position")
  assert "prompts DIFFER" in capsys.readouterr().out
  assert len(fig.notes) == 1 and "correctness gate failed" in fig.notes[0]


def test_paired_peer_runs_time_the_peer_then_ours_and_check_its_tokens():
  rep, calls = harness.Report("t", {}), []

  class Ours:
    def measure(self, reps):
      calls.append(("ours", reps))
      return [2.0, 1.0]

  def peer():
    calls.append(("peer", None))
    return {"seconds": [5.0, 4.0], "made": 32, "prefill_s": [0.5, 0.4]}

  fig = rep.figure(key="k", label="l", unit="tok/s", ours_label="o", peer_label="p")
  answers = harness.paired_peer_runs(rep, fig, 2, 2, 32, Ours(), peer, "x", prefill="prefill_s")
  assert calls == [("peer", None), ("ours", 2)] * 2 and len(answers) == 2
  assert fig.ratios == [4.0, 4.0]  # 32 / 1.0 s vs 32 / 4.0 s: best call of each side
  assert fig.runs[0]["prefill"] == [0.5, 0.4] and fig.runs[0]["peer_seconds"] == [5.0, 4.0]
  with pytest.raises(RuntimeError, match="x made 32 tokens, not 64"):
    harness.paired_peer_runs(rep, fig, 1, 2, 64, Ours(), peer, "x")


def test_llamacpp_section_without_its_venv_records_no_ratio(tmp_path):
  rep = harness.Report("t", {})
  never = lambda b: pytest.fail("prompts are not needed when the peer is absent")
  run.llamacpp_side.llamacpp_sampler_section(
    rep, None, None, never, [16, 64], 128, str(tmp_path / "no" / "python"), str(tmp_path), 3, 2
  )
  assert [f.key for f in rep.figures] == [
    "llamacpp_f32_b16",
    "llamacpp_q4_1_b16",
    "llamacpp_f32_b64",
    "llamacpp_q4_1_b64",
  ]
  for f in rep.figures:
    assert f.runs == [] and f.worst_ratio is None and "peer not run" in f.notes[0]
  a = run.parse_args(["--only", "llamacpp_sampler", "--llamacpp-python", "/x/python"])
  assert a.only == ["llamacpp_sampler"] and a.llamacpp_python == "/x/python"


def test_f32_gguf_leaves_nothing_when_the_write_fails(tmp_path, monkeypatch):
  """A write that fails midway (the header is on disk, the tensors fail) leaves neither the F32
  file nor its temporary next to the source."""
  gguf = pytest.importorskip("gguf")
  from benchmarks import llamacpp_side  # pylint: disable=import-outside-toplevel

  src = tmp_path / "src.gguf"
  w = gguf.GGUFWriter(str(src), "llama")
  w.add_tensor("a.weight", np.ones((2, 32), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  seen = []

  def failing(self, *a, **k):
    seen.extend(p.name for p in tmp_path.iterdir())
    raise OSError("disk full")

  monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", failing)
  with pytest.raises(OSError, match="disk full"):
    llamacpp_side.f32_gguf(str(src), str(tmp_path / "f32.gguf"))
  assert "f32.gguf.partial" in seen  # the failure came after the file was begun
  assert sorted(p.name for p in tmp_path.iterdir()) == ["src.gguf"]


def test_f32_gguf_holds_the_dequantised_values_and_the_metadata(tmp_path):
  """The peer's F32 file: every tensor F32 and equal to gguf's dequantisation of the source
  (a Q8_0 and an F32 tensor here), every metadata field copied but the file type, which says
  ALL_F32; nothing half-written left next to it."""
  gguf = pytest.importorskip("gguf")
  from benchmarks import llamacpp_side  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(0)
  w8 = rng.normal(size=(4, 64)).astype(np.float32)
  norm = rng.normal(size=(64,)).astype(np.float32)
  src = tmp_path / "src.gguf"
  w = gguf.GGUFWriter(str(src), "llama")
  w.add_block_count(1)
  w.add_rope_freq_base(1e5)
  w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
  w.add_token_list(["<a>", "b", "c"])
  q8 = gguf.quants.quantize(w8, gguf.GGMLQuantizationType.Q8_0)
  w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
  w.add_tensor("output_norm.weight", norm)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()

  dst = llamacpp_side.f32_gguf(str(src), str(tmp_path / "f32.gguf"))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["f32.gguf", "src.gguf"]
  a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(dst)
  got = {t.name: t for t in b.tensors}
  assert {t.tensor_type for t in b.tensors} == {gguf.GGMLQuantizationType.F32}
  q = got["blk.0.attn_q.weight"]
  deq = np.asarray(q.data).reshape(4, 64)
  np.testing.assert_array_equal(deq, gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
  assert 0 < np.abs(deq - w8).max() < 0.05  # a real Q8_0 round trip, not the float input
  np.testing.assert_array_equal(np.asarray(got["output_norm.weight"].data), norm)
  fields = lambda r: {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
  fa, fb = fields(a), fields(b)
  assert fb.pop("general.file_type") == int(gguf.LlamaFileType.ALL_F32)
  assert fa.pop("general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q8_0)
  assert fa == fb and fb["tokenizer.ggml.tokens"] == ["<a>", "b", "c"]


def test_decode_bytes_count_each_weight_once_and_the_cache_per_row():
  from benchmarks import floors  # pylint: disable=import-outside-toplevel

  cfg = sections.tiny_cfg()  # vocab 512, d 32, 2 layers, 2 heads / 1 KV head of 16, d_ff 64, tied
  layer = 32 * 16 * (2 * 2 + 2 * 1) + 3 * 32 * 64 + 2 * 32  # q, o, k, v; MLP; two norms
  params = 512 * 32 + 2 * layer + 32  # table (read once, as the tied head), layers, final norm
  got = floors.decode_bytes(cfg, batch=4, ctx=10.0)
  assert got["weights"] == 4 * params
  assert got["cache"] == 4 * (2 * 2 * 1 * 16 * 10 * 4)  # K and V, layers, KV heads, dim, ctx, rows
  untied = floors.decode_bytes(cfg.replace(tie_embeddings=False), batch=4, ctx=10.0)
  assert untied["weights"] == 4 * (params + 4 * 32)  # the head, plus 4 looked-up rows
