"""Checks for chapter 09 (supervised fine-tuning): MiniMind's chat template, the assistant-only
loss mask, and the masked next-token loss.

Each check runs the learner's function on conversations / ids / logits it makes itself and
compares with ``minimind_ref.sft`` (upstream's ``tokenizer_config.json`` template and
``dataset/lm_dataset.py`` ``generate_labels`` at c090b69); a mismatch names the known mistake it
matches when it can.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.nn.functional as F

from .. import sft as ref_sft
from .core import call, check, check_close, check_equal, fail, seeded, solution

S, E = ref_sft.IM_START, ref_sft.IM_END


# ---------------------------------------------------------------------- 9.1 the chat template
def _turn(role: str, content: str) -> str:
    return f"{S}{role}\n{content}{E}\n"


def _render_no_default(messages, add_generation_prompt=False):
    text = "".join(_turn(m["role"], m["content"]) for m in messages)
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _render_no_newline(messages, add_generation_prompt=False):
    return ref_sft.render_chat(messages, add_generation_prompt).replace(f"{E}\n", E)


def _render_period(messages, add_generation_prompt=False):
    return ref_sft.render_chat(messages, add_generation_prompt).replace(
        f"system\n{ref_sft.DEFAULT_SYSTEM_PROMPT}{E}", f"system\n{ref_sft.DEFAULT_SYSTEM_PROMPT}.{E}")


def _render_system_twice(messages, add_generation_prompt=False):
    head = "" if messages[0]["role"] == "system" else _turn("system", ref_sft.DEFAULT_SYSTEM_PROMPT)
    text = head + "".join(_turn(m["role"], m["content"]) for m in messages)
    if messages[0]["role"] == "system":
        text = _turn("system", messages[0]["content"]) + text
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _render_no_gen_prompt(messages, add_generation_prompt=False):
    return ref_sft.render_chat(messages, False)


def _render_gen_prompt_no_newline(messages, add_generation_prompt=False):
    text = ref_sft.render_chat(messages, False)
    return text + (f"{S}assistant" if add_generation_prompt else "")


RENDER_MISTAKES = {
    "no default system prompt (with no system message the template adds "
    f"'{S}system\\n{ref_sft.DEFAULT_SYSTEM_PROMPT}{E}\\n')": _render_no_default,
    f"a missing newline after {E} (every turn ends with '{E}\\n')": _render_no_newline,
    f"a period after the default system prompt (upstream's is exactly '{ref_sft.DEFAULT_SYSTEM_PROMPT}')": _render_period,
    "the first system message rendered twice (it replaces the default header; it is not a turn of its own)":
        _render_system_twice,
    f"add_generation_prompt ignored (it appends '{S}assistant\\n')": _render_no_gen_prompt,
    f"the generation prompt without its newline ('{S}assistant\\n')": _render_gen_prompt_no_newline,
}

RENDER_CASES: List[Dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "What is 37 plus 45?"}, {"role": "assistant", "content": "37+45=082"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
                  {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "u1"},
                  {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "a later system turn"},
                  {"role": "user", "content": "v"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": ""}], "add_generation_prompt": False},
]


solution("9.1", f"start with '{S}system\\n' + (messages[0]['content'] if it is a system message else "
                f"'{ref_sft.DEFAULT_SYSTEM_PROMPT}') + '{E}\\n', add every other message as a turn, "
                f"then '{S}assistant\\n' if add_generation_prompt.")


@check("Exercise 9.1 render_chat")
def check_render_chat(render_chat: Callable[..., Any]) -> str:
    """``render_chat(messages, add_generation_prompt)`` must return exactly the string of
    ``minimind_ref.sft.render_chat`` (upstream's template, no tools) and leave ``messages`` as it was."""
    name = "Exercise 9.1 render_chat"
    for n, c in enumerate(RENDER_CASES):
        messages, gen = c["messages"], c["add_generation_prompt"]
        case = f"case {n}: {[m['role'] for m in messages]}, add_generation_prompt={gen}"
        got = call(render_chat, [dict(m) for m in messages], gen, name=name, case=case, check_inputs=True,
                   hint="build the string piece by piece: the system header first, then one block per message.")
        if not isinstance(got, str):
            fail(name, f"expected a str, got {type(got).__name__}: {got!r:.80} ({case})", "return the rendered string.")
        expected = ref_sft.render_chat(messages, gen)
        check_equal(got, expected, name=name, case=case,
                    mistakes={d: (lambda f=f: f(messages, gen)) for d, f in RENDER_MISTAKES.items()},
                    hint=f"every turn is '{S}' + role + '\\n' + content + '{E}' + '\\n'; a first system message "
                         "replaces the default system prompt; the generation prompt opens an assistant turn.")
    return f"{len(RENDER_CASES)} conversations (default and custom system prompt, multi-turn, generation prompt)"


# ---------------------------------------------------------------------- 9.2 the loss mask
def _mask_from_header(ids, bos, eos, max_length):  # counts "<|im_start|>assistant\n" too
    mask = ref_sft.assistant_loss_mask(ids, bos, eos, max_length)
    out = list(mask)
    i = 0
    while i < len(ids):
        if list(ids[i:i + len(bos)]) == list(bos):
            for j in range(i, min(i + len(bos), max_length, len(ids))):
                out[j] = 1
            i += len(bos)
        else:
            i += 1
    return out


def _mask_without(ids, bos, eos, max_length, drop):  # drops the last `drop` tokens of each counted run
    mask = ref_sft.assistant_loss_mask(ids, bos, eos, max_length)
    out = list(mask)
    i = 0
    while i < len(ids):
        if list(ids[i:i + len(eos)]) == list(eos) and i > 0 and mask[i - 1] == 1:
            for j in range(i + len(eos) - drop, min(i + len(eos), len(ids))):
                out[j] = 0
            i += len(eos)
        else:
            i += 1
    return out


def _mask_first_only(ids, bos, eos, max_length):
    mask = ref_sft.assistant_loss_mask(ids, bos, eos, max_length)
    out, seen_end = [], False
    for j, m in enumerate(mask):
        if seen_end:
            out.append(0)
            continue
        out.append(m)
        if m == 1 and (j + 1 == len(mask) or mask[j + 1] == 0):
            seen_end = True
    return out


def _mask_ignores_max_length(ids, bos, eos, max_length):
    return ref_sft.assistant_loss_mask(ids, bos, eos, len(ids) + 10)


def _mask_all(ids, bos, eos, max_length):
    return [1] * len(ids)


def _mask_truncated_dropped(ids, bos, eos, max_length):  # a reply without its end marker does not count
    mask = list(ref_sft.assistant_loss_mask(ids, bos, eos, max_length))
    j = len(mask)
    while j > 0 and mask[j - 1] == 1:
        j -= 1
    if j < len(mask) and list(ids[len(ids) - len(eos):]) != list(eos):
        for k in range(j, len(mask)):
            mask[k] = 0
    return mask


MASK_MISTAKES = {
    "the '<|im_start|>assistant\\n' header counted (counting starts at the first token AFTER the header)": _mask_from_header,
    "the end marker left out (the reply's <|im_end|> and the newline after it count: the model must learn to stop)":
        lambda ids, bos, eos, m: _mask_without(ids, bos, eos, m, len(eos)),
    "the newline after <|im_end|> left out (upstream counts the whole end marker '<|im_end|>\\n')":
        lambda ids, bos, eos, m: _mask_without(ids, bos, eos, m, 1),
    "only the first assistant reply counted (every assistant turn counts)": _mask_first_only,
    "max_length ignored (nothing at or past max_length counts)": _mask_ignores_max_length,
    "every token counted (system and user turns must not count)": _mask_all,
    "a reply cut off before its end marker not counted (it counts to the end of the sequence)": _mask_truncated_dropped,
}


def _mask_cases() -> List[Dict[str, Any]]:
    """Token-id conversations with multi-token markers: bos = [1, 7, 8] ("<|im_start|>assistant\\n"),
    eos = [2, 9] ("<|im_end|>\\n"); 1 alone (another role's header) and 2 followed by other tokens
    must not match."""
    bos, eos = [1, 7, 8], [2, 9]
    system, user = [1, 5, 8, 40, 41, 2, 9], [1, 6, 8, 50, 51, 52, 2, 9]
    one = system + user + bos + [60, 61, 62] + eos
    two = system + user + bos + [60, 2, 61] + eos + user + bos + [70, 71] + eos
    cut = system + user + bos + [60, 61, 62, 63, 64]
    g = seeded(9)
    rand = list(system)
    for _ in range(3):
        rand += user + bos + [int(t) for t in torch.randint(10, 99, (int(torch.randint(1, 6, (1,), generator=g)),),
                                                              generator=g)] + eos
    return [dict(c, bos=bos, eos=eos) for c in [
        {"ids": one, "max_length": 64, "case": "one reply"},
        {"ids": two, "max_length": 64, "case": "two replies (the first contains a lone 2 that is not the end marker)"},
        {"ids": cut, "max_length": 64, "case": "a reply cut off before its end marker"},
        {"ids": two, "max_length": len(system + user + bos) + 2, "case": "max_length inside the first reply"},
        {"ids": user + [60, 61] + eos, "max_length": 64, "case": "no assistant turn at all"},
        {"ids": rand, "max_length": len(rand) - 1, "case": "three random replies, max_length one short"},
    ]]


solution("9.2", "start = i + len(bos); end = start; while end < len(ids) and ids[end:end+len(eos)] != eos: "
                "end += 1; set mask[j] = 1 for j in range(start, min(end + len(eos), max_length, len(ids))); "
                "continue scanning at end + len(eos).")


@check("Exercise 9.2 assistant_loss_mask")
def check_assistant_loss_mask(assistant_loss_mask: Callable[..., Any]) -> str:
    """``assistant_loss_mask(input_ids, bos_ids, eos_ids, max_length)`` must equal
    ``minimind_ref.sft.assistant_loss_mask`` (upstream's ``generate_labels`` positions) as a list of
    0/1 ints, one per token, and leave its inputs unchanged."""
    name = "Exercise 9.2 assistant_loss_mask"
    cases = _mask_cases()
    for c in cases:
        ids, bos, eos, max_length = c["ids"], c["bos"], c["eos"], c["max_length"]
        case = f"{c['case']}: ids={ids}, max_length={max_length}"
        got = call(assistant_loss_mask, list(ids), list(bos), list(eos), max_length, name=name, case=case,
                   check_inputs=True, hint="scan with an index i; when ids[i:i+len(bos)] == bos, find the next eos.")
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)):
            fail(name, f"expected a list of 0/1, got {type(got).__name__}: {got!r:.80} ({case})", "return the mask list.")
        got = [int(v) for v in got]
        expected = ref_sft.assistant_loss_mask(ids, bos, eos, max_length)
        check_equal(got, expected, name=name, case=case,
                    mistakes={d: (lambda f=f: list(f(ids, bos, eos, max_length))) for d, f in MASK_MISTAKES.items()},
                    hint="counting starts right after the assistant header and runs through the whole end marker "
                         "(the reply, <|im_end|> and the newline); a reply without an end marker counts to the end; "
                         "never at or past max_length.")
    return f"{len(cases)} sequences (multi-turn, multi-token markers, cut-off reply, max_length)"


