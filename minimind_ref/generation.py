"""Autoregressive generation: the decoding loop, the KV cache, and the sampling filters.

Each step turns the last position's logits ``[b, vocab]`` into one new token per row:

    repetition penalty -> (greedy argmax) or (temperature -> top-k -> top-p -> sample)

(the order Hugging Face ``transformers`` uses). With ``use_cache=True`` the prompt is processed
once and every later step feeds only the newest token plus the cache; with ``use_cache=False`` the
whole sequence is recomputed at every step. Both give the same tokens.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, Callable, Iterator, Optional

import torch

from .cache import preallocate


def check_sampling_settings(
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0
) -> None:
    """Raise ``TypeError``/``ValueError`` for a setting no sampler accepts, whether or not sampling
    is on (a ``temperature=-1`` that greedy decoding would ignore is still a mistake worth naming).

    ``temperature`` and ``repetition_penalty``: finite numbers > 0 (1.0 = off); ``top_k``: an int
    >= 0 (0 = off); ``top_p``: a number in (0, 1] (1.0 = off).
    """
    for name, value, off in (("temperature", temperature, "1.0"), ("repetition_penalty", repetition_penalty, "1.0")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number > 0 ({off} = off), got {value!r} ({type(value).__name__}).")
        if not (math.isfinite(value) and value > 0):
            extra = " For greedy decoding pass do_sample=False and leave temperature at 1.0." if name == "temperature" else ""
            raise ValueError(f"{name} must be a finite number > 0 ({off} = off), got {value!r}.{extra}")
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int >= 0 (0 = off), got {top_k!r} ({type(top_k).__name__}).")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}.")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        raise TypeError(f"top_p must be a number in (0, 1] (1.0 = off), got {top_p!r} ({type(top_p).__name__}).")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {top_p}.")


def apply_repetition_penalty(
    logits: torch.Tensor, previous_ids: torch.Tensor, penalty: float, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The repetition penalty as Hugging Face's ``RepetitionPenaltyLogitsProcessor`` applies it: for
    every token id that already occurs in the row, a positive logit is divided by ``penalty`` and a
    negative one multiplied (CTRL, Keskar et al. 2019, divides every such logit, which raises a
    negative one).

    ``logits`` ``[b, vocab]``; ``previous_ids`` ``[b, t]``; ``mask`` ``[b, t]`` (0 = padding, not counted).
    Returns a new tensor.
    """
    if penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {penalty}.")
    if penalty == 1.0:
        return logits
    ids = previous_ids
    if mask is not None:  # padding positions point at the first real token of the row instead
        first_real = mask.long().argmax(dim=-1, keepdim=True)
        ids = torch.where(mask.bool(), ids, ids.gather(1, first_real))
    seen = logits.gather(1, ids)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, ids, seen)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits of each row, set the rest to ``-inf`` (ties at the k-th
    value are kept). ``top_k = 0`` or ``>= vocab`` keeps everything; a negative or non-int ``top_k``
    is an error."""
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int >= 0 (0 = off), got {top_k!r} ({type(top_k).__name__}).")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}.")
    if top_k == 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most likely tokens whose
    probabilities sum to at least ``top_p``; the most likely token is always kept.
    ``top_p >= 1`` keeps everything."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of all more likely tokens
    remove_sorted = mass_before >= top_p
    remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def next_token_logits(
    logits: torch.Tensor,
    previous_ids: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """All processors applied in order; softmax of the result is the sampling distribution."""
    check_sampling_settings(temperature, top_k, top_p, repetition_penalty)
    logits = logits.float()
    if previous_ids is not None:
        logits = apply_repetition_penalty(logits, previous_ids, repetition_penalty, mask)
    logits = logits / temperature
    logits = top_k_filter(logits, top_k)
    logits = top_p_filter(logits, top_p)
    return logits


def sample_next_token(
    logits: torch.Tensor,
    previous_ids: Optional[torch.Tensor] = None,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    mask: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """One token id per row, ``[b]``, from last-position logits ``[b, vocab]``. The settings are
    validated (``check_sampling_settings``) even when ``do_sample=False`` ignores most of them."""
    if not do_sample:
        check_sampling_settings(temperature, top_k, top_p, repetition_penalty)
        if previous_ids is not None:
            logits = apply_repetition_penalty(logits.float(), previous_ids, repetition_penalty, mask)
        return logits.argmax(dim=-1)
    filtered = next_token_logits(logits, previous_ids, temperature, top_k, top_p, repetition_penalty, mask)
    probs = filtered.softmax(dim=-1)
    try:
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    except RuntimeError as err:
        if not bool(torch.isfinite(logits).all()):  # checked only on failure: no host sync per token
            raise FloatingPointError("the logits hold NaN/inf, so there is no distribution to sample from (NaN "
                                     "weights, or activations that overflowed).") from err
        raise


# ---------------------------------------------------------------------- the checks every decoder shares
# ``generate`` below, ``fast_decode.FastDecoder`` and ``graph_decode.GraphDecoder`` decode the same model three
# ways; they take their arguments, the position limit, the model's mode and non-finite logits through these
# functions, so a setting one of them refuses the others refuse with the same words.


def check_decoding_request(model: torch.nn.Module, input_ids: Any, max_new_tokens: Any,
                           eos_token_id: Any = None, pad_token_id: Any = None, attention_mask: Any = None,
                           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                           repetition_penalty: float = 1.0) -> int:
    """Validate one decoding request and return how many steps the position limit allows.

    ``max_new_tokens``: an int >= 0 (not a bool); the sampling settings as ``check_sampling_settings``;
    ``input_ids``: an integer tensor ``[batch, seq_len]`` with at least one token, on the model's
    device; ``eos_token_id`` / ``pad_token_id``: one token id of the vocabulary or None (a list of end
    tokens is refused: every decoder stops on one id); ``attention_mask``: 0/1, padding on the left
    only. The result is ``min(max_new_tokens, max_position_embeddings - seq_len)`` (never below 0):
    the sequence never grows past what the model can hold (``warn_position_limit`` says so when a
    run reaches it)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r} ({type(max_new_tokens).__name__}).")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens}.")
    check_sampling_settings(temperature, top_k, top_p, repetition_penalty)
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids [batch, seq_len], got {type(input_ids).__name__}.")
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a tensor of token ids [batch, seq_len] with at least one token, got "
            f"{tuple(input_ids.shape)}; use input_ids.unsqueeze(0) for a single prompt."
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids (torch.long), got {input_ids.dtype}.")
    param = next(iter(model.parameters()), None)
    if param is not None and input_ids.device != param.device:
        raise ValueError(f"input_ids are on {input_ids.device}, the model on {param.device}; move them with "
                         f".to({str(param.device)!r}).")
    config = getattr(model, "config", None)
    vocab_size = getattr(config, "vocab_size", None)
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        _check_token_id(name, value, vocab_size)
    if attention_mask is not None:
        _check_left_padding(attention_mask, input_ids)
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions is None:
        return max_new_tokens
    return min(max_new_tokens, max(max_positions - input_ids.shape[1], 0))


