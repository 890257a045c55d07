"""LoRA: low-rank adapters on a frozen MiniMind, in the file format of upstream's ``model/model_lora.py``.

A square ``nn.Linear`` with weight ``W [out, in]`` gets a side path of rank ``r``::

    y = W x + B(A(x))        A: Linear(in, r)  [r, in],  N(0, 0.02)
                             B: Linear(r, out) [out, r], zeros  ->  a fresh adapter changes nothing

As upstream (``d65ef2c:model/model_lora.py:21-32``; c090b69's rule is the same with a default rank
of 8, ``c090b69:model/model_lora.py:21-32``): adapters of rank 16 go on **every** ``nn.Linear``
whose weight is square. In MiniMind2 (8 query heads, 2 key/value heads)
and minimind-3 (8 : 4) those are ``self_attn.q_proj`` and ``self_attn.o_proj`` of every layer:
``k_proj``/``v_proj`` are narrower, the MLP and ``lm_head`` are rectangular, and the MoE gate is a
bare parameter (MiniMind2) or a rectangular ``nn.Linear`` (minimind-3, ``d65ef2c:model/model_minimind.py:152``). There is no scaling factor (scale 1) and no dropout. The course keeps PEFT's
scaling as an option: ``apply_lora(model, rank, alpha=...)`` multiplies the path by ``alpha / rank``
(``scale`` sets the factor directly).

Upstream's adapter is a child module named ``lora`` of the layer it adapts, so the state-dict keys
are ``<module path>.lora.A.weight`` and ``<module path>.lora.B.weight`` (e.g.
``model.layers.0.self_attn.q_proj.lora.A.weight``); ``save_lora`` writes exactly those and nothing
else, ``load_lora`` reads them (a leading ``module.`` from a DDP run is stripped, as upstream does).

``save_lora`` writes exactly those keys and nothing else, in fp16 (upstream at d65ef2c:
``d65ef2c:model/model_lora.py:51 "v.cpu().half()"``; c090b69 saved the tensors as they were,
``c090b69:model/model_lora.py:51``, and had no merge).

``apply_lora`` does **not** freeze anything (upstream's trainer, ``train_lora.py``, freezes every
parameter whose name lacks ``lora``): whoever trains calls ``mark_only_lora_trainable(model)``.

``merge_lora(model)`` folds ``B.weight @ A.weight`` into ``W`` and removes the adapters, leaving a
plain ``MiniMindForCausalLM`` (in fp32 when the model is). ``merge_lora(model, lora_path,
save_path)`` is upstream's d65ef2c function (``d65ef2c:model/model_lora.py:56-65``): load the adapter file into the model's adapters and
write the merged weights as an fp16 state dict (``W.half() + (B @ A).half()``, the adapters'
keys left out) to ``save_path``, leaving the model as it was.
"""

from __future__ import annotations

import math
import os
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .checkpoint import PathLike, _atomic_save, _first_nonfinite, _torch_load, check_weights

__all__ = ["LoRA", "apply_lora", "lora_modules", "mark_only_lora_trainable", "save_lora", "load_lora", "merge_lora",
           "rank_sweep", "load_sweep", "SWEEP_RUNS", "SWEEP_FILE",
           "LORA_CONFIG", "STAGE_SETTINGS", "lora_data", "double_accuracy", "train_lora", "build_stage", "stage_adapter"]