# ---------------------------------------------------------------------- 9.3 the masked loss
def _loss_cases() -> List[Dict[str, Any]]:
    out = []
    for seed, (b, t, v) in enumerate([(2, 7, 11), (3, 12, 17), (1, 5, 9)]):
        g = seeded(100 + seed)
        logits = torch.randn(b, t, v, generator=g) * 2.0
        ids = torch.randint(0, v, (b, t), generator=g)
        labels = torch.full_like(ids, -100)
        for row in range(b):  # a reply of unequal length in every row
            start = int(torch.randint(1, t - 1, (1,), generator=g))
            labels[row, start:] = ids[row, start:]
            labels[row, t - int(torch.randint(0, 2, (1,), generator=g)):] = -100
        out.append({"logits": logits, "labels": labels, "case": f"logits {tuple(logits.shape)}, replies of unequal length"})
    return out


def _loss_mistakes(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    v = logits.shape[-1]
    shifted_logits, shifted_labels = logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1)
    per = F.cross_entropy(shifted_logits, shifted_labels.clamp_min(0), reduction="none") * (shifted_labels != -100)

    def per_row() -> torch.Tensor:
        p = per.view(labels.shape[0], -1)
        return (p.sum(1) / (labels[:, 1:] != -100).sum(1)).mean()

    return {
        "no shift (logits[:, t] must predict labels[:, t + 1])":
            lambda: F.cross_entropy(logits.reshape(-1, v), labels.reshape(-1), ignore_index=-100),
        "masked positions zeroed but the mean taken over every position (divide by the number of supervised tokens)":
            lambda: per.sum() / per.numel(),
        "a mean per conversation, then over the batch (upstream averages over all supervised tokens of the batch)":
            per_row,
        "the shift in the wrong direction (logits[:, 1:] against labels[:, :-1])":
            lambda: F.cross_entropy(logits[:, 1:].reshape(-1, v), labels[:, :-1].reshape(-1), ignore_index=-100),
    }


