"""The pure parts of the benchmark: load gate, timing, paired ratios, markdown table, JSON.

Nothing here imports jax or torch, so the structure can be tested with fake clocks and fake
sides. A `Figure` is one ratio (ours / peer) measured `runs` times; each run pairs the two
sides back to back, and the figure reports every run and the worst one (lowest for a speed-up,
highest for an overhead), because on a shared CPU the best run says little about the next one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A 1-minute load average above this (on any core count) means other processes shared the
# CPU while timing started; such results are refused or marked NOISY.
LOAD_LIMIT = 2.0


def load1(load_fn: Callable[[], tuple[float, float, float]] = os.getloadavg) -> float:
  return float(load_fn()[0])


class NoisyMachine(RuntimeError):
  pass


def load_gate(
  allow_noisy: bool,
  limit: float = LOAD_LIMIT,
  load_fn: Callable[[], tuple[float, float, float]] = os.getloadavg,
  refuse: bool = True,
) -> tuple[tuple[float, float, float], bool]:
  """(load averages, noisy) when timing starts; raises NoisyMachine if the 1-minute load is
  above `limit`, `refuse` is set and `allow_noisy` is not."""
  loads = tuple(float(x) for x in load_fn())
  noisy = loads[0] > limit
  if noisy and refuse and not allow_noisy:
    raise NoisyMachine(
      f"1-minute load average {loads[0]:.2f} > {limit} on {os.cpu_count()} cores: other "
      "processes are using the CPU, so ratios would not hold on a quiet machine. Wait, or pass "
      "--allow-noisy to measure anyway (results are marked NOISY)."
    )
  return loads, noisy


def time_calls(fn: Callable[[], Any], reps: int, clock: Callable[[], float] = time.perf_counter):
  """Wall seconds of `reps` calls of `fn` (which must block until its work is done)."""
  times = []
  for _ in range(reps):
    t0 = clock()
    fn()
    times.append(clock() - t0)
  return times


@dataclasses.dataclass
class Figure:
  """One ratio, ours / peer, over several runs. `higher_is_better`: a speed-up (rates) when
  true, an overhead (seconds) when false; `target` is the ratio the issue asks for."""

  key: str
  label: str
  unit: str
  ours_label: str
  peer_label: str
  higher_is_better: bool = True
  target: float | None = None
  notes: list[str] = dataclasses.field(default_factory=list)
  runs: list[dict] = dataclasses.field(default_factory=list)
  load_limit: float = LOAD_LIMIT

  def add_run(self, ours: float, peer: float, load: float, **detail) -> dict:
    if not (peer > 0 and ours >= 0):
      raise ValueError(f"{self.key}: cannot form a ratio from ours={ours}, peer={peer}")
    run = {
      "ours": float(ours),
      "peer": float(peer),
      "ratio": float(ours) / float(peer),
      "load1": float(load),
      "noisy": float(load) > self.load_limit,
      **detail,
    }
    self.runs.append(run)
    # Progress as it happens: a full CPU run takes long enough that silence looks like a hang.
    print(
      f"  {self.key} run {len(self.runs)}: ours {ours:.4g}, peer {peer:.4g} {self.unit}, "
      f"ratio {run['ratio']:.3f} (load {load:.1f})",
      flush=True,
    )
    return run

  @property
  def ratios(self) -> list[float]:
    return [r["ratio"] for r in self.runs]

  def worst_run(self) -> dict | None:
    if not self.runs:
      return None
    pick = min if self.higher_is_better else max
    return pick(self.runs, key=lambda r: r["ratio"])

  @property
  def worst_ratio(self) -> float | None:
    w = self.worst_run()
    return None if w is None else w["ratio"]

  @property
  def meets_target(self) -> bool | None:
    w = self.worst_ratio
    if self.target is None or w is None:
      return None
    return w >= self.target if self.higher_is_better else w <= self.target

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d.pop("load_limit")
    d.update(
      worst_ratio=self.worst_ratio,
      meets_target=self.meets_target,
      noisy=any(r["noisy"] for r in self.runs),
    )
    return d


def our_gate_side(cfg, params, tokens, mask, greedy_tokens: int):
  """Our side of a peer's correctness gate: `forward`'s logits at every position of the
  left-padded ids, and `greedy_tokens` greedy tokens of `sample` (no EOS), as numpy arrays."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from cooper_jax.models.transformer import forward  # pylint: disable=import-outside-toplevel
  from cooper_jax.sampling import SampleOptions, sample  # pylint: disable=import-outside-toplevel

  logits = np.asarray(jax.jit(forward, static_argnums=0)(cfg, params, tokens, mask))
  greedy = SampleOptions(max_new_tokens=greedy_tokens, temperature=0.0, eos_ids=())
  out = sample(
    params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0), cfg=cfg, options=greedy
  )
  return logits, np.asarray(out.tokens)


