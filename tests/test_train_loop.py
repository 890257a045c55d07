"""train()'s loop beyond one fp32 step on one batch: gradient accumulation, fp16 autocast with a
gradient scaler, the dtype rule of ``utils.half_precision``, epochs, torch.compile, and resuming
all of them.

Tolerances, and why:

* k micro-batches of b against one batch of k*b (fp32, no dropout, the shipped tiny_test config):
  the same samples (micro-batch ``step * k + i`` is a slice of the k*b batch), a mean of k means
  against one mean, so the gradients agree to float32 rounding. One SGD step (linear in the
  gradient): rtol = 1e-5, atol = 1e-7 on the weights. Eight AdamW steps through ``train``: atol =
  1e-5 on the logged losses and on the weights (measured on this CPU: 5e-7 and 6e-7, for k = 2
  and k = 4), against updates of about 1e-2.
* torch.compile against eager: the same ops fused differently; atol = 1e-4 on three losses
  (measured 2e-6).
"""

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minimind_ref import utils
from minimind_ref.run_state import check_scaler_overflow
from minimind_ref.train import (TrainConfig, accumulation_step, build_data, lm_objective, objective_step,
                                precision_for, train)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "minimind_ref" / "configs" / "tiny_test.json"


def tiny(**changes):
    return TrainConfig.from_json(str(TINY)).replace(**{"eval_every": 0, "log_every": 0, **changes})


@pytest.fixture(scope="module")
def tiny_data():
    return build_data(TrainConfig.from_json(str(TINY)))


def _max_weight_diff(a, b):
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


