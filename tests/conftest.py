"""Test setup: an 8-device CPU platform (for mesh tests) before JAX initialises.

JAX_PLATFORMS=cpu also keeps jax from trying the TPU backend when libtpu is installed (it
would log "Unable to initialize backend 'tpu'" on a CPU host); compiling for a TPU topology
(tests/test_aot_compile.py) works with it set.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# libtpu (installed for tools/aot_compile.py) takes a machine-wide lock when loaded; the AOT
# tests load it next to other JAX processes (other test runs, a training run).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
