"""Multiple-choice references: an option letter accepted as the letter or as its option's value.

Math Odyssey (Table 3's fifth benchmark) answers 127 of its 387 problems with a letter A-E
whose options are in the question text, in one of two layouts:
  \\text{A)}\\ & -13 & \\text{B)}\\ & -4 \\\\ ...      (inside an align* block)
  Options:\\\\ A) \\( 235 \\)\\\\ B) \\( 35 \\)\\\\ ...      (one option a line)
  A) 15.5 m\\\\  /  A. Alice                             (plain text, one a line)
A model asked to "put the final answer in \\boxed{}" may box the letter or the value; both are
right, and only the letter's own value is (a boxed value of another option is wrong).
"""

from __future__ import annotations

import re

LETTERS = "ABCDE"
# \text{A)}\ & VALUE   up to the next "&", "\\" or \end
_ALIGN = re.compile(r"\\text\{([A-E])\)\}\\?\s*&\s*(.*?)\s*(?=&|\\\\|\\end\{)", re.S)
# A) \( VALUE \)   at the start of a line
_LINES = re.compile(r"^\s*([A-E])\)\s*\\\(\s*(.*?)\s*\\\)", re.M)
# A) 15.5 m\\   or   A. Alice   (plain text, one option a line)
_PLAIN = re.compile(r"^\s*([A-E])[.)]\s+(.+?)\s*(?:\\\\)?\s*$", re.M)


def option_values(question: str) -> dict[str, str]:
  """{letter: option value text} parsed from the question; {} when it lists no options."""
  for pattern in (_ALIGN, _LINES, _PLAIN):
    found = {k: v.strip().rstrip("\\").strip() for k, v in pattern.findall(question)}
    found = {k: v for k, v in found.items() if v}
    if len(found) >= 2:
      return found
  return {}


def accepted_references(row: dict) -> str | tuple[str, ...]:
  """What the rule verifier accepts for a row: its answer, or for an option letter whose
  option is in the question, (letter, that option's value)."""
  answer = str(row["answer"]).strip()
  if len(answer) == 1 and answer in LETTERS:
    value = option_values(str(row.get("question", ""))).get(answer)
    if value:
      return (answer, value)
  return answer
