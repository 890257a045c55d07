"""Will it fit, how long: the memory a training run needs and the time an epoch takes, before it starts.

    python -m minimind_ref.plan --config pretrain_minimind2_small --gpu T4 --gpus 1
    python -m minimind_ref.plan --config pretrain_minimind3 --gpu H100 --gpus 8 --set batch_size=256
    python -m minimind_ref.plan --config ch08_cpu --device cpu --measure

**Memory** (``plan_memory``), per process, in the bytes torch allocates (not the CUDA context, the
caching allocator's spare blocks or the data loader):

* weights, fp32: 4 bytes a parameter (autocast computes in half precision but keeps fp32 weights:
  they are the master copy the optimizer updates);
* gradients, fp32: 4 bytes a parameter;
* AdamW's state: two fp32 moments, 8 bytes a parameter;
* under autocast, the half-precision copies of the matrices autocast makes for the forward pass and
  keeps for the backward pass: 2 bytes a weight of every ``nn.Linear`` (the tied head included);
* activations: what the forward pass saves for the backward pass, counted tensor by tensor for this
  model's code (``activation_bytes``: the norms' inputs and scales, each projection's input, the
  attention's inputs and output (fused attention; the math path also its ``T x T`` probabilities),
  the SwiGLU's four hidden tensors, the head's log-softmax), checked against the tensors torch saves
  (``tests/test_plan.py``);
* the loss's backward buffers: two fp32 tensors of ``vocab_size`` per token while the backward of
  the cross-entropy runs;
* under ``torchrun``, DDP's gradient buckets: 4 bytes a parameter; on a GPU, AdamW's ``foreach``
  step allocates one more fp32 copy of the parameters for the square root of the second moment.

The peak is the larger of two moments: the start of the backward pass (weights, AdamW state, the
half copies, every activation, the loss's buffers, the gradients of earlier micro-batches when
accumulating, DDP's buckets) and the optimizer step (weights, gradients, AdamW state, the step's
temporaries, DDP's buckets). On this CPU the estimate is within 20 % of the measured growth of the
process's peak resident memory (``tests/test_plan.py``).

**Time** (``plan_time``): tokens per epoch over tokens per second, where the throughput is measured
here (``--measure``: a few micro-batches of the run's shape, on this machine's device), stated
(``--tokens-per-s``), or bounded by the GPUs' dense half-precision peak (``GPUS``) at the training
FLOPs a token costs, ``6 * (weights a token multiplies) + 6 * layers * seq_len * heads * head_dim``
(forward and backward of every matrix, and of causal attention's scores and weighted sum): a bound
no run reaches; ``--mfu`` says what fraction of it to assume.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .config import MiniMindConfig
from .train import TrainConfig, build_model, config_with_overrides, named_configs, precision_for

GB = 1e9  # the datasheets' gigabyte


@dataclass(frozen=True)
class GPU:
    """A GPU the planner knows: its memory (GB, as the datasheet states it), CUDA compute
    capability, dense half-precision tensor peak (TFLOP/s, fp32 accumulation, without sparsity: bf16
    where the GPU has it, else fp16), and where those numbers come from."""

    name: str
    memory_gb: float
    capability: Tuple[int, int]
    peak_tflops: float
    source: str


#: The GPUs ``--gpu`` takes. Compute capabilities: NVIDIA's CUDA GPU list (developer.nvidia.com/cuda-gpus).
GPUS: Dict[str, GPU] = {g.name: g for g in (
    GPU("T4", 16, (7, 5), 65.0, "NVIDIA T4 datasheet: 16 GB GDDR6; 65 TFLOPS mixed-precision (FP16/FP32); no bf16"),
    GPU("L4", 24, (8, 9), 121.0, "NVIDIA L4 datasheet: 24 GB; BF16 Tensor Core 242 TFLOPS with sparsity"),
    GPU("RTX3090", 24, (8, 6), 71.0, "NVIDIA Ampere GA102 whitepaper: RTX 3090 24 GB GDDR6X; FP16/BF16 tensor "
        "71 TFLOPS with FP32 accumulate (142 with sparsity)"),
    GPU("RTX4090", 24, (8, 9), 165.2, "NVIDIA Ada AD102 whitepaper: RTX 4090 24 GB GDDR6X; FP16/BF16 tensor "
        "165.2 TFLOPS with FP32 accumulate (330.4 with sparsity)"),
    GPU("A100-40GB", 40, (8, 0), 312.0, "NVIDIA A100 datasheet: 40 GB HBM2; BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    GPU("A100-80GB", 80, (8, 0), 312.0, "NVIDIA A100 datasheet: 80 GB HBM2e; BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    GPU("H100", 80, (9, 0), 989.5, "NVIDIA H100 datasheet (SXM): 80 GB HBM3; BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    GPU("H200", 141, (9, 0), 989.5, "NVIDIA H200 datasheet (SXM): 141 GB HBM3e; BF16 Tensor Core 1,979 TFLOPS with sparsity"),
)}
ALIASES = {"A100": "A100-80GB", "3090": "RTX3090", "4090": "RTX4090", "RTX 3090": "RTX3090", "RTX 4090": "RTX4090"}
#: The share of a GPU's memory a plan may fill: the rest is left for the CUDA context, the caching
#: allocator's spare blocks and the kernels' workspaces (a rule of thumb, not a measurement).
HEADROOM = 0.9


def find_gpu(name: str) -> GPU:
    """The GPU ``name`` names (case and spaces ignored, ``A100`` is the 80 GB part); a
    ``ValueError`` listing the known ones otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"gpu must be a name such as 'T4', got {name!r}.")
    key = name.strip()
    key = ALIASES.get(key, ALIASES.get(key.upper(), key))
    by_norm = {g.replace("-", "").replace(" ", "").lower(): g for g in GPUS}
    found = by_norm.get(key.replace("-", "").replace(" ", "").lower())
    if found is None:
        raise ValueError(f"unknown GPU {name!r}: the planner knows {', '.join(GPUS)} (or give --device cuda on a machine "
                         "with the GPU, or --device cpu).")
    return GPUS[found]


