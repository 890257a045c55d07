"""Two CPU processes under torchrun (DistributedDataParallel, gloo) follow the same trajectory as
one process with the same global batch.

Tolerance: each process averages the loss over its half of the batch and DDP averages the two
gradients, which is the one-process mean computed in a different order, so results agree to
float32 rounding: rtol = atol = 1e-5 on the logged losses and 1e-4 on the final weights after
the 8 AdamW steps of the shipped tiny_test config.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minimind_ref.tokenizer import load_tokenizer
from minimind_ref.train import TrainConfig, build_model

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "minimind_ref" / "configs" / "tiny_test.json"


def _run(args, env):
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    common = ["--config", str(TINY), "--set", "device=\"cpu\""]
    _run([sys.executable, "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(single))}",
          "--history", str(tmp_path / "single.json")], env)
    # the distributed run reuses the single run's tokenizer file, so only the training differs
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(ddp))}",
                f"tokenizer={json.dumps(str(single / 'tokenizer.json'))}", "--history", str(tmp_path / "ddp.json")], env)
    assert "x2 processes" in out

    h1 = json.loads((tmp_path / "single.json").read_text())
    h2 = json.loads((tmp_path / "ddp.json").read_text())
    assert h1["world_size"] == 1 and h2["world_size"] == 2
    assert h1["history"]["step"] == h2["history"]["step"] == list(range(8))
    torch.testing.assert_close(torch.tensor(h2["history"]["loss"]), torch.tensor(h1["history"]["loss"]), rtol=1e-5, atol=1e-5)

    w1 = torch.load(single / "ckpt.pt", weights_only=True)["state_dict"]
    w2 = torch.load(ddp / "ckpt.pt", weights_only=True)["state_dict"]
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-4, msg=k)
    # the comparison is not vacuous: training moved the weights far beyond that tolerance
    cfg = TrainConfig.from_json(str(TINY))
    torch.manual_seed(cfg.seed)
    init = build_model(cfg, load_tokenizer(single / "tokenizer.json").get_vocab_size()).state_dict()
    assert max(float((w1[k] - init[k]).abs().max()) for k in w1) > 1e-2
