"""The GPU path, in one command: `make test-gpu` (``pytest tests -m gpu``).

Every test here is marked ``gpu`` and skipped cleanly where torch sees no CUDA device; ``make test``
deselects them (``-m "not gpu"``), so the CPU suite never needs a GPU. What runs on CUDA, and the
device tolerances:

* **Every chapter**, executed top to bottom in a kernel with ``MINIMIND_DEVICE=cuda`` (so
  ``pick_device()`` returns CUDA, which a last added cell asserts). Outputs are not compared: the
  stored ones are CPU outputs, and on a GPU the last digits differ (other kernels, other reduction
  orders). A cell that raises fails the test, naming the notebook, the cell and the error; the
  exercise checks use their CUDA tolerances (``minimind_ref.utils.default_tolerance``). Set
  ``MINIMIND_FULL=1`` in the environment to run the chapters' GPU-sized runs as well.
* **Training in fp32 on CUDA equals training on the CPU** (minimind_ref/configs/tiny_test.json, 8 AdamW steps,
  same initial weights and data order): logged losses within rtol = atol = 1e-4 and final weights
  within 1e-3. Matrix products on CUDA sum in another order than on the CPU (TF32 is off: torch's
  default for float32 matmuls), so the runs agree to float32 rounding, amplified by 8 optimizer steps.
* **Training with bf16 autocast** (``dtype="auto"`` picks it on a GPU that supports bf16):
  the loss at step 0 within 0.02 of the fp32 CPU run (bfloat16 keeps 8 significant bits, about
  0.4 % of a logit, and the loss itself is computed in fp32 under autocast), every logged loss of
  the 8 steps within 0.1 of it (about 2 % of ln 300, the initial loss: AdamW's normalised steps
  amplify the rounding of small gradients), and a 30-step run lowers the loss as much as the CPU
  test demands (tests/test_train.py).
* **fp16 with a gradient scaler** (``dtype="float16"``, what ``"auto"`` picks on a T4): the 8 logged
  losses within 0.1 of the fp32 CPU run, as for bf16.
* **The planner** (``minimind_ref.plan``): its peak for MiniMind2-Small (batch 8 x 340, 2
  accumulation steps, this GPU's precision) within 20 % of ``torch.cuda.max_memory_allocated``.
* **Both half precisions** (``utils.half_precision``: bf16 on compute capability 8.0+, fp16 with a
  gradient scaler below, as on Colab's T4): a forward pass under autocast in each within 0.02 of fp32,
  a scaled AdamW step, and greedy decoding by the CUDA graph in each dtype.
* **The CUDA-graph decoder** (``minimind_ref.graph_decode``): on small models of both generations,
  dense and MoE, batch 1 and 3 with left padding and an end-of-sequence token, the graph path's
  greedy tokens equal ``generate``'s in fp32 (TF32 off, so both sum float32 products; they may
  differ only where two logits tie to rounding, which these seeds avoid); sampling with top-k 1 is
  greedy, a seeded sampled run repeats; ``compile=True`` replays inductor's kernels with the same
  tokens. The timings of the device check are in ``benchmarks/gpu_check.py``, not here.
* **DDP over nccl** (2+ GPUs): two processes under torchrun follow one process on one GPU with the
  same global batch, in fp32: losses within rtol = atol = 1e-4, weights within 1e-3 (the same mean
  computed in another order, as tests/test_ddp.py checks on the CPU at 1e-5 / 1e-4; cuBLAS also
  picks its kernels by shape, and half a batch has another shape than the whole one).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from minimind_ref.tokenizer import load_tokenizer
from minimind_ref.train import TrainConfig, autocast_for, build_data, build_model, train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "minimind_ref" / "configs" / "tiny_test.json"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")]


def tiny(**changes) -> TrainConfig:
    return TrainConfig.from_json(str(TINY)).replace(**changes)


@pytest.fixture(scope="module")
def tiny_data():
    return build_data(tiny())


@pytest.fixture(scope="module")
def cpu_run(tiny_data):
    return train(tiny(device="cpu", dtype="float32"), data=tiny_data)


# --- every chapter on CUDA ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_runs_on_cuda(path, tmp_path, monkeypatch, record_property):
    """Also records the chapter's seconds on CUDA (``cuda_seconds``, kernel start included) for the
    device check's record, which sets them beside the CPU seconds of book/notebook_timings.json."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("MINIMIND_DEVICE", "cuda")  # the kernel inherits it: pick_device() -> cuda
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "from minimind_ref.utils import pick_device\n"
        "assert pick_device().type == 'cuda', f'the chapter ran on {pick_device()}, not on CUDA'"))
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    try:
        client.execute()
        record_property("cuda_seconds", round(time.perf_counter() - start, 1))
        _log_chapter(path, "passed", time.perf_counter() - start)
    except CellExecutionError as err:
        _log_chapter(path, "failed", time.perf_counter() - start)
        failed = next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
                       and any(out.get("output_type") == "error" for out in cell.get("outputs", []))), None)
        source = nb.cells[failed].source[:600] if failed is not None else ""
        pytest.fail(f"{path.name} failed on CUDA in cell {failed} ({err.ename}: {err.evalue}):\n{source}", pytrace=False)