def local_gpu(index: Optional[int] = None) -> GPU:
    """This machine's CUDA GPU as a ``GPU`` (memory and capability from torch; the peak from ``GPUS``
    when the name matches one of them, else 0: unknown)."""
    if not torch.cuda.is_available():
        raise ValueError("no CUDA GPU on this machine (torch.cuda.is_available() is False); plan for one with --gpu NAME.")
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    squashed = props.name.replace(" ", "").replace("-", "").lower()
    known = [g for key, g in GPUS.items() if key.split("-")[0].lower() in squashed]
    return GPU(props.name, props.total_memory / GB, (props.major, props.minor), known[0].peak_tflops if known else 0.0,
               "this machine's GPU (torch.cuda.get_device_properties)")


def gpu_precision(dtype: str, gpu: GPU) -> Tuple[Optional[torch.dtype], bool]:
    """``(autocast dtype, gradient scaler)`` that ``TrainConfig.dtype`` gives on ``gpu``: the rule of
    ``utils.half_precision`` (bf16 from compute capability 8.0, else fp16 with a scaler) applied to
    the GPU's capability (``tests/test_plan.py`` checks the two agree on every GPU of ``GPUS``)."""
    if dtype == "float32":
        return None, False
    if dtype == "bfloat16":
        return torch.bfloat16, False
    if dtype == "float16" or gpu.capability < (8, 0):
        return torch.float16, True
    return torch.bfloat16, False


# ---------------------------------------------------------------------- memory
def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
    return value


def _linear_weights(mc: MiniMindConfig) -> int:
    """Weights of every matrix multiply a token goes through (the tied head once)."""
    model = _meta_model(mc)
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _meta_model(mc: MiniMindConfig) -> torch.nn.Module:
    from .model import MiniMindForCausalLM

    with torch.device("meta"):
        return MiniMindForCausalLM(mc)


def activation_bytes(mc: MiniMindConfig, batch: int, seq_len: int, compute_bytes: int, attention: str = "fused") -> int:
    """Bytes the forward pass of ``MiniMindForCausalLM`` (dense) saves for the backward pass, for
    ``batch`` sequences of ``seq_len`` tokens with labels. ``compute_bytes``: 4 in fp32, 2 under
    bf16 or fp16 autocast (norms, their scales and the loss stay fp32). ``attention``: ``"fused"``
    (flash or memory-efficient attention: q, k, v, the output and a log-sum-exp per head) or
    ``"math"`` (also the repeated k and v and the ``seq_len x seq_len`` probabilities)."""
    if mc.use_moe:
        raise ValueError("the planner models dense models; an MoE model's routing and expert buffers are not modelled "
                         "(set model.use_moe to false, or measure the run).")
    if attention not in ("fused", "math"):
        raise ValueError(f"attention must be 'fused' or 'math', got {attention!r}.")
    _check_size("batch", batch)
    _check_size("seq_len", seq_len)
    d, h, kv, hd, inter, vocab = (mc.hidden_size, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim,
                                  mc.intermediate_size, mc.vocab_size)
    c, f = compute_bytes, 4
    norm = f * (2 * d + 1)  # input, 1/rms, normalized (fp32 whatever the autocast)
    # the attention's and the FFN's input: in fp32 one tensor each; autocast casts it once per projection (q, k, v;
    # gate, up) and keeps each cast for the backward pass
    inputs = c * d * (2 if c == f else 3 + 2)
    layer = 2 * norm + inputs + 4 * c * inter  # two norms, the inputs, SwiGLU's four tensors
    if getattr(mc, "qk_norm", False):
        layer += f * (2 * h * hd + h) + f * (2 * kv * hd + kv)
    if attention == "fused":
        layer += c * (2 * h * hd + 2 * kv * hd) + f * h  # q, output; k, v; log-sum-exp
    else:
        layer += c * (4 * h * hd + h * seq_len)  # q, repeated k and v, output copy; probabilities
    targets = (seq_len - 1) / seq_len
    head = 8 + norm + c * d + (f * vocab + 8) * targets  # ids; final norm; head input; log-softmax and targets
    return int(batch * seq_len * (mc.num_hidden_layers * layer + head))


