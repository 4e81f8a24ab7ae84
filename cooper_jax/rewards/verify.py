"""The one rule verifier: math-verify run in a process pool with wall-clock deadlines.

Why a process pool: math-verify guards its own sympy work with `signal.alarm`, which only
works in a main thread (in a worker thread it raises ValueError) and cannot interrupt a C call
at all. Frameworks that ran it in threads shipped silent all-zero rewards or hung forever.
Here every item runs in a worker *process*; the parent enforces a per-item deadline and, when
a worker overruns it, kills that process (the only way to stop a hung C call) and starts a
fresh one. Nothing is silently scored 0: every item gets a status, and every timeout, crash,
unparseable reference and answer-less completion is counted and logged.

Workers use the 'spawn' start method by default: forking a parent that runs JAX/XLA threads
can deadlock the child. Note that spawn re-imports the parent's `__main__` module in each
worker (standard multiprocessing behaviour), so keep heavy work under `if __name__ == ...`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait as mp_wait

import numpy as np

logger = logging.getLogger(__name__)

STATUSES = ("ok", "no_answer", "timeout", "error", "ref_parse_error")
DECIDED = ("ok", "no_answer")  # statuses that are a verdict; the others are unknown
_STARTUP_TIMEOUT_S = 120.0  # a spawned worker must import math-verify/sympy (~1 s) by then
_MAX_STARTUP_FAILURES = 3  # consecutive workers dying before "ready": a broken setup, not bad luck


# --------------------------------------------------------------------------------------------
# Worker-side primitives (run inside the pool processes; also importable for direct use)
# --------------------------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed_span(text: str) -> tuple[int, int] | None:
  """(start, end) of the content of the last closed \\boxed{...} / \\fbox{...} (braces matched);
  None if there is none. An unclosed last box (a truncated rollout) falls back to the box
  before it."""
  for m in reversed(list(_BOX.finditer(text))):
    depth = 1
    for i in range(m.end(), len(text)):
      depth += {"{": 1, "}": -1}.get(text[i], 0)
      if depth == 0:
        return m.end(), i
  return None


def boxed_answer(text: str) -> bool:
  """Whether the text states its answer in a closed, non-empty \\boxed{...}. math-verify does
  not need one: with no box (or an empty one) it reads the text's last number, so an
  answer-less rollout can still be rule-correct (pairs.positive_check='rule+boxed')."""
  span = last_boxed_span(text)
  return span is not None and bool(text[span[0] : span[1]].strip())


def extract_answer(text: str) -> list:
  """math-verify's parse of one text: a list like [sympy_expr, "latex string"], [] if none.

  Runs in the calling process with math-verify's own timeouts disabled, so call it only in a
  pool worker (or where a hang is acceptable). Errors raise instead of returning [].
  """
  from math_verify import parse

  return parse(text, parsing_timeout=None, raise_on_error=True)


def parse_reference(reference: str) -> list:
  """Parse a gold answer, wrapping plain references in \\boxed{} so LaTeX survives.

  Why: bare "\\left( 3, \\frac{\\pi}{2} \\right)" parses to just 3, and "\\$18.90" or
  "\\sqrt{2}" to nothing; inside \\boxed{} all 3494 shipped test references parse.
  """
  ref = str(reference).strip()
  if "\\boxed" in ref:
    return extract_answer(ref)
  gold = extract_answer("\\boxed{" + ref + "}")
  if not gold and "$" not in ref:
    gold = extract_answer("$" + ref + "$")
  return gold


def answer_string(parsed: list) -> str | None:
  """The human-readable form of a parse (its string element) for logging."""
  if not parsed:
    return None
  for p in parsed:
    if isinstance(p, str):
      return p
  return str(parsed[0])


def _any_equal(gold: list, pred: list) -> bool:
  """verify() over all (gold, pred) pairs, pair by pair.

  Why not one verify(gold, pred) call: with raise_on_error=True one failing pair would hide a
  True from another pair; with raise_on_error=False failures silently become False. Here a
  True anywhere wins, and a failure only surfaces (raises) when no pair matched.
  """
  from math_verify import verify

  first_exc = None
  for g in gold:
    for p in pred:
      try:
        if verify(g, p, timeout_seconds=None, raise_on_error=True):
          return True
      except Exception as e:  # noqa: BLE001 - re-raised below if nothing matched
        first_exc = first_exc or e
  if first_exc is not None:
    raise first_exc
  return False


def verify_one(completion: str, reference) -> tuple[str, bool, str | None]:
  """Default worker function: (status, correct, pred_string) for one completion. reference:
  a string, or a tuple of accepted ones (an option letter and its value,
  rewards.choices.accepted_references): correct if the answer equals any of them."""
  refs = reference if isinstance(reference, tuple) else (reference,)
  gold = [g for ref in refs for g in parse_reference(ref)]
  pred = extract_answer(completion)
  if not gold:
    return "ref_parse_error", False, answer_string(pred)
  if not pred:
    return "no_answer", False, None
  return "ok", _any_equal(gold, pred), answer_string(pred)


def differ_one(a_text: str, b_text: str) -> tuple[str, bool, str | None]:
  """Default differ function: (status, differ, "a_ans | b_ans").

  Not the Cooper reference code's rule, which checks one direction,
  `not verify(parse(neg), parse(pos))`, and so accepts a negative with no parseable answer
  (`verify([], pos)` is False) or whose check timed out (math-verify returns False). Here
  equality in either direction means the same answer; a text with no parseable answer counts
  as differing but with status "no_answer", which `pairs.check_negatives` rejects unless
  `pairs.accept_no_answer`; a timeout or error is a status of its own, always a reject
  (docs/parity.md).
  """
  pa, pb = extract_answer(a_text), extract_answer(b_text)
  shown = f"{answer_string(pa)} | {answer_string(pb)}"
  if not pa or not pb:
    return "no_answer", True, shown
  same = _any_equal(pa, pb) or _any_equal(pb, pa)  # verify is not always symmetric
  return "ok", not same, shown


class _SoftTimeout(BaseException):
  """Raised by SIGALRM in a worker. BaseException so sympy's `except Exception` can't eat it."""


def _on_alarm(signum, frame):
  raise _SoftTimeout()


def _worker_main(conn, verify_fn: Callable, differ_fn: Callable) -> None:
  """Worker loop: receive (job_id, op, a, b, soft_s), reply (job_id, status, value, pred, detail).

  A soft SIGALRM timer (we are in the worker's main thread, so signals work) ends most slow
  items cheaply without killing the worker; the parent's hard deadline covers the rest.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
  signal.signal(signal.SIGALRM, _on_alarm)
  try:
    import math_verify.grader
    import math_verify.parser

    # We disable math-verify's alarms (they would cancel our timer); silence its warning.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    verify_one("\\boxed{1}", "1")  # warm up sympy/lark so the first real item is fast
  except Exception:  # noqa: BLE001 - a broken install shows up as errors, counted by the parent
    logger.exception("verifier worker warm-up failed")
  fns = {"verify": verify_fn, "differ": differ_fn}
  conn.send(("ready", os.getpid()))
  while True:
    try:
      job_id, op, a, b, soft_s = conn.recv()
    except (EOFError, OSError):
      return  # parent closed the pipe or died
    try:
      try:
        signal.setitimer(signal.ITIMER_REAL, soft_s)
        status, value, pred = fns[op](a, b)
      finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
      reply = (job_id, status, bool(value), pred, None)
    except _SoftTimeout:
      reply = (job_id, "timeout", False, None, f"soft timeout after {soft_s:.2f}s")
    except Exception as e:  # noqa: BLE001 - reported per item as "error"
      reply = (job_id, "error", False, None, f"{type(e).__name__}: {e}"[:500])
    conn.send(reply)


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class VerifyResult:
  correct: np.ndarray  # bool per item; False for every non-"ok" status
  status: list[str]  # one of STATUSES per item
  pred: list[str | None]  # parsed completion answer (for logs), None if none
  counts: dict[str, int]  # items per status, every status present
  detail: list[str | None] = dataclasses.field(default_factory=list)  # error/timeout text
  worker_restarts: int = 0  # workers killed (deadline) or crashed during this call
  elapsed_s: float = 0.0

  def labels(self) -> np.ndarray:
    """int8 rule label per item: 1 correct, 0 wrong (an answer that does not match, or no
    answer), -1 unknown (timeout, error, unparsable reference): no verdict, not a wrong one."""
    decided = np.isin(self.status, DECIDED)
    return np.where(decided, np.asarray(self.correct, np.int8), -1).astype(np.int8)


@dataclasses.dataclass
class DifferResult:
  differ: list[bool | None]  # None where the check timed out or errored
  status: list[str]
  answers: list[str | None]  # "a_answer | b_answer" for logs
  counts: dict[str, int]
  detail: list[str | None] = dataclasses.field(default_factory=list)
  worker_restarts: int = 0


@dataclasses.dataclass
class _Worker:
  proc: mp.process.BaseProcess
  conn: object
  started_at: float
  ready: bool = False
  job: int | None = None  # index into the current call's items
  job_started: float = 0.0


def _text(x):
  """A string item as a string; a tuple of accepted references stays a tuple of strings."""
  return tuple(str(v) for v in x) if isinstance(x, tuple) else str(x)


def _count(statuses: list[str]) -> dict[str, int]:
  counts = dict.fromkeys(STATUSES, 0)
  for s in statuses:
    counts[s] = counts.get(s, 0) + 1
  return counts


class RuleVerifier:
  """A pool of math-verify worker processes. Holds real state (processes), hence a class.

  Use as a context manager or call close(). Not meant to be shared across threads
  concurrently; calls are serialized by a lock.
  """

  def __init__(
    self,
    num_workers: int | None = None,
    *,
    worker_fn: Callable = verify_one,
    differ_fn: Callable = differ_one,
    start_method: str = "spawn",
  ):
    # worker_fn/differ_fn must be importable top-level functions (they are pickled by name
    # into spawned workers); tests use this to inject hangs and crashes.
    self.num_workers = num_workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    self._fns = (worker_fn, differ_fn)
    self._ctx = mp.get_context(start_method)
    self._lock = threading.Lock()
    self._closed = False
    self._startup_failures = 0
    self.totals = dict.fromkeys(STATUSES, 0)  # across all calls, for run-level reporting
    self.total_restarts = 0
    self._workers = [self._spawn() for _ in range(self.num_workers)]

  # ---- lifecycle -------------------------------------------------------------------------
  def _spawn(self) -> _Worker:
    parent_conn, child_conn = self._ctx.Pipe(duplex=True)
    proc = self._ctx.Process(
      target=_worker_main, args=(child_conn, *self._fns), daemon=True, name="rule-verifier"
    )
    proc.start()
    child_conn.close()  # so recv() in the parent sees EOF when the child dies
    return _Worker(proc=proc, conn=parent_conn, started_at=time.monotonic())

  @staticmethod
  def _kill(w: _Worker) -> None:
    if w.proc.is_alive():
      w.proc.kill()  # SIGKILL: a worker stuck in C code ignores anything gentler
    w.proc.join(timeout=5)
    w.conn.close()

  def _replace(self, i: int) -> None:
    self._kill(self._workers[i])
    self._workers[i] = self._spawn()

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    for w in self._workers:
      try:
        w.conn.close()  # idle workers exit on EOF
      except OSError:
        pass
      w.proc.join(timeout=1)
      if w.proc.is_alive():
        w.proc.kill()
        w.proc.join(timeout=5)

  def __enter__(self) -> RuleVerifier:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:  # noqa: BLE001 - interpreter shutdown
      pass

  # ---- scheduling ------------------------------------------------------------------------
  def _run(self, op: str, a_list: list[str], b_list: list[str], deadline_s: float):
    """Run op on every (a, b) pair; returns (status, value, pred, detail, restarts). Equal
    pairs run once and share the result (a GRPO group often repeats a response: in the small
    task's studies about half of them)."""
    if len(a_list) != len(b_list):
      raise ValueError(f"length mismatch: {len(a_list)} vs {len(b_list)}")
    index: dict = {}
    slot, rep = [], []  # each pair's distinct pair; each distinct pair's first index
    for j, (a, b) in enumerate(zip(a_list, b_list)):
      key = (a, b) if isinstance(b, str | tuple) else (a, repr(b))
      if key not in index:
        index[key] = len(rep)
        rep.append(j)
      slot.append(index[key])
    if len(rep) == len(a_list):
      return self._run_each(op, a_list, b_list, deadline_s)
    *lists, restarts = self._run_each(
      op, [a_list[j] for j in rep], [b_list[j] for j in rep], deadline_s
    )
    return (*([x[u] for u in slot] for x in lists), restarts)

  def _run_each(self, op: str, a_list: list[str], b_list: list[str], deadline_s: float):
    if self._closed:
      raise RuntimeError("RuleVerifier is closed")
    if len(a_list) != len(b_list):
      raise ValueError(f"length mismatch: {len(a_list)} vs {len(b_list)}")
    if not deadline_s > 0:
      raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
    n = len(a_list)
    status: list[str | None] = [None] * n
    value, pred, detail = [False] * n, [None] * n, [None] * n
    # The soft in-worker timer fires a little before the hard deadline so most slow items
    # end without a process kill (a respawn costs ~1 s of import time).
    soft_s = max(0.05, deadline_s - min(1.0, 0.2 * deadline_s))
    pending = collections.deque(range(n))
    restarts = 0

    def finish(j, st, val=False, pr=None, det=None):
      status[j], value[j], pred[j], detail[j] = st, val, pr, det

    try:
      while pending or any(w.job is not None for w in self._workers):
        now = time.monotonic()
        for i, w in enumerate(self._workers):  # hand out work to idle, ready workers
          if w.ready and w.job is None and pending:
            j = pending.popleft()
            try:
              w.conn.send((j, op, _text(a_list[j]), _text(b_list[j]), soft_s))
            except OSError:  # died while idle (e.g. OOM-killed): retry elsewhere
              pending.appendleft(j)
              restarts += 1
              self._replace(i)
              continue
            w.job, w.job_started = j, now
        wake = [w.job_started + deadline_s for w in self._workers if w.job is not None]
        wake += [w.started_at + _STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
        timeout = max(0.0, min(wake) - now) if wake else None
        mp_wait([w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers], timeout)
        now = time.monotonic()
        for i, w in enumerate(self._workers):
          msg, dead = None, False
          try:
            if w.conn.poll():
              msg = w.conn.recv()
          except (EOFError, OSError):
            dead = True
          if msg is not None and msg[0] == "ready":
            w.ready, self._startup_failures = True, 0
            continue
          if msg is not None and msg[0] == w.job:
            _, st, val, pr, det = msg
            finish(w.job, st, val, pr, det)
            w.job = None
            continue
          dead = dead or not w.proc.is_alive()
          if dead:
            if not w.ready:
              self._startup_failures += 1
              if self._startup_failures >= _MAX_STARTUP_FAILURES:
                raise RuntimeError(
                  f"rule-verifier workers keep dying at startup (exit code {w.proc.exitcode})"
                )
            if w.job is not None:
              finish(w.job, "error", det=f"worker crashed (exit code {w.proc.exitcode})")
            restarts += 1
            self._replace(i)
          elif w.job is not None and now - w.job_started >= deadline_s:
            finish(
              w.job, "timeout", det=f"hard deadline {deadline_s:.2f}s: worker killed and respawned"
            )
            restarts += 1
            self._replace(i)
          elif not w.ready and now - w.started_at >= _STARTUP_TIMEOUT_S:
            raise RuntimeError(f"rule-verifier worker not ready after {_STARTUP_TIMEOUT_S:.0f}s")
    finally:
      # On an exception (e.g. KeyboardInterrupt) workers still hold jobs whose replies
      # would be misread by the next call: replace them.
      for i, w in enumerate(self._workers):
        if w.job is not None:
          self._replace(i)
    return status, value, pred, detail, restarts

  def _account(self, what: str, status: list[str], detail: list, restarts: int) -> dict:
    counts = _count(status)
    for k, v in counts.items():
      self.totals[k] = self.totals.get(k, 0) + v
    self.total_restarts += restarts
    bad = {k: counts[k] for k in ("timeout", "error", "ref_parse_error") if counts[k]}
    if bad:
      first = next((d for d in detail if d), None)
      logger.warning(
        "%s: %d items, problems %s, worker restarts %d; first detail: %s",
        what,
        len(status),
        bad,
        restarts,
        first,
      )
    return counts

  # ---- public API ------------------------------------------------------------------------
  def verify(
    self, completions: list[str], references: list, deadline_s: float = 5.0
  ) -> VerifyResult:
    """Check each completion against its reference (a string, or a tuple of accepted ones:
    rewards.choices.accepted_references); per-item deadline in seconds."""
    t0 = time.monotonic()
    with self._lock:
      completions, references = list(completions), list(references)
      status, value, pred, detail, restarts = self._run(
        "verify", completions, references, deadline_s
      )
      for j, s in enumerate(status):
        if s == "ref_parse_error" and detail[j] is None:
          detail[j] = f"reference did not parse: {str(references[j])[:200]!r}"
      counts = self._account("rule verify", status, detail, restarts)
    correct = np.array([v and s == "ok" for v, s in zip(value, status)], dtype=bool)
    return VerifyResult(
      correct=correct,
      status=status,
      pred=pred,
      counts=counts,
      detail=detail,
      worker_restarts=restarts,
      elapsed_s=time.monotonic() - t0,
    )

  def differ_batch(
    self, a_texts: list[str], b_texts: list[str], deadline_s: float = 5.0
  ) -> DifferResult:
    """For each pair: do the final answers differ? (None on timeout/error)."""
    with self._lock:
      status, value, pred, detail, restarts = self._run(
        "differ", list(a_texts), list(b_texts), deadline_s
      )
      counts = self._account("answers differ", status, detail, restarts)
    differ = [v if s in DECIDED else None for v, s in zip(value, status)]
    return DifferResult(
      differ=differ,
      status=status,
      answers=pred,
      counts=counts,
      detail=detail,
      worker_restarts=restarts,
    )