def _log_chapter(path: Path, outcome: str, seconds: float) -> None:
    """One line per chapter in the file ``MINIMIND_GPU_CHAPTER_LOG`` names (the device check sets it):
    written as each chapter ends, so a run stopped by its time budget keeps the chapters it finished."""
    log = os.environ.get("MINIMIND_GPU_CHAPTER_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"chapter": path.stem, "outcome": outcome, "cuda_seconds": round(seconds, 1),
                                 "pass": os.environ.get("MINIMIND_GPU_PASS", "")}) + "\n")


# --- training --------------------------------------------------------------------------------

def test_fp32_training_on_cuda_equals_cpu(tiny_data, cpu_run):
    gpu = train(tiny(device="cuda", dtype="float32"), data=tiny_data)
    assert next(gpu.model.parameters()).device.type == "cuda"
    torch.testing.assert_close(torch.tensor(gpu.history["loss"]), torch.tensor(cpu_run.history["loss"]),
                               rtol=1e-4, atol=1e-4)
    for (name, a), b in zip(cpu_run.model.state_dict().items(), gpu.model.state_dict().values()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=1e-3, msg=name)


def test_bf16_autocast_training_on_cuda(tiny_data, cpu_run):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16: dtype='auto' trains in fp32 there (test_fp32_training_on_cuda_equals_cpu)")
    cfg = tiny(device="cuda", dtype="auto")
    assert autocast_for(cfg, torch.device("cuda")) is not None, "dtype='auto' must pick bf16 autocast on this GPU"
    gpu = train(cfg, data=tiny_data)
    ref = cpu_run.history["loss"]
    assert abs(gpu.history["loss"][0] - ref[0]) < 0.02, (gpu.history["loss"][0], ref[0])
    torch.testing.assert_close(torch.tensor(gpu.history["loss"]), torch.tensor(ref), rtol=0, atol=0.1)
    long = train(tiny(device="cuda", dtype="auto", max_steps=30, eval_every=30), data=tiny_data)
    h = long.history
    assert all(math.isfinite(g) for g in h["grad_norm"])
    assert sum(h["loss"][-5:]) / 5 < h["loss"][0] - 1.5, h["loss"]
    assert h["eval_loss"][1] < h["eval_loss"][0]


def test_fp16_with_a_gradient_scaler_on_cuda(tiny_data, cpu_run):
    """``dtype="float16"`` (what ``"auto"`` picks on a T4): fp16 autocast through a GradScaler; the
    8 logged losses within 0.1 of the fp32 CPU run (the bf16 test's bound: fp16 keeps more mantissa
    than bf16, and the scaler keeps small gradients from underflowing), and no update skipped at
    the scaler's first scale on this well-behaved run."""
    gpu = train(tiny(device="cuda", dtype="float16"), data=tiny_data)
    h = gpu.history
    assert h["scaler_skipped"] == [0.0] * 8 and len(h["loss_scale"]) == 8
    torch.testing.assert_close(torch.tensor(h["loss"]), torch.tensor(cpu_run.history["loss"]), rtol=0, atol=0.1)
    assert next(gpu.model.parameters()).dtype == torch.float32