def loss_buffer_bytes(mc: MiniMindConfig, batch: int, seq_len: int) -> int:
    """The cross-entropy's backward buffers: two fp32 tensors of ``vocab_size`` per predicted token."""
    return int(batch * (seq_len - 1) * 2 * 4 * mc.vocab_size)


@dataclass
class MemoryPlan:
    """A run's memory per process, in bytes (see the module docstring)."""

    parameters: int
    micro_batch: int  # sequences a process runs in one forward pass
    seq_len: int
    precision: str
    attention: str
    parts: Dict[str, int] = field(default_factory=dict)
    backward_peak: int = 0
    step_peak: int = 0

    @property
    def peak(self) -> int:
        return max(self.backward_peak, self.step_peak)

    def lines(self) -> List[str]:
        out = [f"{self.parameters:,} parameters; {self.micro_batch} sequences x {self.seq_len} tokens a forward pass "
               f"per process; {self.precision}; {self.attention} attention"]
        for name, value in self.parts.items():
            out.append(f"  {name:<44s} {value / GB:8.3f} GB")
        out.append(f"  {'peak (start of the backward pass)':<44s} {self.backward_peak / GB:8.3f} GB")
        out.append(f"  {'peak (optimizer step)':<44s} {self.step_peak / GB:8.3f} GB")
        return out


def plan_memory(cfg: TrainConfig, device: str = "cuda", gpus: int = 1, gpu: Optional[GPU] = None,
                vocab_size: Optional[int] = None) -> MemoryPlan:
    """The memory of one process of ``cfg``'s run on ``gpus`` processes of ``device`` (``"cuda"``,
    with ``gpu`` naming the kind, or ``"cpu"``). ``vocab_size``: the tokenizer's (default
    ``cfg.vocab_size``)."""
    _check_size("gpus", gpus)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}.")
    if cfg.batch_size % gpus:
        raise ValueError(f"batch_size={cfg.batch_size} (global) does not split evenly over {gpus} processes; give a "
                         "multiple of the number of GPUs (--set batch_size=...).")
    mc = MiniMindConfig(**{**cfg.model, "vocab_size": vocab_size or cfg.vocab_size})
    if cfg.seq_len > mc.max_position_embeddings:
        raise ValueError(f"seq_len={cfg.seq_len} exceeds the model's max_position_embeddings={mc.max_position_embeddings}.")
    model = _meta_model(mc)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if device == "cuda":
        gpu = gpu or local_gpu()
        dtype, scaler = gpu_precision(cfg.dtype, gpu)
        # PyTorch's flash kernel needs compute capability 8.0 and a half dtype; without it, assume the math
        # path (the memory-efficient kernel may take some of these cases: then this is an upper bound)
        attention = "fused" if dtype is not None and gpu.capability >= (8, 0) else "math"
    else:
        precision = precision_for(cfg, torch.device("cpu"))
        dtype, scaler = precision.dtype, precision.scaler
        attention = "fused"  # the CPU's flash-attention kernel takes fp32, bf16 and fp16
    c = 4 if dtype is None else 2
    b = cfg.batch_size // gpus
    matmul = _linear_weights(mc)
    parts = {
        "weights (fp32)": 4 * params,
        "gradients (fp32)": 4 * params,
        "AdamW moments (2 x fp32)": 8 * params,
        "half-precision weight copies (autocast)": 0 if dtype is None else 2 * matmul,
        "activations saved for backward": activation_bytes(mc, b, cfg.seq_len, c, attention),
        "loss backward buffers": loss_buffer_bytes(mc, b, cfg.seq_len),
        "DDP gradient buckets": 4 * params if gpus > 1 else 0,
        "AdamW step temporaries": 4 * params if device == "cuda" else 4 * max(p.numel() for p in model.parameters()),
    }
    held = parts["weights (fp32)"] + parts["AdamW moments (2 x fp32)"] + parts["DDP gradient buckets"]
    backward = (held + parts["half-precision weight copies (autocast)"] + parts["activations saved for backward"]
                + parts["loss backward buffers"] + (parts["gradients (fp32)"] if cfg.accumulation_steps > 1 else 0))
    step = held + parts["gradients (fp32)"] + parts["AdamW step temporaries"]
    name = "fp32" if dtype is None else f"{'bf16' if dtype == torch.bfloat16 else 'fp16'} autocast" + (
        " + gradient scaler" if scaler else "")
    return MemoryPlan(params, b, cfg.seq_len, name, attention, parts, backward, step)


