"""`python bench/gpu_bench.py ARGS` = `python -m bench gpu-throughput ARGS` (bench.suites.gpu_throughput): the
path the docs and CI workflows name, kept."""

import os
import sys

if __name__ == "__main__":   # run as a file: the repository root (this file's parent's parent) holds `bench`
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    os.execv(sys.executable, [sys.executable, "-m", "bench", "gpu-throughput", *sys.argv[1:]])
