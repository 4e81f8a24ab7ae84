"""The supported command lines, installed as console scripts by pyproject.toml (each also runs
as `python -m cooper_jax.cli.<name>`; `--help` on each):

  cooper-train      cooper_jax.train           one run: policy and RM, checkpoints, metrics
  cooper-evaluate   cooper_jax.evaluate        held-out pass@1 of a run or a model
  cooper-study      cooper_jax.cli.study       conditions x seeds on the small task, with report
  cooper-aot        cooper_jax.cli.aot         one iteration compiled for a TPU topology
  cooper-aot-decode cooper_jax.cli.aot_decode  one sampler decode step against its HBM floor
  cooper-export     cooper_jax.cli.export      a run's policy / RM as Hugging Face directories
  cooper-pipeline   cooper_jax.cli.pipeline    the paper's data -> VerifyRM -> RL pipeline; its
                                               stages cooper_jax.cli.annotate, .pretrain_rm
"""

import sys


def wants_help(doc: str, module_name: str, argv=None) -> bool:
  """For the absl-flag commands: `-h`/`--help` prints the module's docstring and its own flags
  and returns True (the caller exits 0). absl's own --help prints only a usage line under a
  console script (its __main__ is the installed wrapper) and exits 1."""
  argv = sys.argv[1:] if argv is None else argv
  if not any(a in ("-h", "--help", "-help") for a in argv):
    return False
  from absl import flags  # pylint: disable=import-outside-toplevel

  print(doc.strip() + "\n\nflags:\n" + flags.FLAGS.module_help(module_name))
  return True