class LoRA(nn.Module):
    """The low-rank side path ``x [..., in] -> B(A(x)) [..., out]`` of rank ``rank``.

    ``A.weight`` is ``[rank, in_features]`` drawn from N(0, 0.02); ``B.weight`` is
    ``[out_features, rank]``, zero, so the path outputs zeros until ``B`` is trained.
    ``scale`` (upstream has none, i.e. 1; PEFT's is ``alpha / rank``) multiplies the path's output;
    ``save_lora`` records a scale other than 1 (key ``lora_scale``, which upstream's ``load_lora``
    ignores) and ``load_lora`` refuses a model whose adapters use another.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, scale: float = 1.0) -> None:
        super().__init__()
        self.rank = rank
        self.scale = scale
        self.A = nn.Linear(in_features, rank, bias=False)
        self.B = nn.Linear(rank, out_features, bias=False)
        self.A.weight.data.normal_(mean=0.0, std=0.02)
        self.B.weight.data.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.B(self.A(x))
        return out if self.scale == 1.0 else out * self.scale

    def delta_weight(self) -> torch.Tensor:
        """``scale * B.weight @ A.weight``: the ``[out, in]`` change this adapter adds to ``W``."""
        return self.scale * (self.B.weight @ self.A.weight)


def _forward_with_lora(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A Linear's own forward plus its adapter (bound to the layer, so ``copy.deepcopy`` follows)."""
    return type(self).forward(self, x) + self.lora(x)


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside ``torch.compile`` (``._orig_mod``) or ``DistributedDataParallel`` (``.module``)."""
    for _ in range(8):
        inner = getattr(model, "_orig_mod", None)
        if inner is None:
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner
    return model


def lora_modules(model: nn.Module) -> List[Tuple[str, nn.Linear]]:
    """``(name, layer)`` of every layer that carries an adapter, in ``named_modules`` order."""
    return [(name, m) for name, m in _unwrap(model).named_modules() if isinstance(getattr(m, "lora", None), LoRA)]


def apply_lora(model: nn.Module, rank: int = 16, scale: float = 1.0, alpha: Optional[float] = None) -> nn.Module:
    """Give every square ``nn.Linear`` of ``model`` a ``LoRA`` of rank ``rank`` (upstream's
    default 16); returns ``model``.

    The adapters live on each layer's device and in its dtype. Nothing is frozen: call
    ``mark_only_lora_trainable(model)`` before training. The model's outputs do not change
    (``B`` starts at zero). ``scale`` (upstream: 1) and ``alpha`` (PEFT's ``lora_alpha``: the
    factor is ``alpha / rank``; give one of the two) are course options.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}.")
    if alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ValueError(f"alpha must be a finite number (PEFT's lora_alpha; the factor is alpha / rank), got {alpha!r}.")
        if scale != 1.0:
            raise ValueError("give scale or alpha, not both: alpha sets scale = alpha / rank.")
        scale = alpha / rank
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number (upstream: 1.0), got {scale!r}.")
    if scale == 0:
        raise ValueError("scale=0 switches the adapters off: their output and their gradients are 0, so training "
                         "would change nothing. Use scale=1.0 (upstream) or another nonzero number.")
    model_inner = _unwrap(model)
    if lora_modules(model_inner):
        raise ValueError("the model already has LoRA adapters; merge_lora(model) first, or start from a fresh model.")
    # the list is taken first, so the new adapters' own Linears are never visited
    targets = [m for m in model_inner.modules() if isinstance(m, nn.Linear) and m.weight.shape[0] == m.weight.shape[1]]
    if not targets:
        raise ValueError(f"{type(model_inner).__name__} has no square nn.Linear layer to adapt.")
    for layer in targets:
        out_features, in_features = layer.weight.shape
        layer.lora = LoRA(in_features, out_features, rank, scale).to(device=layer.weight.device, dtype=layer.weight.dtype)
        layer.forward = types.MethodType(_forward_with_lora, layer)
    return model


def mark_only_lora_trainable(model: nn.Module) -> int:
    """Freeze every parameter except the adapters' ``A``/``B``; returns the trainable count."""
    model = _unwrap(model)
    if not lora_modules(model):
        raise ValueError("the model has no LoRA adapters: call apply_lora(model, rank=...) first.")
    adapter_ids = {id(p) for _, layer in lora_modules(model) for p in layer.lora.parameters()}
    trainable = 0
    for p in model.parameters():
        p.requires_grad_(id(p) in adapter_ids)
        trainable += p.numel() if p.requires_grad else 0
    return trainable


