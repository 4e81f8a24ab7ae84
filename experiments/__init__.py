"""Experiment configs: each file's `get_config(arg)` returns a ConfigDict (cooper_jax.config).

`python -m cooper_jax.train --config experiments/<file>.py:<arg>` passes what follows the colon
as arg; files that take several settings read it with `parse_arg`, e.g.
`experiments/small_task.py:cond=cooper_weak_rewrite,policy=wide`. A config built on another
imports it (`from experiments import small_task`; the package is installed with cooper_jax).
"""


def parse_arg(arg: str | None, names: tuple[str, ...]) -> dict[str, str]:
  """ "a,k=v" -> {names[0]: "a", "k": "v"}: positional values fill `names` in order, named
  ones may come in any order. A part is named only when its text before "=" is one of `names`
  (so a positional path may hold "="); a part that looks like a name (a bare identifier before
  "=") but is not one, a repeated name or one value too many is an error listing the names."""
  out: dict[str, str] = {}
  positional = iter(names)
  for part in filter(None, (arg or "").split(",")):
    key, eq, value = part.partition("=")
    if not eq or (key not in names and not key.isidentifier()):
      key, value = next(positional, None), part
      if key is None:
        raise ValueError(f"config arg {arg!r}: too many positional values (names: {names})")
    elif key not in names:
      raise ValueError(f"config arg {arg!r}: unknown name {key!r}, expected one of {names}")
    if key in out:
      raise ValueError(f"config arg {arg!r}: {key!r} given twice")
    out[key] = value
  return out
