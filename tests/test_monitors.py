"""Reward-hacking monitors (within-group RM std and AUC) and the JSONL logs of a run."""

import json

import numpy as np
import pytest

from cooper_jax.metrics import JsonlLog, reward_hacking_monitors


def test_within_group_monitors_hand_computed():
  # group 0: the correct rollout beats all 3 wrong ones; group 1: each correct one beats 0.3
  # and loses to 0.7 (2 of 4 pairs); group 2: all correct, no pair. AUC = (3 + 2) / 7.
  r = np.array([0.9, 0.2, 0.8, 0.1, 0.5, 0.5, 0.3, 0.7, 0.6, 0.6, 0.6, 0.6])
  ok = np.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1], bool)
  m = reward_hacking_monitors(r, ok, group_size=4)
  assert m["rm/group_auc"] == pytest.approx(5 / 7)
  assert m["rm/group_auc_pairs"] == 7
  # population stds: sqrt(0.125), sqrt(0.02), 0
  assert m["rm/group_std"] == pytest.approx((np.sqrt(0.125) + np.sqrt(0.02) + 0.0) / 3)


def test_difficulty_only_rm_agrees_by_batch_but_not_within_groups():
  """An RM that scores every rollout of a question alike (it predicts difficulty) agrees with
  the rule over the batch yet gives GRPO nothing: std 0 and AUC 1/2 inside the groups."""
  ok = np.array([1, 1, 1, 0, 0, 0, 0, 1], bool)  # an easy and a hard question
  r = np.array([0.9] * 4 + [0.1] * 4)
  m = reward_hacking_monitors(r, ok, group_size=4)
  assert m["rm/agreement"] == 0.75
  assert m["rm/group_std"] == 0.0
  assert m["rm/group_auc"] == 0.5


def test_ties_and_no_pairs():
  m = reward_hacking_monitors(np.full(4, 0.7), np.ones(4, bool), group_size=2)
  assert m["rm/group_auc_pairs"] == 0 and "rm/group_auc" not in m
  assert "rm/group_std" not in reward_hacking_monitors(np.full(4, 0.7), np.ones(4, bool))


def test_jsonl_log_resume_drops_later_steps(tmp_path):
  path = tmp_path / "rollouts.jsonl"
  log = JsonlLog(path)
  log.append([{"step": s, "i": i} for s in (1, 2, 3) for i in range(2)])
  log.close()
  log = JsonlLog(path, resume_step=2)  # the run resumed from step 2's checkpoint
  log.append([{"step": 3, "i": 9}])
  log.close()
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  assert [(r["step"], r["i"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 9)]


def test_inactive_log_writes_nothing(tmp_path):
  log = JsonlLog(tmp_path / "x.jsonl", active=False)
  log.append([{"step": 1}])
  log.close()
  assert not (tmp_path / "x.jsonl").exists()


def test_progress_line_summarises_the_interval():
  from cooper_jax.metrics import progress_line  # pylint: disable=import-outside-toplevel

  recent = [
    {"reward/mean": 0.2, "rule/acc": 0.1, "rm/group_auc": 0.9},
    {"reward/mean": 0.4, "rule/acc": 0.3, "eval/acc": 0.45, "eval/rm_pair_acc": 0.8},
  ]
  line = progress_line(10, recent)
  assert line == (
    "step 10: train reward 0.300 | rule acc 0.200 | RM within-group AUC 0.900 | "
    "held-out acc 0.450 | RM held-out pair acc 0.800"
  )
  assert "AUC" not in progress_line(3, [{"reward/mean": 1.0, "rule/acc": 1.0, "eval/acc": 1.0}])
  probe = progress_line(5, [{"reward/mean": 1.0, "rule/acc": 1.0, "eval/rm_probe_score": 0.25}])
  assert probe.endswith("| RM on probe 0.250")