def test_the_planners_peak_is_within_20_percent_of_cudas():
    """``minimind_ref.plan`` against ``torch.cuda.max_memory_allocated``: MiniMind2-Small, batch 8 x 340,
    2 accumulation steps, the precision ``dtype="auto"`` picks on this GPU, two optimizer steps; the
    planner's peak (the bytes torch allocates) within 20 % of the measured growth."""
    from minimind_ref.plan import local_gpu, plan_memory
    from minimind_ref.train import accumulation_step, make_optimizer, precision_for

    dev = torch.device("cuda")
    cfg = TrainConfig.from_json("pretrain_minimind2_small").replace(batch_size=8, accumulation_steps=2, device="cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    model = build_model(cfg, cfg.vocab_size).to(dev).train()
    optimizer = make_optimizer(model, cfg)
    precision = precision_for(cfg, dev)
    scaler = precision.grad_scaler(dev)
    x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len), device=dev)
    for _ in range(2):
        accumulation_step(model, optimizer, [(x, x)] * 2, max_grad_norm=1.0, autocast=precision.autocast(dev),
                          scaler=scaler)
    measured = torch.cuda.max_memory_allocated(dev) - before
    estimate = plan_memory(cfg, "cuda", 1, local_gpu()).peak
    assert 0.8 <= estimate / measured <= 1.2, (estimate, measured, torch.cuda.get_device_name(dev))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_both_half_precisions_on_cuda(dtype, record_property):
    """``utils.half_precision`` picks bf16 on compute capability 8.0+ and fp16 with a gradient scaler below
    (Colab's T4); both must work on whatever GPU runs this, so both run here (the CPU suite mocks the
    choice itself, tests/test_platforms.py). A small random minimind-3 on random tokens: the loss under
    autocast in ``dtype`` within 0.02 of the fp32 loss of the same weights (about ln 300 = 5.7; 16-bit
    keeps 8 or 11 significant bits and the loss is computed in fp32 under autocast); one AdamW step through
    a GradScaler (enabled for fp16, as ``needs_scaler`` says) leaves every weight finite; and the weights
    cast to ``dtype`` decode greedily with ``GraphDecoder`` (the graph on CUDA) into valid token ids."""
    from minimind_ref.graph_decode import GraphDecoder
    from minimind_ref.utils import half_precision

    record_property("half_precision", half_precision("cuda").reason)
    model = _decode_model("minimind-3", 0).train()
    ids = torch.randint(0, model.config.vocab_size, (4, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        fp32_loss = model(ids, labels=ids).loss.item()
    with torch.autocast("cuda", dtype=dtype):
        loss = model(ids, labels=ids).loss
    assert abs(loss.item() - fp32_loss) < 0.02, (loss.item(), fp32_loss)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    half = model.eval().to(dtype)
    out = GraphDecoder(half).generate(ids[:1, :8], 16)
    assert out.shape == (1, 24) and int(out.min()) >= 0 and int(out.max()) < model.config.vocab_size


# --- the CUDA-graph decoder -------------------------------------------------------------------

def _decode_model(generation: str, seed: int, **overrides):
    import minimind_ref as mm

    torch.manual_seed(seed)
    small = dict(hidden_size=64, num_hidden_layers=3, vocab_size=300, max_position_embeddings=128)
    if generation == "MiniMind2":
        small.update(num_attention_heads=8, num_key_value_heads=2)
    return mm.MiniMindForCausalLM(mm.MiniMindConfig(generation=generation, **small, **overrides)).cuda().eval()


@pytest.mark.parametrize("generation,moe", [("MiniMind2", False), ("minimind-3", False), ("MiniMind2", True),
                                            ("minimind-3", True)])
def test_graph_decoder_greedy_equals_generate_on_cuda(generation, moe):
    from minimind_ref.graph_decode import GraphDecoder

    model = _decode_model(generation, 1, use_moe=moe)
    decoder = GraphDecoder(model)
    for batch in (1, 3):
        ids = torch.randint(0, 300, (batch, 7), generator=torch.Generator().manual_seed(batch)).cuda()
        mask = torch.ones_like(ids)
        mask[-1, :2] = 0
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=40)
        assert torch.equal(decoder.generate(ids, 40, attention_mask=mask), expected)
        assert decoder.last_path == "cuda graph"
        eos = int(expected[0, 7 + 10])
        assert torch.equal(decoder.generate(ids, 40, attention_mask=mask, eos_token_id=eos),
                           model.generate(ids, attention_mask=mask, max_new_tokens=40, eos_token_id=eos))


def test_graph_decoder_sampling_on_cuda():
    from minimind_ref.graph_decode import GraphDecoder

    model = _decode_model("minimind-3", 2)
    decoder = GraphDecoder(model)
    ids = torch.randint(0, 300, (4, 5), generator=torch.Generator().manual_seed(0)).cuda()
    assert torch.equal(decoder.generate(ids, 24, do_sample=True, top_k=1), model.generate(ids, max_new_tokens=24))
    runs = []
    for _ in range(2):
        torch.manual_seed(5)  # the graph draws from the device's default generator
        runs.append(decoder.generate(ids, 24, do_sample=True, temperature=0.9, top_p=0.9, repetition_penalty=1.2))
    assert torch.equal(runs[0], runs[1]) and decoder.last_path == "cuda graph"
    seeded = decoder.generate(ids, 8, do_sample=True, generator=torch.Generator("cuda").manual_seed(1))
    assert seeded.shape == (4, 13) and decoder.last_path == "eager"  # a generator of one's own: no graph


def test_graph_decoder_on_cuda_sees_changed_weights_and_nan():
    """Issue 46 under a captured graph: weights changed in place after capture are copied into the tensors the
    graph reads (the next replay decodes them), and a NaN that first appears mid-decode raises, as generate does."""
    from minimind_ref.graph_decode import GraphDecoder

    model = _decode_model("minimind-3", 4, tie_word_embeddings=False)
    decoder = GraphDecoder(model)
    ids = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(4)).cuda()
    assert torch.equal(decoder.generate(ids, 24), model.generate(ids, max_new_tokens=24))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert torch.equal(decoder.generate(ids, 24), model.generate(ids, max_new_tokens=24))
    assert decoder.last_path == "cuda graph"
    first = int(model.generate(ids, max_new_tokens=1)[0, -1])
    with torch.no_grad():
        model.model.embed_tokens.weight[first].fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="during generation"):
        decoder.generate(ids, 24)