GATE_LOGIT_TOL = 1e-3  # every peer's gate: logits within this of ours at every real position


def gate_figures(ours_l, peer_l, mask, ours_g, peer_g, load_s: float, **extra) -> tuple:
  """(ok, figures) of a peer's correctness gate from both sides' logits [b, t, v] over the
  same left-padded ids (compared where `mask` is true) and greedy tokens [b, n]: ok when every
  real position is within GATE_LOGIT_TOL and the greedy tokens are equal."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  diff = np.abs(np.asarray(ours_l) - np.asarray(peer_l))
  first = mask.argmax(1)  # left padding: each row's first real position
  ours_g, peer_g = np.asarray(ours_g), np.asarray(peer_g)
  res = {
    "max_abs_logit_diff": float(diff[mask].max()),
    "max_abs_logit_diff_first_position": float(diff[np.arange(len(first)), first].max()),
    "max_abs_logit_diff_last_position": float(diff[:, -1].max()),
    "positions_compared": int(mask.sum()),
    "greedy_equal": bool(ours_g.shape == peer_g.shape and np.array_equal(ours_g, peer_g)),
    "greedy_ours": ours_g.tolist(),
    "greedy_peer": peer_g.tolist(),
    "load_s": load_s,
    **extra,
  }
  return res["max_abs_logit_diff"] <= GATE_LOGIT_TOL and res["greedy_equal"], res


def paired_peer_runs(
  report, fig, runs: int, reps: int, produced: int, ours, call_peer, name: str, **keep
):
  """`runs` paired runs of a sampler figure: the peer's call (`call_peer()`, a worker answer
  with "seconds" per call and "made", the tokens it made) right before ours (`ours.measure`),
  each side's best of `reps` calls as new tokens/s; `keep` names answer fields recorded with
  each run (run field = answer field). Returns the peer's answers."""
  answers = []
  for _ in range(runs):
    load = load1()
    p = call_peer()
    if p["made"] != produced:
      raise RuntimeError(f"{name} made {p['made']} tokens, not {produced}")
    secs = ours.measure(reps)
    fig.add_run(
      produced / min(secs),
      produced / min(p["seconds"]),
      load,
      ours_seconds=secs,
      peer_seconds=p["seconds"],
      **{field: p[src] for field, src in keep.items()},
    )
    report.save_partial()
    answers.append(p)
  return answers


def _num(x: float) -> str:
  if x == 0:
    return "0"
  if abs(x) >= 100:
    return f"{x:,.0f}"
  if abs(x) >= 1:
    return f"{x:.2f}"
  return f"{x:.3g}"


