"""Test setup: an 8-device CPU platform (for mesh tests) before JAX initialises.

JAX_PLATFORMS=cpu also keeps jax from trying the TPU backend when libtpu is installed (it
would log "Unable to initialize backend 'tpu'" on a CPU host); compiling for a TPU topology
(tests/test_aot_compile.py) works with it set.
"""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# libtpu (installed for cooper_jax/cli/aot.py) takes a machine-wide lock when loaded; the AOT
# tests load it next to other JAX processes (other test runs, a training run).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Many tests start training runs as subprocesses (resume, kill -9, N processes, gs://, the
# pipeline), most compiling the same tiny-config functions: they share XLA's persistent
# compilation cache, one directory per user, so each function compiles once per machine. The
# pytest process itself keeps the cache off (below): its tests read compiled executables'
# memory and cost analyses, which must come from a fresh compile.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(tempfile.gettempdir(), f"cooper_jax_test_xla_cache_{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402  (after the environment above: jax reads it at import)
import pytest  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)

TINY_CONFIG = str(Path(__file__).resolve().parents[1] / "experiments" / "tiny.py")


def train_cmd(workdir, steps: int, *overrides) -> list[str]:
  """The `python -m cooper_jax.train` command line of a tiny-config run (tests import it)."""
  return [
    sys.executable,
    "-m",
    "cooper_jax.train",
    f"--config={TINY_CONFIG}",
    f"--workdir={workdir}",
    f"--config.train.steps={steps}",
    *overrides,
  ]


def free_port() -> int:
  """A TCP port free on localhost now (the multi-process coordinator, the GCS emulator)."""
  import socket  # pylint: disable=import-outside-toplevel

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def comparable(rows: list[dict]) -> list[dict]:
  """Metrics rows without their wall-clock timings (time/*), for run-to-run equality."""
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def resume_from(src, step: int, dst) -> None:
  """Run dst starts from run src's checkpoint `step` (the same state for a step taken two ways:
  another process layout, another response width)."""
  import shutil  # pylint: disable=import-outside-toplevel

  (Path(dst) / "checkpoints").mkdir(parents=True)
  shutil.copytree(Path(src) / "checkpoints" / str(step), Path(dst) / "checkpoints" / str(step))


def final_params(workdir, items=("policy", "rm")):
  """(step, {item: state}) of a run's newest checkpoint; workdir may be local or gs://."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  from cooper_jax.checkpoint import CheckpointStore  # pylint: disable=import-outside-toplevel
  from cooper_jax.paths import as_path  # pylint: disable=import-outside-toplevel

  store = CheckpointStore(as_path(workdir) / "checkpoints")
  step = store.steps()[-1]
  out = store.manager.restore(
    step, args=ocp.args.Composite(**{k: ocp.args.StandardRestore() for k in items})
  )
  store.close()
  return step, {k: out[k] for k in items}


@pytest.fixture(scope="session")
def tiny_smol():
  """(cfg, params, tokenizer): a 1-layer random model over the real SmolLM2 tokenizer."""
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from cooper_jax.models.transformer import init_params  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel

  cfg = ModelConfig(
    vocab_size=49152,
    d_model=32,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    head_dim=16,
    d_ff=64,
    tie_embeddings=True,
  )
  # jit: eager init of a 49K x 32 embedding op by op takes ~30 s on a busy 2-core CPU.
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  return cfg, params, load_tokenizer("smollm2-135m-instruct")