def warn_position_limit(caller: str, steps: int, max_new_tokens: int, max_positions: Optional[int],
                        stacklevel: int = 3) -> None:
    """The warning every decoder gives when a run took all the ``steps`` the position limit allowed
    and that was fewer than asked (nothing when ``steps == max_new_tokens``)."""
    if steps < max_new_tokens:
        warnings.warn(
            f"{caller} stopped after {steps} of max_new_tokens={max_new_tokens} new tokens: the sequence "
            f"reached max_position_embeddings={max_positions}, the most positions the model can hold. "
            "The tokens generated so far are returned; shorten the prompt to get more.",
            stacklevel=stacklevel,
        )


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Decode in eval mode whatever mode the model is in (dropout off: a model left in train mode
    would otherwise decode with dropout), and put the mode back afterwards. Every decoder does this:
    they switch, they do not refuse."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def check_first_logits(model: torch.nn.Module, logits: torch.Tensor, step: int = 0,
                       finished: Optional[torch.Tensor] = None) -> None:
    """The first step's logits ``[b, vocab]`` must be finite: NaN weights show here, and a token
    chosen from NaN logits is meaningless (argmax gives token 0 forever). One host read. (``generate``
    with a ``callback`` checks every ``step`` so: a token handed to the callback is never taken back;
    rows already ``finished`` are not counted.)"""
    bad = ~torch.isfinite(logits).all(dim=-1)
    if finished is not None:
        bad = bad & ~finished
    if bool(bad.any()):
        raise _nonfinite_logits(model, bad, step)


