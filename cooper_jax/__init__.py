"""cooper_jax: Cooper (arXiv 2508.05613) in JAX/Flax.

libtpu is installed with the project (ahead-of-time compilation for TPU topologies), so on a
host without an accelerator every JAX process would try, and noisily fail, to start a TPU
backend. Importing the package picks the CPU backend in exactly that case, before any entry
point touches jax; a TPU VM, a GPU host, or an explicit JAX_PLATFORMS is left alone
(cooper_jax/host_platform.py).
"""

import os

from cooper_jax.host_platform import use_cpu_unless_accelerator

# transformers (tokenizers only here; JAX models) prints "PyTorch was not found..." at import,
# in every process that imports it (the verifier's spawned workers too): an advisory notice,
# which this variable turns off; inherited by child processes. Set it empty to see them.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

use_cpu_unless_accelerator()
