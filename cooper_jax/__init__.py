"""cooper_jax: Cooper (arXiv 2508.05613) in JAX/Flax.

libtpu is installed with the project (ahead-of-time compilation for TPU topologies), so on a
host without an accelerator every JAX process would try, and noisily fail, to start a TPU
backend. Importing the package picks the CPU backend in exactly that case, before any entry
point touches jax; a TPU VM, a GPU host, or an explicit JAX_PLATFORMS is left alone
(cooper_jax/host_platform.py).
"""

from cooper_jax.host_platform import use_cpu_unless_accelerator

use_cpu_unless_accelerator()
