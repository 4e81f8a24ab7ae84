"""The supported command lines, installed as console scripts by pyproject.toml (each also runs
as `python -m cooper_jax.cli.<name>`; `--help` on each):

  cooper-train      cooper_jax.cli.train       one run: policy and RM, checkpoints, metrics
  cooper-evaluate   cooper_jax.cli.evaluate    held-out pass@1 of a run or a model
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


def unknown_config_keys(argv=None) -> list[str]:
  """`--config.a.b=v` overrides whose key the config file does not define, each as a line that
  names the key and what its parent section does hold. ml_collections reports such a key as a
  bare `AttributeError: "'b'"` deep in a traceback; the command lines check first."""
  argv = sys.argv[1:] if argv is None else argv
  spec, keys = None, []
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      spec = arg.split("=", 1)[1]
    elif arg == "--config" and i + 1 < len(argv):
      spec = argv[i + 1]
    elif arg.startswith("--config."):
      keys.append(arg.removeprefix("--config.").split("=", 1)[0])
  if spec is None or not keys:
    return []
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel

  try:
    c = load_config(spec)
  except Exception:  # noqa: BLE001 - a bad file or arg: config_flags reports it in full
    return []
  problems = []
  for key in keys:
    node, path = c, []
    for part in key.split("."):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(path) or "the config"
        have = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "no sub-keys"
        problems.append(f"--config.{key}: no key {part!r} in {where} (it has: {have})")
        break
      node, path = node[part], [*path, part]
  return problems


def refuse_unknown_config_keys(prog: str, argv=None) -> bool:
  """Prints each unknown override and returns True (the caller exits 2)."""
  problems = unknown_config_keys(argv)
  for line in problems:
    print(f"{prog}: {line}", file=sys.stderr)
  return bool(problems)
