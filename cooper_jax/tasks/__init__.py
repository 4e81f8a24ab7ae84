"""Small synthetic tasks with exactly checkable answers, for runs that must fit on a CPU.

`arith`: templated arithmetic word problems (integer answers in \\boxed{}), with worked
solutions and deliberately wrong worked solutions. `small_tokenizer`: a byte-level BPE
tokenizer fitted to that task, saved as a Hugging Face tokenizer directory.
"""

from cooper_jax.tasks.arith import (
  DIFFICULTIES,
  boxed_answer,
  generate_rows,
  make_problem,
  make_wrong_solution,
  write_split,
)

__all__ = [
  "DIFFICULTIES",
  "boxed_answer",
  "generate_rows",
  "make_problem",
  "make_wrong_solution",
  "write_split",
]