# ---------------------------------------------------------------------- gradient accumulation
def test_one_accumulated_sgd_step_equals_one_step_of_the_whole_batch(tiny_data):
    torch.manual_seed(0)
    from minimind_ref.train import build_model

    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    whole = tiny_data.train.batch(torch.arange(8))
    halves = [tiny_data.train.batch(torch.arange(0, 4)), tiny_data.train.batch(torch.arange(4, 8))]
    one, acc = copy.deepcopy(model), copy.deepcopy(model)
    m1 = objective_step(one, torch.optim.SGD(one.parameters(), lr=1.0), whole, lm_objective, None)
    m2 = accumulation_step(acc, torch.optim.SGD(acc.parameters(), lr=1.0), halves, lm_objective, None)
    for p, q in zip(one.parameters(), acc.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(m2["loss"], m1["loss"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m2["grad_norm"], m1["grad_norm"], rtol=1e-5, atol=1e-6)
    assert int(m2["tokens"]) == int(m1["tokens"]) == 8 * 31
    assert _max_weight_diff(one, model) > 1e-3  # the step moved the weights: the comparison is not vacuous


@pytest.mark.parametrize("k", [2, 4])
def test_k_accumulation_steps_of_batch_b_equal_steps_of_batch_kb(tiny_data, k):
    whole = train(tiny(batch_size=8), data=tiny_data)
    acc = train(tiny(batch_size=8 // k, accumulation_steps=k), data=tiny_data)
    assert acc.history["step"] == whole.history["step"] == list(range(8))
    torch.testing.assert_close(torch.tensor(acc.history["loss"]), torch.tensor(whole.history["loss"]), rtol=0, atol=1e-5)
    assert _max_weight_diff(acc.model, whole.model) < 1e-5
    assert acc.history["lr"] == whole.history["lr"]  # the schedule counts optimizer steps
    assert acc.tokens_per_s > 0 and "scaler_skipped" not in acc.history  # fp32: no scaler
    plain = train(tiny(batch_size=8 // k), data=tiny_data)  # without accumulation the run differs
    assert abs(plain.history["loss"][-1] - acc.history["loss"][-1]) > 1e-3


def test_epochs_set_max_steps_from_the_training_set(tiny_data):
    cfg = tiny(epochs=0.5, batch_size=4, accumulation_steps=2, max_steps=1)
    res = train(cfg, data=tiny_data)
    expected = math.ceil(0.5 * len(tiny_data.train) / 8)
    assert res.step == expected == len(res.history["loss"]) and expected > 1


def test_step_fn_cannot_accumulate_or_go_through_a_scaler(tiny_data):
    def step_fn(model, optimizer, batch, max_grad_norm):
        return objective_step(model, optimizer, batch, lm_objective, max_grad_norm)["loss"]

    with pytest.raises(ValueError, match="accumulation_steps=2 cannot be combined with step_fn"):
        train(tiny(accumulation_steps=2, batch_size=4), data=tiny_data, step_fn=step_fn)
    with pytest.raises(ValueError, match="gradient scaler, which cannot wrap step_fn"):
        train(tiny(dtype="float16"), data=tiny_data, step_fn=step_fn)


# ---------------------------------------------------------------------- fp16 and the gradient scaler
def test_fp16_autocast_with_a_scaler_trains_on_the_cpu(tiny_data):
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        torch.amp.GradScaler("cpu")
    except (RuntimeError, TypeError, AttributeError) as err:  # older torch releases
        pytest.skip(f"this torch has no fp16 autocast or GradScaler on the CPU: {err}")
    fp32 = train(tiny(), data=tiny_data)
    fp16 = train(tiny(dtype="float16"), data=tiny_data)
    h = fp16.history
    assert h["scaler_skipped"] == [0.0] * 8 and h["loss_scale"] == [65536.0] * 8
    assert all(math.isfinite(v) for v in h["loss"] + h["grad_norm"])
    # fp16 rounds every matmul input to 11 significant bits: the curve follows fp32's within 0.01
    torch.testing.assert_close(torch.tensor(h["loss"]), torch.tensor(fp32.history["loss"]), rtol=0, atol=1e-2)
    assert next(fp16.model.parameters()).dtype == torch.float32  # weights stay fp32 under autocast


def _inf_gradient_at(model, calls):
    """Make the gradient of the first weight infinite during the backward passes listed in ``calls``."""
    seen = {"n": 0}

    def hook(grad):
        seen["n"] += 1
        return grad * math.inf if seen["n"] in calls else grad

    next(model.parameters()).register_hook(hook)
    return seen


def test_an_overflow_is_a_skipped_update_not_a_divergence(tiny_data):
    from minimind_ref.train import build_model

    torch.manual_seed(0)
    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    _inf_gradient_at(model, {3})
    res = train(tiny(dtype="float16", max_steps=5), model=model, data=tiny_data, log=lambda line: None)
    h = res.history
    assert h["scaler_skipped"] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert h["loss_scale"] == [65536.0, 65536.0, 65536.0, 32768.0, 32768.0]  # halved after the overflow
    assert math.isinf(h["grad_norm"][2]) and all(math.isfinite(h["grad_norm"][i]) for i in (0, 1, 3, 4))
    assert all(math.isfinite(w) for p in res.model.parameters() for w in p.detach().flatten()[:10].tolist())
    # the same infinite gradient without a scaler is a divergence: the run stops before the update
    torch.manual_seed(0)
    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    _inf_gradient_at(model, {3})
    with pytest.raises(FloatingPointError, match="gradient norm is inf before the update at step 2"):
        train(tiny(max_steps=5), model=model, data=tiny_data, log=lambda line: None)


def test_a_skipped_update_leaves_the_weights_and_logs_a_note(tiny_data):
    from minimind_ref.train import build_model

    torch.manual_seed(0)
    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    before = copy.deepcopy(model)
    _inf_gradient_at(model, {1})
    lines = []
    res = train(tiny(dtype="float16", max_steps=1), model=model, data=tiny_data, log=lines.append)
    assert res.history["scaler_skipped"] == [1.0] and _max_weight_diff(res.model, before) == 0.0
    assert any("scaler skipped 1 of 1 updates" in line for line in lines), lines


def test_an_overflow_at_scale_one_is_a_divergence():
    check_scaler_overflow(torch.tensor(math.inf), 2.0)  # the scaler's business
    with pytest.raises(FloatingPointError, match="loss scale of 1"):
        check_scaler_overflow(torch.tensor(math.inf), 1.0)


# ---------------------------------------------------------------------- the dtype rule
@pytest.mark.parametrize("capability, dtype, scaler", [((7, 5), torch.float16, True), ((8, 0), torch.bfloat16, False),
                                                       ((9, 0), torch.bfloat16, False)])
def test_auto_follows_half_precision_on_a_gpu(monkeypatch, capability, dtype, scaler):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    got = precision_for(tiny(dtype="auto"), torch.device("cuda"))
    assert (got.dtype, got.scaler) == (dtype, scaler), got


def test_explicit_dtypes_and_the_cpu_default():
    cpu = torch.device("cpu")
    got = {d: precision_for(tiny(dtype=d), cpu) for d in ("auto", "float32", "bfloat16", "float16")}
    assert {d: (p.dtype, p.scaler) for d, p in got.items()} == {
        "auto": (None, False), "float32": (None, False), "bfloat16": (torch.bfloat16, False),
        "float16": (torch.float16, True)}
    assert got["auto"].autocast(cpu) is None and got["float32"].grad_scaler(cpu) is None
    assert isinstance(got["float16"].grad_scaler(cpu), torch.amp.GradScaler)


def test_training_takes_the_scaler_when_the_rule_says_fp16(monkeypatch, tiny_data):
    """``dtype='auto'`` on a device whose rule is fp16 (as on a T4) trains with a scaler: the rule is
    mocked for the CPU, where it normally says fp32."""
    monkeypatch.setattr(utils, "half_precision", lambda device: utils.HalfPrecision(torch.float16, True, "mocked: a T4"))
    res = train(tiny(dtype="auto", max_steps=3), data=tiny_data)
    assert res.history["loss_scale"] == [65536.0] * 3
    monkeypatch.setattr(utils, "half_precision", lambda device: utils.HalfPrecision(torch.bfloat16, False, "mocked: an A100"))
    res = train(tiny(dtype="auto", max_steps=3), data=tiny_data)
    assert "loss_scale" not in res.history


# ---------------------------------------------------------------------- resuming
@pytest.mark.parametrize("changes", [{"dtype": "float16"}, {"batch_size": 4, "accumulation_steps": 2}])
def test_resume_restores_the_scaler_and_the_micro_batch_position(tmp_path, tiny_data, changes):
    cfg = tiny(**changes)
    straight = train(cfg.replace(out_dir=str(tmp_path / "a")), data=tiny_data)
    train(cfg.replace(out_dir=str(tmp_path / "b")), data=tiny_data, stop_at=4)
    blob = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["extra"]
    if "dtype" in changes:
        assert blob["scaler"]["scale"] == 65536.0
    else:
        assert blob["micro_step"] == 8
    resumed = train(cfg.replace(out_dir=str(tmp_path / "b"), resume="auto"), data=tiny_data, log=lambda line: None)
    assert resumed.history == straight.history
    assert _max_weight_diff(resumed.model, straight.model) == 0.0


def test_resume_restores_a_reduced_loss_scale(tmp_path, tiny_data):
    from minimind_ref.train import build_model

    torch.manual_seed(0)
    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    _inf_gradient_at(model, {1})
    train(tiny(dtype="float16", max_steps=4, out_dir=str(tmp_path)), model=model, data=tiny_data, stop_at=2,
          log=lambda line: None)
    resumed = train(tiny(dtype="float16", max_steps=4, out_dir=str(tmp_path), resume="auto"), data=tiny_data,
                    log=lambda line: None)
    assert resumed.history["loss_scale"] == [65536.0, 32768.0, 32768.0, 32768.0]


def test_a_checkpoint_with_another_micro_step_is_refused(tmp_path, tiny_data):
    cfg = tiny(batch_size=4, accumulation_steps=2, out_dir=str(tmp_path))
    train(cfg, data=tiny_data, stop_at=2)
    path = tmp_path / "ckpt.pt"
    blob = torch.load(path, weights_only=True)
    blob["extra"]["micro_step"] = 3  # written by another program, with valid digests
    from minimind_ref.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(load_checkpoint(path), path, extra=blob["extra"])
    with pytest.raises(ValueError, match="records micro-batch 3 at step 2"):
        train(cfg.replace(resume="auto"), data=tiny_data)
    with pytest.raises(ValueError, match="accumulation_steps: checkpoint 2, now 1"):
        train(tiny(batch_size=4, out_dir=str(tmp_path), resume="auto"), data=tiny_data)


# ---------------------------------------------------------------------- torch.compile, DDP
@pytest.mark.slow
def test_compiled_training_gives_the_eager_losses(tiny_data):
    eager = train(tiny(max_steps=3), data=tiny_data)
    try:
        compiled = train(tiny(max_steps=3, compile=True), data=tiny_data)
    except Exception as err:  # no C++ compiler, or a backend this torch lacks on this machine
        pytest.skip(f"torch.compile is not available here: {type(err).__name__}: {str(err)[:200]}")
    torch.testing.assert_close(torch.tensor(compiled.history["loss"]), torch.tensor(eager.history["loss"]),
                               rtol=0, atol=1e-4)


@pytest.mark.slow
def test_two_gloo_processes_accumulating_match_one_process(tmp_path):
    """torchrun with 2 processes, micro-batch 4 (2 a process), 2 accumulation steps (the first
    under ``no_sync``) against one process with batch 8: the same samples; rtol = atol = 1e-5 on
    the losses, 1e-4 on the weights (the tolerances of tests/test_ddp.py)."""
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    common = ["--config", str(TINY), "--set", "device=\"cpu\"", "eval_every=0"]

    def run(args):
        proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    single, ddp = tmp_path / "single", tmp_path / "ddp"
    run([sys.executable, "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(single))}",
         "--history", str(tmp_path / "single.json")])
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
         "minimind_ref.train", *common, "batch_size=4", "accumulation_steps=2", f"out_dir={json.dumps(str(ddp))}",
         f"tokenizer={json.dumps(str(single / 'tokenizer.json'))}", "--history", str(tmp_path / "ddp.json")])
    h1 = json.loads((tmp_path / "single.json").read_text())["history"]
    h2 = json.loads((tmp_path / "ddp.json").read_text())["history"]
    torch.testing.assert_close(torch.tensor(h2["loss"]), torch.tensor(h1["loss"]), rtol=1e-5, atol=1e-5)
    w1 = torch.load(single / "ckpt.pt", weights_only=True)["state_dict"]
    w2 = torch.load(ddp / "ckpt.pt", weights_only=True)["state_dict"]
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-4, msg=k)