# ---------------------------------------------------------------------- time
def train_flops_per_token(mc: MiniMindConfig, seq_len: int) -> float:
    """Training FLOPs per token: ``6 * matrix weights`` (forward 2, backward 4) plus causal attention's
    ``6 * layers * seq_len * heads * head_dim`` (scores and weighted sum over the earlier half of the
    sequence on average, forward and backward)."""
    return 6.0 * _linear_weights(mc) + 6.0 * mc.num_hidden_layers * seq_len * mc.num_attention_heads * mc.head_dim


def measure_tokens_per_s(cfg: TrainConfig, device: torch.device, micro_batches: int = 3,
                         vocab_size: Optional[int] = None) -> float:
    """Tokens per second of the run's step on ``device``, measured: one warm-up micro-batch, then
    ``micro_batches`` timed ones (forward, backward, and the optimizer step after the last), random
    token ids, the run's precision, ``cfg.batch_size`` sequences of ``cfg.seq_len``."""
    from .train import accumulation_step, make_optimizer, precision_for
    from .utils import synchronize

    _check_size("micro_batches", micro_batches)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, vocab_size or cfg.vocab_size).to(device).train()
    optimizer = make_optimizer(model, cfg)
    precision = precision_for(cfg, device)
    autocast, scaler = precision.autocast(device), precision.grad_scaler(device)
    x = torch.randint(0, vocab_size or cfg.vocab_size, (cfg.batch_size, cfg.seq_len), device=device)
    batch = (x, x)
    accumulation_step(model, optimizer, [batch], max_grad_norm=cfg.grad_clip, autocast=autocast, scaler=scaler)
    synchronize(device)
    start = time.perf_counter()
    accumulation_step(model, optimizer, [batch] * micro_batches, max_grad_norm=cfg.grad_clip, autocast=autocast,
                      scaler=scaler)
    synchronize(device)
    return micro_batches * x.numel() / (time.perf_counter() - start)


