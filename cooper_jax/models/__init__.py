"""The model (transformer.py) and its config (config.py). This file stays free of jax imports:
config parsing (cooper_jax.config) reads REMAT_CHOICES from here."""

# What each decoder layer keeps for the backward pass (ModelConfig.remat; the policies are
# transformer.REMAT_POLICIES): "none" everything, "projections" the q/k/v/o and MLP matmul
# outputs (attention scores, softmax, norms, RoPE and SiLU are recomputed), "full" only its
# input (the layer's whole forward is recomputed: the paper-scale memory setting).
REMAT_CHOICES = ("none", "projections", "full")
