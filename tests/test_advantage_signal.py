"""tools/analysis/advantage_signal.py: the share of GRPO's advantage that the rule verdict explains, on
groups worked by hand."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "analysis"))
from advantage_signal import group_signal, run_signal  # noqa: E402

MIXED = (np.array([0.9, 0.5, 0.6, 0.2]), np.array([True, True, False, False]))


def test_rule_like_reward_is_all_verdict():
  # reward = verdict: the advantage is a function of the verdict alone
  g = (np.array([1.0, 0.0, 1.0, 0.0]), np.array([True, False, True, False]))
  r = group_signal([g])
  assert r["explained"] == pytest.approx(1.0, abs=1e-6)
  assert r["all_wrong"] == 0.0 and r["all_wrong_weight"] == 0.0


def test_mixed_group_by_hand():
  # mean 0.55, deviations +-0.35, +-0.05; unbiased var 0.25/3, so sum(A^2) = 3 (G - 1).
  # Verdict means of the deviations: +0.15 (right), -0.15 (wrong): between-verdict sum of
  # squares 4 * 0.15^2 / (0.25/3) = 1.08, so explained = 1.08 / 3 = 0.36.
  r = group_signal([MIXED])
  assert r["explained"] == pytest.approx(0.36, rel=1e-5)
  # |A|: 0.35 and 0.05 over std sqrt(0.25/3) = 0.2887, twice each: mean 0.2 / 0.2887 = 0.6928
  assert r["mean_abs"] == pytest.approx(0.2 / np.sqrt(0.25 / 3), rel=1e-5)
  # Dr. GRPO (no std): the deviations themselves, mean |A| 0.2; the verdict share is unchanged
  r = group_signal([MIXED], scale_by_std=False)
  assert r["mean_abs"] == pytest.approx(0.2, rel=1e-5)
  assert r["explained"] == pytest.approx(0.36, rel=1e-5)


def test_all_wrong_group_carries_weight_under_an_rm_but_not_the_rule():
  rm_wrong = (np.array([0.2, 0.6, 0.5, 0.9]), np.zeros(4, bool))  # MIXED's rewards, reordered
  r = group_signal([MIXED, rm_wrong])
  # the same rewards give the same sum|A|: weight 1/2; sum(A^2) = 3 in each group
  assert r["all_wrong"] == 0.5
  assert r["all_wrong_weight"] == pytest.approx(0.5, rel=1e-5)
  assert r["explained"] == pytest.approx(1.08 / 6, rel=1e-5)
  rule_wrong = (np.zeros(4), np.zeros(4, bool))  # equal rewards: A = 0, no gradient
  r = group_signal([MIXED, rule_wrong])
  assert r["all_wrong"] == 0.5 and r["all_wrong_weight"] == 0.0


def test_run_reads_saved_groups_and_counts_partial_ones(tmp_path):
  cfg = {"rollout": {"group_size": 4}, "policy": {"loss": {"scale_adv_by_std": True}}}
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  rows = [
    {"step": 1, "row": i, "reward": float(MIXED[0][i]), "rule_correct": bool(MIXED[1][i])}
    for i in range(4)
  ]
  rows += [{"step": 1, "row": 4, "reward": 0.5, "rule_correct": True}]  # a cut group
  (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  res = run_signal(tmp_path, window=50)
  assert res["partial_groups_skipped"] == 1
  assert res["windows"]["1-50"]["groups"] == 1
  assert res["windows"]["1-50"]["explained"] == pytest.approx(0.36, rel=1e-5)
