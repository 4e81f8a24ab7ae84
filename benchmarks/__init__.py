"""Side-by-side benchmarks: every figure is a ratio of two sides measured in the same run.

Entry point: `python benchmarks/run.py` (see its docstring). `harness` holds the pure parts
(load gate, timing, ratios, table, JSON), `sections` the JAX measurements, `torch_side` the
PyTorch peer that runs in a throwaway torch venv as a subprocess.
"""