@dataclass
class TimePlan:
    """How long an epoch takes at a throughput, and where the throughput comes from."""

    tokens_per_s: float
    source: str
    epoch_tokens: Optional[int]
    tokens_per_step: int

    def lines(self) -> List[str]:
        out = [f"throughput: {self.tokens_per_s:,.0f} tokens/s ({self.source}); an optimizer step is "
               f"{self.tokens_per_step:,} tokens: {self.tokens_per_step / self.tokens_per_s:,.2f} s"]
        if self.epoch_tokens:
            seconds = self.epoch_tokens / self.tokens_per_s
            out.append(f"an epoch of {self.epoch_tokens:,} tokens ({math.ceil(self.epoch_tokens / self.tokens_per_step):,} "
                       f"optimizer steps): {_duration(seconds)}")
        else:
            out.append(f"per billion tokens: {_duration(1e9 / self.tokens_per_s)} (give --epoch-tokens for an epoch)")
        return out


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def plan_time(cfg: TrainConfig, tokens_per_s: float, source: str, epoch_tokens: Optional[int] = None) -> TimePlan:
    if not (isinstance(tokens_per_s, (int, float)) and math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ValueError(f"tokens_per_s must be a positive number, got {tokens_per_s!r}.")
    if epoch_tokens is not None:
        _check_size("epoch_tokens", epoch_tokens)
    return TimePlan(float(tokens_per_s), source, epoch_tokens, cfg.batch_size * cfg.accumulation_steps * cfg.seq_len)


# ---------------------------------------------------------------------- command line
def _memory_available(device: str, gpu: Optional[GPU]) -> Tuple[Optional[float], str]:
    """Bytes the plan may fill, and what they are."""
    if device == "cuda" and gpu is not None:
        return HEADROOM * gpu.memory_gb * GB, f"{HEADROOM:.0%} of the {gpu.name}'s {gpu.memory_gb:.3g} GB ({gpu.source})"
    try:
        with open("/proc/meminfo") as fh:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in fh}
        return float(info["MemAvailable"]), "the memory this machine has available now (/proc/meminfo)"
    except (OSError, KeyError, ValueError, IndexError):
        return None, "unknown (no /proc/meminfo)"


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help=f"a config file or a shipped config ({', '.join(named_configs())})")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override options, as for minimind_ref.train")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"plan for this GPU: {', '.join(GPUS)}")
    where.add_argument("--device", choices=("cpu", "cuda"), help="plan for this machine's CPU, or its GPU")
    p.add_argument("--gpus", type=_positive(int), default=1, help="processes (GPUs) under torchrun (default 1)")
    p.add_argument("--measure", type=_positive(int), nargs="?", const=3, default=None, metavar="N",
                   help="measure the throughput here: N timed micro-batches (default 3) on --device")
    p.add_argument("--tokens-per-s", type=_positive(float), default=None, help="a throughput you measured (all GPUs together)")
    p.add_argument("--mfu", type=_positive(float), default=None,
                   help="the fraction of the GPUs' peak to assume (without it: the bound at 100 %%)")
    p.add_argument("--epoch-tokens", type=_positive(int), default=None, help="tokens in an epoch of the data")
    args = p.parse_args(argv)
    try:
        cfg = config_with_overrides(args.config, args.set)
        gpu = find_gpu(args.gpu) if args.gpu else None
        device = "cuda" if gpu is not None or args.device == "cuda" else "cpu"
        if args.device is None and gpu is None:
            p.error("say where the run goes: --gpu NAME (one of " + ", ".join(GPUS) + ") or --device cpu/cuda")
        if args.mfu is not None and args.mfu > 1:
            raise ValueError(f"--mfu is a fraction of the peak, at most 1; got {args.mfu}.")
        if args.measure and gpu is not None:
            raise ValueError("--measure runs here: use it with --device cpu or --device cuda, not with --gpu.")
        if device == "cuda" and gpu is None:
            gpu = local_gpu()  # a ValueError without CUDA
        memory = plan_memory(cfg, device, args.gpus, gpu)
    except (ValueError, FileNotFoundError) as err:
        p.error(str(err))
        raise
    mc = MiniMindConfig(**{**cfg.model, "vocab_size": cfg.vocab_size})
    print(f"plan for {args.config or 'the default config'} on {args.gpus} x {gpu.name if gpu else 'this CPU'}:")
    if device == "cuda" and args.gpus > 1:
        print(f"  batch_size {cfg.batch_size} is global: {memory.micro_batch} a GPU (upstream's --batch_size is per GPU)")
    for line in memory.lines():
        print(line)
    limit, what = _memory_available(device, gpu)
    if limit is not None:
        verdict = "fits" if memory.peak <= limit else "does NOT fit"
        print(f"{verdict}: peak {memory.peak / GB:.2f} GB against {limit / GB:.2f} GB, {what}")
        if memory.peak > limit:
            print("  lower batch_size and raise accumulation_steps by the same factor (the same optimizer step), or "
                  "use more GPUs")
    flops = train_flops_per_token(mc, cfg.seq_len)
    if args.tokens_per_s:
        rate, source = args.tokens_per_s, "stated"
    elif args.measure:
        dev = torch.device(device)
        rate = measure_tokens_per_s(cfg, dev, args.measure) * args.gpus
        from .utils import device_name

        source = f"measured here on {device_name(dev)}" + (f", times {args.gpus} processes" if args.gpus > 1 else "")
    elif gpu is not None and gpu.peak_tflops > 0:
        mfu = args.mfu or 1.0
        rate = args.gpus * mfu * gpu.peak_tflops * 1e12 / flops
        source = (f"{mfu:.0%} of {args.gpus} x {gpu.peak_tflops:g} TFLOP/s at {flops / 1e6:,.1f} MFLOP a token" +
                  (": a bound no run reaches; --mfu, --tokens-per-s or --measure on the GPU for an estimate"
                   if args.mfu is None else ", an assumed utilisation"))
    else:
        print("time: give --measure (run a few micro-batches here) or --tokens-per-s (this GPU's peak is not in GPUS)")
        return 0
    for line in plan_time(cfg, rate, source, args.epoch_tokens).lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