solution("9.3", "F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100)")


@check("Exercise 9.3 sft_loss")
def check_sft_loss(sft_loss: Callable[..., Any]) -> str:
    """``sft_loss(logits [b, t, v], labels [b, t])`` must equal the model's own loss,
    ``F.cross_entropy(logits[:, :-1], labels[:, 1:], ignore_index=-100)`` (the mean over every
    supervised token of the batch), within rtol = atol = 1e-5, and keep the gradient."""
    name = "Exercise 9.3 sft_loss"
    cases = _loss_cases()
    for c in cases:
        logits, labels, case = c["logits"], c["labels"], c["case"]
        x = logits.clone().requires_grad_(True)
        got = call(sft_loss, x, labels.clone(), name=name, case=case, check_inputs=True,
                   hint="F.cross_entropy wants logits [N, vocab] and targets [N]; mind which position predicts "
                        "which label.")
        v = logits.shape[-1]
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1), ignore_index=-100)
        check_close(got, expected, name=name, case=case, rtol=1e-5, atol=1e-5, mistakes=_loss_mistakes(logits, labels),
                    hint="the labels are the token ids, -100 where the loss does not count; the model predicts the "
                         "NEXT token, so compare position t's logits with the label at t + 1.")
        if not got.requires_grad:
            fail(name, f"the loss has no gradient ({case})", "compute it from the logits with torch operations "
                 "(no .item(), no .detach(), no torch.no_grad()).")
    return f"{len(cases)} batches, replies of unequal length, rtol = atol = 1e-5, gradient kept"


def check_all(render_chat: Callable[..., Any], assistant_loss_mask: Callable[..., Any], sft_loss: Callable[..., Any]) -> None:
    check_render_chat(render_chat)
    check_assistant_loss_mask(assistant_loss_mask)
    check_sft_loss(sft_loss)
