"""The sampler benchmark now lives in benchmarks/run.py (its `sampler` section); this keeps the
old command working:

  python tools/analysis/bench_sampler.py [--gpu] [--reps 2] [...]
    == python benchmarks/run.py --only sampler [--gpu] [--reps 2] [...]

See benchmarks/run.py for the options, the table and the JSON it writes.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.run import main  # noqa: E402

if __name__ == "__main__":
  name = "sampler_gpu" if "--gpu" in sys.argv[1:] else "sampler"
  sys.exit(main(["--only", "sampler", "--name", name, *sys.argv[1:]]))
