"""`make test-gpu` on a machine without CUDA: every GPU test is collected and skipped, nothing fails.

The CPU suite runs this (the GPU tests themselves are deselected from `make test`), with
``CUDA_VISIBLE_DEVICES`` empty so it holds on a GPU machine too.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
def test_gpu_suite_skips_cleanly_without_cuda():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_gpu.py", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                           "-o", "addopts=", "-p", "no:xdist"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"pytest -m gpu without CUDA exited {proc.returncode}:\n{out[-3000:]}"
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?\d+ skipped in .*", summary), summary
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))
    # one test per chapter, fp32, bf16 and fp16 training, the planner's peak, both half precisions (bf16,
    # fp16), four graph-decoder cases, its sampling, changed-weights/NaN and compiled tests, DDP over nccl
    assert skipped == len(NOTEBOOKS) + 5 + 2 + 7, summary
    assert "no CUDA device" in out