def flag_nonfinite(flag: torch.Tensor, logits: torch.Tensor, finished: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``flag | rows of logits [b, vocab] that are not finite`` (rows already finished excluded): kept
    on the device, no host read per token; ``raise_if_nonfinite`` reads it once at the end."""
    bad = ~torch.isfinite(logits).all(dim=-1)
    if finished is not None:
        bad = bad & ~finished
    return flag | bad


def raise_if_nonfinite(model: torch.nn.Module, flag: torch.Tensor) -> None:
    """Raise ``FloatingPointError`` when some step's logits were NaN/inf (``flag_nonfinite``): the
    tokens chosen from them are never returned."""
    if bool(flag.any()):
        raise _nonfinite_logits(model, flag.reshape(-1), None)


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    eos_token_id: Optional[int] = None,
    pad_token_id: Optional[int] = None,
    use_cache: bool = True,
    generator: Optional[torch.Generator] = None,
    callback: Optional[Callable[[torch.Tensor], None]] = None,
    preallocate_cache: bool = True,
) -> torch.Tensor:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` ``[b, s]``.

    * ``do_sample=False``: greedy; otherwise sample with ``temperature``, ``top_k``, ``top_p``.
    * ``eos_token_id``: a row that emits it is finished; later positions of that row are filled
      with ``pad_token_id`` (default: ``eos_token_id``); generation stops when every row is done.
    * ``attention_mask`` ``[b, s]``: 1 for real tokens, 0 for (left) padding.
    * ``callback(tokens)``: called after every step with the new tokens ``[b]`` (for streaming).
    * ``preallocate_cache``: after the prompt, move the cache into buffers sized for the whole
      generation so each step writes one position instead of concatenating (same values).

    The sequence never grows past the model's ``config.max_position_embeddings``: the cache is
    allocated for at most that many positions, and a run that reaches the limit stops there and
    returns what it generated, with a warning. Every setting is validated before the first step
    (``check_decoding_request``, the check ``FastDecoder`` and ``GraphDecoder`` share:
    ``check_sampling_settings``; ``pad_token_id`` and ``eos_token_id`` must be single ids of the
    vocabulary; the mask must hold 0/1 with padding on the left only). The model decodes in eval
    mode (``eval_mode``: dropout off), its own mode restored afterwards. Logits that are NaN/inf
    raise ``FloatingPointError`` (at the first step at once; later, once at the end, or at once
    when a ``callback`` streams the tokens), so no token chosen from them is returned.

    Returns ``[b, s + n]`` with ``n <= max_new_tokens`` the number of steps taken.
    """
    steps = check_decoding_request(model, input_ids, max_new_tokens, eos_token_id, pad_token_id, attention_mask,
                                   temperature, top_k, top_p, repetition_penalty)
    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    with eval_mode(model):
        if pad_token_id is None:
            pad_token_id = eos_token_id if eos_token_id is not None else 0
        batch = input_ids.shape[0]
        ids = input_ids
        mask = attention_mask
        finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        nonfinite = torch.zeros(batch, dtype=torch.bool, device=ids.device)  # rows whose logits were NaN/inf
        past = None
        step_input = ids
        for step in range(steps):
            if use_cache:
                out = model(step_input, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=1)
                past = out.past_key_values
                if preallocate_cache and step_input is ids:  # after the prompt: room for every new token
                    past = preallocate(past, ids.shape[1] + steps)
            else:
                out = model(ids, attention_mask=mask, logits_to_keep=1)
            logits = out.logits[:, -1, :]
            if step == 0 or callback is not None:  # NaN weights show at once; a streamed token is never taken back
                check_first_logits(model, logits, step, finished)
            else:  # later steps: one flag on the device, read once at the end (no host sync per token)
                nonfinite = flag_nonfinite(nonfinite, logits, finished)
            token = sample_next_token(
                logits, ids, do_sample, temperature, top_k, top_p, repetition_penalty, mask, generator
            )
            if eos_token_id is not None:
                token = torch.where(finished, torch.full_like(token, pad_token_id), token)
                finished = finished | (token == eos_token_id)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
            step_input = token[:, None]
            if callback is not None:
                callback(token)
            if eos_token_id is not None and bool(finished.all()):
                break
        else:
            raise_if_nonfinite(model, nonfinite)
            warn_position_limit("generate", steps, max_new_tokens, max_positions, stacklevel=4)
        raise_if_nonfinite(model, nonfinite)
        return ids


def _nonfinite_logits(model: torch.nn.Module, rows: torch.Tensor, step: Optional[int]) -> FloatingPointError:
    bad_weights = [name for name, p in model.named_parameters() if p.is_floating_point() and not bool(torch.isfinite(p).all())]
    where = f"at step {step}" if step is not None else "during generation"
    cause = (f"the model's weights hold NaN/inf (e.g. {bad_weights[0]!r}, {len(bad_weights)} tensor(s)): load them with "
             "check_finite=True, or use a checkpoint from before the run diverged" if bad_weights else
             "the activations overflowed (a float16 model? try float32 or bfloat16)")
    return FloatingPointError(f"the model's logits are NaN/inf {where} in row(s) {rows.nonzero().flatten().tolist()[:8]}, "
                              f"so every token chosen from them would be meaningless (greedy picks token 0): {cause}.")


def _check_token_id(name: str, value: Any, vocab_size: Optional[int]) -> None:
    if value is None:
        return
    if isinstance(value, (list, tuple, set)):
        raise TypeError(f"{name} must be a single int token id or None, got {value!r}: the decoders stop on one "
                        "end token (MiniMind's is <|im_end|> = 2); pass one id.")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a single int token id or None, got {value!r} ({type(value).__name__}).")
    if value < 0 or (vocab_size is not None and value >= vocab_size):
        upper = f"{vocab_size - 1}" if vocab_size is not None else "vocab_size - 1"
        raise ValueError(
            f"{name}={value} is not a token id of the model's vocabulary [0, {upper}]; pass a real token "
            "(MiniMind pads with <|endoftext|> = 0 and ends with <|im_end|> = 2)."
        )


def _check_left_padding(attention_mask: torch.Tensor, input_ids: torch.Tensor) -> None:
    """The mask holds 0/1, padding only at the start of each row, and every row has a real last token."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must be a tensor shaped like input_ids {tuple(input_ids.shape)}, got {shape}.")
    m = attention_mask.long() if attention_mask.dtype == torch.bool else attention_mask
    binary, left, last_real = torch.stack([
        ((m == 0) | (m == 1)).all(), (m[:, 1:] >= m[:, :-1]).all(), (m[:, -1] == 1).all()
    ]).tolist()  # one host read
    if not binary:
        raise ValueError("attention_mask must hold only 1 (token) and 0 (padding).")
    if not left:
        raise ValueError(
            "attention_mask has padding (0) after a real token (1): generate continues every row from its last "
            "position, so pad on the left (tokenizer padding_side='left', mask like [0, 0, 1, 1, 1])."
        )
    if not last_real:
        raise ValueError("attention_mask has a row of padding only (no real token); drop that row or give it a prompt.")