@pytest.mark.slow
def test_compiled_graph_decoder_on_cuda():
    from minimind_ref.graph_decode import GraphDecoder

    model = _decode_model("minimind-3", 3)
    ids = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(3)).cuda()
    try:
        decoder = GraphDecoder(model, compile=True)
        assert torch.equal(decoder.generate(ids, 32), model.generate(ids, max_new_tokens=32))
        assert decoder.last_path == "compiled cuda graph"
    finally:
        torch._dynamo.reset()


# --- DDP over nccl ---------------------------------------------------------------------------

def _run(args, env):
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP over nccl needs 2 or more GPUs")
def test_two_nccl_processes_match_one_gpu(tmp_path):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    common = ["--config", TINY, "--set", 'device="cuda"', 'dtype="float32"']
    _run([sys.executable, "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(single))}",
          "--history", tmp_path / "single.json"], env)
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(ddp))}",
                f"tokenizer={json.dumps(str(single / 'tokenizer.json'))}", "--history", tmp_path / "ddp.json"], env)
    assert "x2 processes" in out
    h1 = json.loads((tmp_path / "single.json").read_text())
    h2 = json.loads((tmp_path / "ddp.json").read_text())
    assert h1["world_size"] == 1 and h2["world_size"] == 2
    torch.testing.assert_close(torch.tensor(h2["history"]["loss"]), torch.tensor(h1["history"]["loss"]), rtol=1e-4, atol=1e-4)
    w1 = torch.load(single / "ckpt.pt", weights_only=True, map_location="cpu")["state_dict"]
    w2 = torch.load(ddp / "ckpt.pt", weights_only=True, map_location="cpu")["state_dict"]
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-3, atol=1e-3, msg=k)
    cfg = TrainConfig.from_json(str(TINY))
    torch.manual_seed(cfg.seed)
    init = build_model(cfg, load_tokenizer(single / "tokenizer.json").get_vocab_size()).state_dict()
    assert max(float((w1[k] - init[k]).abs().max()) for k in w1) > 1e-2  # training moved the weights
