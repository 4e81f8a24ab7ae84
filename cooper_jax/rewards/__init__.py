"""Rewards: the rule verifier (math-verify in a process pool with deadlines)."""

from cooper_jax.rewards.verify import (  # noqa: F401
  STATUSES,
  DifferResult,
  RuleVerifier,
  VerifyResult,
  extract_answer,
  parse_reference,
  rule_verify,
)