def _lora_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Upstream's keys: ``f'{name}.lora.{k}'`` for each adapter's ``A.weight`` and ``B.weight``."""
    out = {}
    for name, layer in lora_modules(model):
        name = name[len("module."):] if name.startswith("module.") else name
        for k, v in layer.lora.state_dict().items():
            out[f"{name}.lora.{k}"] = v
    return out


def save_lora(model: nn.Module, path: PathLike) -> None:
    """Save only the adapters (``{key: tensor}``, upstream's keys, fp16 on the CPU as upstream's
    ``save_lora`` writes them) to ``path``, atomically.

    A file upstream's ``load_lora`` reads, and ours. NaN/inf adapters are refused (``ValueError``;
    an existing file is kept).
    """
    state = _lora_state_dict(model)
    if not state:
        raise ValueError("the model has no LoRA adapters to save: call apply_lora(model, rank=...) and train it first.")
    bad = _first_nonfinite(state.items())
    if bad is not None:
        raise ValueError(f"refusing to save {os.fspath(path)}: adapter {bad[0]!r} holds {bad[1]} NaN/inf value(s) "
                         "(the run has diverged: lower the learning rate).")
    blob = {k: v.detach().cpu().half() for k, v in state.items()}
    scale = _adapter_scale(model)
    if scale != 1.0:  # upstream's files have no scale (1); record any other (upstream's load_lora ignores the key)
        blob[SCALE_KEY] = torch.tensor(float(scale))
    blob[BASE_KEY] = base_sample(model)  # which base the adapters belong to (upstream's load_lora ignores the key)
    _atomic_save(blob, path)


SCALE_KEY = "lora_scale"
BASE_KEY = "lora_base_sample"
#: values of each base tensor recorded in an adapter file (evenly spaced, in state-dict order)
BASE_SAMPLE = 16


def base_sample(model: nn.Module) -> torch.Tensor:
    """The base model's fingerprint an adapter file records (key ``lora_base_sample``): ``BASE_SAMPLE``
    evenly spaced values of every tensor of the model's state dict other than the adapters (in name
    order), as float16 (clamped to its range), on the CPU. Adapters only mean something on the
    weights they were trained on: ``load_lora`` compares this with the model it loads into."""
    values = []
    with torch.no_grad():
        state = model.state_dict()
        for name in sorted(state):
            clean = name.replace("module.", "", 1) if name.startswith("module.") else name
            clean = clean.replace("_orig_mod.", "", 1) if clean.startswith("_orig_mod.") else clean
            if ".lora." in clean or not state[name].is_floating_point() or not state[name].numel():
                continue
            flat = state[name].detach().reshape(-1)
            picked = flat[torch.linspace(0, flat.numel() - 1, min(BASE_SAMPLE, flat.numel())).round().long()]
            values.append(picked.float().cpu())
    if not values:
        return torch.zeros(0, dtype=torch.float16)
    fp16 = torch.finfo(torch.float16).max
    return torch.cat(values).clamp(-fp16, fp16).half()


def _check_base(model: nn.Module, recorded: torch.Tensor, path: PathLike) -> None:
    """The model's base weights must be the ones the adapters were saved on (``base_sample``), up to
    float16 rounding (rtol 1e-3)."""
    mine = base_sample(model).float()
    recorded = recorded.detach().float().cpu()
    if recorded.dim() != 1 or recorded.shape != mine.shape:
        raise ValueError(f"{os.fspath(path)} was saved on another base model: its record of the base weights holds "
                         f"{recorded.numel()} values, this model gives {mine.numel()} (other layers or sizes). Load it "
                         "into the model it was trained on, or pass check_base=False.")
    if not torch.allclose(mine, recorded, rtol=1e-3, atol=1e-6, equal_nan=True):
        worst = float((mine - recorded).abs().nan_to_num(float("inf")).max())
        raise ValueError(f"{os.fspath(path)} was trained on another base model: this model's weights differ from the "
                         f"ones its adapters were saved on (by up to {worst:.3g} at the values the file records; float16 "
                         "rounding moves them by less than 0.1 %). Adapters only mean something on their own base: "
                         "load it into the model it was trained on (chapter 10's into the shipped sft stage), or pass "
                         "check_base=False if you know the weights are the same up to rounding (a bfloat16 copy, say).")


def _adapter_scale(model: nn.Module) -> float:
    scales = {float(layer.lora.scale) for _, layer in lora_modules(model)}
    if len(scales) != 1:
        raise ValueError(f"the model's adapters use different scales {sorted(scales)}; a LoRA file records one.")
    return scales.pop()


def load_lora(model: nn.Module, path: PathLike, check_finite: bool = True, check_base: bool = True) -> None:
    """Load adapters saved by ``save_lora`` (ours or upstream's) into ``model``, which has adapters.

    Which base: our files record a sample of the base model's weights (``base_sample``, key
    ``lora_base_sample``) and ``check_base`` compares it with ``model``'s (a ``ValueError`` when the
    adapters were trained on another base; ``check_base=False`` skips it). Upstream's files have no
    such record: for them only the shapes can be checked (an adapter of the right shapes trained on
    another base of the same size loads), so load them into the base model they name.

    The file is read weights-only (a pickled Python object is refused, never run). Every adapter of
    the model must be in the file with the same shape and the file must hold nothing else;
    otherwise a ``ValueError`` names the key and says what to do. NaN/inf adapters are a
    ``ValueError`` (``check_finite=False`` loads them, for inspection). Values are copied into the
    existing adapters (their device and dtype are kept).
    """
    layers = lora_modules(model)
    device = next(iter(layers[0][1].lora.parameters())).device if layers else "cpu"
    blob = _torch_load(path, map_location=device)
    if not isinstance(blob, dict) or not blob or not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise ValueError(f"{os.fspath(path)} is not a LoRA file: expected a dict of tensors such as save_lora writes.")
    state = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in blob.items()}
    file_scale = state.pop(SCALE_KEY, None)
    file_base = state.pop(BASE_KEY, None)
    if not state:
        raise ValueError(f"{os.fspath(path)} holds no adapter.")
    first = next(iter(state))
    file_rank = state[first].shape[0] if first.endswith(".lora.A.weight") else None
    if not layers:
        raise ValueError(f"the model has no LoRA adapters: call apply_lora(model, rank={file_rank or '<the file rank>'}) "
                         f"before load_lora({os.fspath(path)!r}).")
    expected = _lora_state_dict(model)
    not_lora = [k for k in state if ".lora." not in k]
    if not_lora:
        raise ValueError(f"{os.fspath(path)} holds keys that are not LoRA adapters (e.g. {not_lora[0]!r}): a full "
                         "model checkpoint? Load it with load_checkpoint; load_lora reads files from save_lora.")
    for key, want in expected.items():
        if key not in state:
            raise ValueError(f"{os.fspath(path)} has no adapter {key!r}: it was saved from another model (other "
                             "layers or a model with another number of layers); load it into the model it was trained on.")
        got = tuple(state[key].shape)
        if got != tuple(want.shape):
            hint = (f"the file has rank {got[0]}, the model rank {want.shape[0]}: apply_lora(model, rank={got[0]}) on a fresh model"
                    if key.endswith(".A.weight") and got[1:] == tuple(want.shape[1:]) else
                    f"the file has rank {got[1]}, the model rank {want.shape[1]}: apply_lora(model, rank={got[1]}) on a fresh model"
                    if key.endswith(".B.weight") and got[:1] == tuple(want.shape[:1]) else
                    "the file was saved from a model of another size; load it into the model it was trained on")
            raise ValueError(f"{os.fspath(path)}: adapter {key!r} has shape {got}, the model's is {tuple(want.shape)}; {hint}.")
    extra = [k for k in state if k not in expected]
    if extra:
        raise ValueError(f"{os.fspath(path)} has adapter {extra[0]!r}, which the model lacks ({len(extra)} such key(s)): "
                         "saved from another model; load it into the model it was trained on.")
    check_weights(state, path, check_finite)  # finite values, as every loader checks
    if file_scale is not None and (file_scale.numel() != 1 or not bool(torch.isfinite(file_scale).all())):
        raise ValueError(f"{os.fspath(path)}: its lora_scale entry must be one finite number, got shape "
                         f"{tuple(file_scale.shape)}; a damaged or hand-made file?")
    if file_base is not None and check_base:
        _check_base(model, file_base, path)
    saved = 1.0 if file_scale is None else float(file_scale)
    if _adapter_scale(model) != saved:
        raise ValueError(f"{os.fspath(path)} was trained with scale {saved} (upstream's files: 1.0), but the model's "
                         f"adapters use scale {_adapter_scale(model)}: the same weights would give other outputs. "
                         f"Apply the adapters with apply_lora(model, rank, scale={saved}).")
    for name, layer in layers:
        name = name[len("module."):] if name.startswith("module.") else name
        prefix = f"{name}.lora."
        layer.lora.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})


@torch.no_grad()
def merge_lora(model: nn.Module, lora_path: Optional[PathLike] = None, save_path: Optional[PathLike] = None) -> nn.Module:
    """Fold every adapter into its layer (``W [out, in] += scale * B.weight @ A.weight``), remove the
    adapters and return ``model``: its state dict then loads strict into a plain ``MiniMindForCausalLM``.
    The sum is formed in fp32 and cast to ``W``'s dtype. ``requires_grad`` flags are left as they
    are (after ``mark_only_lora_trainable`` the base stays frozen).

    With ``lora_path`` and ``save_path``: upstream's ``merge_lora`` (d65ef2c) instead. The
    adapters (``apply_lora`` first) are loaded from ``lora_path``, the merged fp16 state dict is
    written to ``save_path`` exactly as upstream forms it (every ``nn.Linear`` weight in fp16, plus
    ``(B @ A).half()`` where a layer has an adapter; the adapters' keys left out), and the model
    keeps its adapters; returns ``model``.
    """
    if (lora_path is None) != (save_path is None):
        raise ValueError("give both lora_path and save_path (upstream's file-to-file merge), or neither (merge in place).")
    layers = lora_modules(model)
    if not layers:
        raise ValueError("the model has no LoRA adapters to merge: call apply_lora(model, rank=...) (and load_lora) first.")
    if lora_path is not None:
        load_lora(model, lora_path)
        raw = _unwrap(model)
        state = {k: v.cpu().half() for k, v in raw.state_dict().items() if ".lora." not in k}
        for name, module in raw.named_modules():
            if isinstance(module, nn.Linear) and ".lora." not in name and not name.endswith((".lora.A", ".lora.B")):
                state[f"{name}.weight"] = module.weight.data.clone().cpu().half()
                if isinstance(getattr(module, "lora", None), LoRA):
                    delta = module.lora.scale * (module.lora.B.weight.data @ module.lora.A.weight.data)
                    state[f"{name}.weight"] += delta.cpu().half()
        head = getattr(raw, "lm_head", None)
        if isinstance(getattr(head, "lora", None), LoRA) and head.weight is getattr(
                getattr(getattr(raw, "model", None), "embed_tokens", None), "weight", None):
            import warnings

            warnings.warn(f"merge_lora: lm_head is square and tied to the embedding, and its adapter changed the head "
                          f"only, so {os.fspath(save_path)} holds an lm_head.weight that differs from the embedding: "
                          "load it with tie_word_embeddings=False (an untied model, as the adapted model computed).",
                          stacklevel=2)
        _atomic_save(state, save_path)
        return model
    raw = _unwrap(model)
    import collections

    uses = collections.Counter(id(p) for _, p in raw.named_parameters(remove_duplicate=False))
    shared = {key for key, count in uses.items() if count > 1}
    for name, layer in layers:
        delta = layer.lora.scale * (layer.lora.B.weight.float() @ layer.lora.A.weight.float())
        merged = (layer.weight.float() + delta).to(layer.weight.dtype)
        if id(layer.weight) in shared:  # a tied head (vocab == hidden): the adapter changed the head, not the embedding
            _untie(raw, layer, merged, name)
        else:
            layer.weight.copy_(merged)
        del layer.lora
        layer.__dict__.pop("forward", None)
    return model


def _untie(raw: nn.Module, layer: nn.Linear, merged: torch.Tensor, name: str) -> None:
    """Give ``layer`` (a head tied to the embedding) its own weight ``merged``: the adapter trained
    the head's path only, so folding it into the shared matrix would change the embedding too."""
    import warnings

    config = getattr(raw, "config", None)
    if layer is not getattr(raw, "lm_head", None) or config is None:
        raise ValueError(f"{name}'s weight is shared with another module, so merging its adapter would change that "
                         "module too; untie them first.")
    layer.weight = nn.Parameter(merged, requires_grad=layer.weight.requires_grad)
    config.tie_word_embeddings = False
    warnings.warn(f"merge_lora: {name} is square and tied to the embedding, and its adapter changed the head only; the "
                  "merged model is untied (config.tie_word_embeddings=False: the head is its own matrix, the embedding "
                  "is unchanged), as the adapted model computed.", stacklevel=3)


# ---------------------------------------------------------------------- the `lora` stage (chapter 10)
LORA_CONFIG = "ch10_lora"  # minimind_ref/configs/ch10_lora.json: the loop's settings of the shipped `lora` stage
# What the loop's config does not hold: the adapter's rank, the share of chapter-09 conversations
# rehearsed beside the new skill, the number of training conversations, the data seed.
STAGE_SETTINGS: Dict[str, Any] = {"rank": 16, "replay": 0.5, "n_train": 3000}


def lora_data(tokenizer: Any, n_train: int = 3000, n_val: int = 200, seed: int = 0, replay: float = 0.5,
              max_length: int = 128) -> Any:
    """The doubling skill (``chat_data.double_conversations``, a share ``replay`` of chapter-09
    exchanges mixed in) as a ``train.RunData`` of ``sft.SFTDataset`` (assistant-only labels):
    the training split and a validation split of held-out numbers / prompts."""
    from . import chat_data
    from .sft import SFTDataset
    from .train import RunData

    train_set = SFTDataset(chat_data.double_conversations(n_train, seed, "train", replay), tokenizer, max_length,
                           seed=seed)
    val_set = SFTDataset(chat_data.double_conversations(n_val, 0, "test", replay), tokenizer, max_length, seed=0)
    return RunData(tokenizer, train_set, val_set, [])


@torch.no_grad()
def double_accuracy(model: nn.Module, tokenizer: Any, exchanges: Optional[Sequence[Any]] = None) -> float:
    """Share of whole answers exactly right (greedy) on the doubling skill's held-out prompts
    (default: ``chat_data.double_eval_exchanges("test")``: the numbers whose doubling never
    occurs in any training text, in the 6 training and the 6 held-out phrasings)."""
    from . import chat_data
    from .sft import generate_replies

    exchanges = chat_data.double_eval_exchanges("test") if exchanges is None else list(exchanges)
    if not exchanges:
        raise ValueError("double_accuracy needs at least one exchange to score.")
    replies = generate_replies(model, tokenizer, [[{"role": "user", "content": ex.user}] for ex in exchanges],
                               max_new_tokens=16)
    return sum(r["text"].strip() == ex.answer for ex, r in zip(exchanges, replies)) / len(exchanges)


def train_lora(model: nn.Module, tokenizer: Any, cfg: Any = None, rank: int = 16, replay: float = 0.5,
               n_train: int = 3000, seed: int = 0, full: bool = False, **train_kwargs: Any) -> Any:
    """Teach ``model`` (in place) the doubling skill with ``minimind_ref.train``'s loop.

    ``full=False`` (LoRA, upstream's ``train_lora.py``): ``apply_lora(model, rank)`` then
    ``mark_only_lora_trainable``, so the loop's optimizer sees only the adapters.
    ``full=True``: every parameter trains (the comparison of chapter 10). The objective is the
    SFT next-token loss on assistant tokens. Returns the ``TrainResult``.
    """
    from .train import TrainConfig, train

    cfg = cfg if cfg is not None else TrainConfig.from_json(LORA_CONFIG)
    if full:
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        apply_lora(model, rank=rank)
        mark_only_lora_trainable(model)
    data = lora_data(tokenizer, n_train=n_train, seed=seed, replay=replay, max_length=cfg.seq_len)
    return train(cfg, model=model, data=data, **train_kwargs)


def build_stage(parent: nn.Module, tokenizer: Any, seed: int = 0) -> Tuple[nn.Module, Dict[str, Any], Any]:
    """The shipped ``lora`` stage (``python -m minimind_ref.stages rebuild lora``): ``train_lora``
    on the ``sft`` stage with ``LORA_CONFIG`` and ``STAGE_SETTINGS``, then ``merge_lora``; ``seed``
    draws the data, the adapters' initial ``A`` and the batch order (the shipped stage: 0). The
    file also records the adapter itself (upstream's keys, float32) and its own metrics."""
    import copy

    from .train import TrainConfig

    cfg = TrainConfig.from_json(LORA_CONFIG).replace(progress=False, out_dir=None, seed=seed)
    s = STAGE_SETTINGS
    before = double_accuracy(parent, tokenizer)
    model = copy.deepcopy(parent)
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # the adapters' A ~ N(0, 0.02)
        result = train_lora(model, tokenizer, cfg, rank=s["rank"], replay=s["replay"], n_train=s["n_train"],
                            seed=seed, log=lambda line: None)
    adapter = {k: v.detach().float().clone() for k, v in _lora_state_dict(model).items()}
    trainable = sum(v.numel() for v in adapter.values())
    with_adapter = double_accuracy(model, tokenizer)
    merge_lora(model)
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    metrics = {"double_accuracy": with_adapter, "double_accuracy_merged": double_accuracy(model, tokenizer),
               "double_accuracy_parent": before, "trainable_parameters": trainable,
               "total_parameters": sum(p.numel() for p in model.parameters()),
               "final_train_loss_mean20": sum(result.history["loss"][-20:]) / 20,
               "final_val_loss": result.history["eval_loss"][-1]}
    extra = {"recipe": "minimind_ref.lora:build_stage", "command": "python -m minimind_ref.stages rebuild lora",
             "train_config": cfg.to_dict(), "lora_settings": dict(s), "seed": seed, "metrics": metrics, "adapter": adapter,
             "loss_history": [round(v, 4) for v in result.history["loss"]]}
    return model, extra, tokenizer


def stage_adapter() -> Dict[str, torch.Tensor]:
    """The adapter recorded in the shipped ``lora`` stage (upstream's keys, float32): apply
    ``apply_lora(sft_model, rank)`` and load it to get the unmerged model back."""
    from .stages import stage_metadata

    return dict(stage_metadata("lora")["adapter"])


# ---------------------------------------------------------------------- the rank sweep (chapter 10's record)
SWEEP_FILE = os.path.join(os.path.dirname(__file__), "checkpoints", "lora_sweep.json")
SWEEP_COMMAND = "python -m minimind_ref.lora sweep --seeds 0,1,2"
#: The runs of the record: (name, rank or None for full fine-tuning, replay). All use the `lora`
#: stage's recipe otherwise (``LORA_CONFIG``, ``STAGE_SETTINGS["n_train"]``), from the shipped ``sft`` stage.
SWEEP_RUNS: Tuple[Tuple[str, Optional[int], float], ...] = (
    ("rank 1", 1, 0.5), ("rank 4", 4, 0.5), ("rank 16", 16, 0.5), ("rank 64", 64, 0.5), ("full", None, 0.5),
    ("rank 16, no replay", 16, 0.0), ("full, no replay", None, 0.0),
)
SWEEP_METRICS = ("double_accuracy", "sum_accuracy", "story_accuracy", "identity_accuracy", "refusal_accuracy",
                 "stop_rate", "preference_margin")


def rank_sweep(seeds: Sequence[int] = (0, 1, 2), out: Optional[str] = SWEEP_FILE,
               log: Any = print) -> Dict[str, Any]:
    """Chapter 10's rank sweep, too long for the chapter to run: every run of ``SWEEP_RUNS`` (LoRA
    of ranks 1 to 64 and full fine-tuning, with the recipe's rehearsal and without it) trained from
    the shipped ``sft`` stage with the ``lora`` stage's recipe, once per seed (the seed draws the
    data, the adapters' ``A`` and the batch order, as ``build_stage`` does), one torch thread, and
    evaluated on the stage report's held-out prompts (``stages.evaluate_chat``). Returns, and writes
    to ``out`` (JSON), ``{"command", "seeds", "settings", "runs": {name: {seed: {"metrics",
    "trainable", "seconds"}}}}``. About 5 minutes per seed on a 2-core CPU. The seeds and ``out``
    are checked before the first run; ``out`` is written atomically after each seed
    (``files.write_text``)."""
    import copy
    import json
    import time

    from .files import check_writable, write_text
    from .stages import evaluate_chat, load_stage
    from .train import TrainConfig

    seeds = _check_seeds(seeds)
    if out is not None:
        out = check_writable(out, "the sweep record (--out)")
    parent, tokenizer = load_stage("sft")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    record: Dict[str, Any] = {"command": "python -m minimind_ref.lora sweep --seeds " + ",".join(map(str, seeds)),
                              "seeds": list(seeds), "torch": str(torch.__version__),
                              "settings": {"config": LORA_CONFIG, "n_train": STAGE_SETTINGS["n_train"],
                                           "runs": [list(r) for r in SWEEP_RUNS]},
                              "runs": {name: {} for name, _, _ in SWEEP_RUNS}}
    try:
        for seed in seeds:
            cfg = TrainConfig.from_json(LORA_CONFIG).replace(progress=False, out_dir=None, seed=seed)
            for name, rank, replay in SWEEP_RUNS:
                model = copy.deepcopy(parent)
                start = time.perf_counter()
                with torch.random.fork_rng():
                    torch.manual_seed(seed)  # the adapters' A ~ N(0, 0.02), as build_stage draws them
                    train_lora(model, tokenizer, cfg, rank=rank or 1, replay=replay, n_train=STAGE_SETTINGS["n_train"],
                               seed=seed, full=rank is None, log=lambda line: None)
                seconds = time.perf_counter() - start
                trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
                model.eval()
                metrics = evaluate_chat(model, tokenizer)
                record["runs"][name][str(seed)] = {"metrics": {k: metrics[k] for k in SWEEP_METRICS},
                                                   "trainable": trainable, "seconds": round(seconds, 1)}
                log(f"seed {seed}, {name}: {seconds:.0f} s, " + ", ".join(f"{k} {metrics[k]:.3f}" for k in SWEEP_METRICS))
            if out is not None:
                write_text(out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    finally:
        torch.set_num_threads(threads)
    return record


def _check_seeds(seeds: Any) -> List[int]:
    """The sweep's seeds as a list of distinct ints >= 0, or a ``ValueError`` (before any training)."""
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds must be a list of ints (e.g. [0, 1, 2]), got {seeds!r}.")
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of ints >= 0 (e.g. [0, 1, 2]), got {seeds!r}.")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds} repeat a seed: each seed's runs would overwrite the same entries.")
    return seeds


def _parse_seeds(text: str) -> List[int]:
    """``--seeds 0,1,2`` -> ``[0, 1, 2]`` (argparse turns a ``ValueError`` into a usage error)."""
    try:
        return _check_seeds([int(s) for s in text.split(",")])
    except ValueError as err:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated distinct seeds >= 0, e.g. 0,1,2 ({err})")


def load_sweep(path: Optional[str] = None) -> Dict[str, Any]:
    """The shipped rank-sweep record (``rank_sweep``); a file that is not one is a ``ValueError``."""
    from .files import expand, read_json

    path = expand(path) if path is not None else SWEEP_FILE
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no rank-sweep record at {path}: run `{SWEEP_COMMAND}`.")
    record = read_json(path, "rank-sweep record")
    if not (isinstance(record, dict) and str(record.get("command", "")).startswith("python -m minimind_ref.lora sweep")
            and isinstance(record.get("runs"), dict)):
        raise ValueError(f"{path} is not a rank-sweep record of `{SWEEP_COMMAND}` (its command is "
                         f"{record.get('command') if isinstance(record, dict) else None!r}).")
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m minimind_ref.lora", description="chapter 10's rank-sweep record")
    sub = p.add_subparsers(dest="command", required=True)
    sweep = sub.add_parser("sweep", help=f"re-create {os.path.basename(SWEEP_FILE)} (about 5 minutes per seed on a CPU)")
    sweep.add_argument("--seeds", default=[0, 1, 2], type=_parse_seeds, help="comma-separated seeds (default 0,1,2)")
    sweep.add_argument("--out", default=SWEEP_FILE, help="where to write the record")
    args = p.parse_args(argv)
    from .files import check_writable

    try:
        check_writable(args.out, "--out")
    except OSError as err:
        sweep.error(str(err))
    rank_sweep(args.seeds, out=args.out)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