class Report:
  """Figures plus free-form extras (peaks, breakdowns, compile times) for one invocation."""

  def __init__(self, name: str, meta: dict):
    self.name, self.meta = name, dict(meta)
    self.figures: list[Figure] = []
    self.extras: dict[str, Any] = {}
    self.tables: list[tuple[str, list[str], list[list[str]]]] = []
    self.partial_path: str | None = None

  def save_partial(self) -> None:
    """Writes what is measured so far (meta.partial = true), so a run killed after an hour
    still leaves its finished runs behind."""
    if self.partial_path:
      self.meta["partial"] = True
      self.write_json(self.partial_path)
      self.meta["partial"] = False

  def refuse(self, section: str, figs, why: str) -> None:
    """A peer section that cannot time (no venv, a failed correctness gate): says why on
    stdout and in each of its figures' notes, and saves what is measured so far."""
    print(f"{section}: {why}", flush=True)
    for f in figs:
      f.notes.append(f"{why}: no ratio")
    self.save_partial()

  def gate(self, section: str, figs, peer: str, ok: bool, res: dict, extra: str) -> bool:
    """Records and prints a peer's correctness gate (`gate_figures`' res; `extra` names one
    more of its logit figures, "first_position" or "last_position", or a key of res), and
    refuses the section's figures when it failed. True when timing may go on."""
    self.extras.setdefault(section, {})["gate"] = res
    key = extra if extra in res else f"max_abs_logit_diff_{extra}"
    rows = res["greedy_ours"]
    print(
      f"{peer} gate: max |logit diff| {res['max_abs_logit_diff']:.2e} over "
      f"{res['positions_compared']} positions ({key}: {res[key]:.2e}); "
      f"{len(rows[0]) if rows else 0} greedy tokens x {len(rows)} prompts "
      f"{'equal' if res['greedy_equal'] else 'DIFFER'}",
      flush=True,
    )
    if not ok:
      self.refuse(
        section, figs, "correctness gate failed (logits > 1e-3 apart or greedy tokens differ)"
      )
    return ok

  def figure(self, **kw) -> Figure:
    fig = Figure(**kw)
    self.figures.append(fig)
    return fig

  def add_table(self, title: str, header: list[str], rows: list[list[Any]]) -> None:
    self.tables.append((title, header, [[str(c) for c in r] for r in rows]))

  @property
  def noisy(self) -> bool:
    # The start load decides: later loads include this benchmark's own threads (about one per
    # core), so a run's mark alone does not mean other jobs were there.
    return bool(self.meta.get("noisy"))

  def markdown(self) -> str:
    m = self.meta
    flags = []
    if m.get("quick"):
      flags.append("QUICK (tiny sizes: a smoke check, not a measurement)")
    if self.noisy:
      flags.append(f"NOISY (1-minute load above {LOAD_LIMIT} when timing began)")
    lines = [f"## {self.name}" + (f" - {'; '.join(flags)}" if flags else "")]
    lines.append("")
    la = m.get("loadavg_start")
    if la:
      lines.append(f"load average at start: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (1/5/15 min)")
    if m.get("machine"):
      lines.append(f"machine: {m['machine']}")
    lines.append("")
    lines.append(
      "| figure | ours (worst run) | peer (worst run) | ratio per run | worst | target | "
      "load 1m per run |"
    )
    lines.append("|---|---|---|---|---:|---|---|")
    for f in self.figures:
      w = f.worst_run()
      if w is None:
        lines.append(f"| {f.label} | {f.ours_label}: not run | {f.peer_label} | - | - | - | - |")
        continue
      per_run = ", ".join(f"{r:.2f}" for r in f.ratios)
      tgt = "-"
      if f.target is not None:
        tgt = f"{'>=' if f.higher_is_better else '<='} {f.target:g}x"
        tgt += " (met)" if f.meets_target else " (not met)"
      loads = ", ".join(f"{r['load1']:.1f}" + ("*" if r["noisy"] else "") for r in f.runs)
      lines.append(
        f"| {f.label} | {f.ours_label}: {_num(w['ours'])} {f.unit} | "
        f"{f.peer_label}: {_num(w['peer'])} {f.unit} | {per_run} | {w['ratio']:.2f}x | "
        f"{tgt} | {loads} |"
      )
    notes = [(f.label, n) for f in self.figures for n in f.notes]
    if notes:
      lines.append("")
      lines.extend(f"- {label}: {n}" for label, n in notes)
    for title, header, rows in self.tables:
      lines += ["", f"### {title}", "", "| " + " | ".join(header) + " |"]
      lines.append("|" + "---|" * len(header))
      lines.extend("| " + " | ".join(r) + " |" for r in rows)
    lines.append("")
    lines.append(
      "ratio = ours / peer, each run pairing the two sides back to back; worst = the lowest "
      "ratio of a speed-up (the highest of an overhead); * = that run began with the 1-minute "
      f"load above {LOAD_LIMIT}, which counts this benchmark's own threads too (read it next to "
      "the load at start)."
    )
    return "\n".join(lines)

  def to_json(self) -> dict:
    return {
      "name": self.name,
      "noisy": self.noisy,
      "meta": self.meta,
      "figures": [f.to_json() for f in self.figures],
      "extras": self.extras,
      "tables": [{"title": t, "header": h, "rows": r} for t, h, r in self.tables],
    }

  def write_json(self, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(self.to_json(), indent=1, default=_jsonable) + "\n")
    tmp.replace(path)  # never a half-written result file
    return path


def _jsonable(x):
  if hasattr(x, "tolist"):  # numpy scalars and arrays
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")
