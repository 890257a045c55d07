"""Checks for chapter 09 (supervised fine-tuning): c090b69's chat template (9.1), d65ef2c's loss
mask (9.2), the masked next-token loss (9.3), replies that begin with whitespace (9.4: which
conversations d65ef2c's rule leaves without a label; 9.5: the course's mask, which keeps every reply
whole) and minimind-3's assistant turn inferred from examples (9.6).

Each check runs the learner's function on conversations / ids / logits it makes itself and
compares with ``minimind_ref.sft`` (upstream's templates and ``generate_labels``, whose parity with
upstream's own code the tests prove). A failure names the known mistake it matches when it can and
says where the output goes wrong (the case, the position, the part of the string) without showing
the expected output; the worked solution only through ``show_solution``.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from .. import sft as ref_sft
from .. import chat_template as ref_template
from .. import loss_mask as ref_mask
from .core import _on, call, check, check_close, fail, seeded, solution
from .delegation import guarded

S, E = ref_sft.IM_START, ref_sft.IM_END


# ---------------------------------------------------------------------- 9.1 the chat template
def _turn(role: str, content: str) -> str:
    return f"{S}{role}\n{content}{E}\n"


def _render_no_default(messages, add_generation_prompt=False):
    text = "".join(_turn(m["role"], m["content"]) for m in messages)
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _m2(messages, add_generation_prompt=False):
    return ref_sft.render_chat(messages, add_generation_prompt, template="minimind2")


def _render_no_newline(messages, add_generation_prompt=False):
    return _m2(messages, add_generation_prompt).replace(f"{E}\n", E)


def _render_period(messages, add_generation_prompt=False):
    return _m2(messages, add_generation_prompt).replace(
        f"system\n{ref_sft.DEFAULT_SYSTEM_PROMPT}{E}", f"system\n{ref_sft.DEFAULT_SYSTEM_PROMPT}.{E}")


def _render_system_twice(messages, add_generation_prompt=False):
    head = "" if messages[0]["role"] == "system" else _turn("system", ref_sft.DEFAULT_SYSTEM_PROMPT)
    text = head + "".join(_turn(m["role"], m["content"]) for m in messages)
    if messages[0]["role"] == "system":
        text = _turn("system", messages[0]["content"]) + text
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _render_empty_system_default(messages, add_generation_prompt=False):
    """A first system message kept only when it has text: an empty one gets the default prompt, then a turn."""
    if messages[0]["role"] == "system" and messages[0]["content"]:
        return _m2(messages, add_generation_prompt)
    text = _turn("system", ref_sft.DEFAULT_SYSTEM_PROMPT) + "".join(_turn(m["role"], m["content"]) for m in messages)
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _render_no_gen_prompt(messages, add_generation_prompt=False):
    return _m2(messages, False)


def _render_gen_prompt_no_newline(messages, add_generation_prompt=False):
    text = _m2(messages, False)
    return text + (f"{S}assistant" if add_generation_prompt else "")


RENDER_MISTAKES = {
    "no default system prompt (c090b69's template adds one when the conversation has no system message)":
        _render_no_default,
    f"a missing newline after {E} (every turn ends with one)": _render_no_newline,
    "a period after the default system prompt (upstream's has none)": _render_period,
    "the first system message rendered twice (it replaces the default header; it is not a turn of its own)":
        _render_system_twice,
    "an empty first system message taken for no system message (it replaces the default prompt all the same, with "
    "nothing in it)": _render_empty_system_default,
    "add_generation_prompt ignored": _render_no_gen_prompt,
    "the generation prompt without its newline": _render_gen_prompt_no_newline,
}


def _render_region(text: str, k: int) -> str:
    """Which turn of a rendered conversation ``text`` position ``k`` falls in."""
    starts = [j for j in range(len(text)) if text.startswith(S, j)]
    before = [j for j in starts if j <= k]
    if not before:
        return "the start of the string"
    opened = before[-1]
    role = text[opened + len(S):].split("\n", 1)[0]
    turn = len(before)
    if text.find(E, opened) == -1 or k > text.find(E, opened) + len(E):
        return f"after turn {turn} ({role})" if text.find(E, opened) != -1 else f"turn {turn} ({role}, the generation prompt)"
    return f"turn {turn} ({role})"


def _string_failure(name: str, got: str, expected: str, seen: Any, region: str, case: str, hint: str) -> None:
    """Fail with where ``got`` first differs from ``expected`` and the learner's own text there
    (never the expected text)."""
    k = next((j for j in range(min(len(got), len(expected))) if got[j] != expected[j]), min(len(got), len(expected)))
    yours = got[max(0, k - 12):k + 12]
    fail(name, (f"this looks like {seen}: " if seen else "")
         + f"your string differs from the template's at character {k}, in {region(expected, k)} "
         f"(yours there: {yours!r}){_on(case)}", hint)

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
    {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "u"}], "add_generation_prompt": True},
]


# what would answer 9.1 and 9.6 without any of the work: the package's renderer and its pieces
TEMPLATE_FUNCTIONS = {"minimind_ref.sft.render_chat": ref_template.render_chat,
                      "minimind_ref.sft.chat_segments": ref_template.chat_segments,
                      "minimind_ref.chat_template's assistant body": ref_template._assistant_body}

solution("9.1", f"start with '{S}system\\n' + (messages[0]['content'] if it is a system message else "
                f"'{ref_sft.DEFAULT_SYSTEM_PROMPT}') + '{E}\\n', add every other message as a turn, "
                f"then '{S}assistant\\n' if add_generation_prompt.")


@check("Exercise 9.1 render_chat")
def check_render_chat(render_chat: Callable[..., Any]) -> str:
    """``render_chat(messages, add_generation_prompt)`` must return exactly the string of
    ``minimind_ref.sft.render_chat(..., template="minimind2")`` (c090b69's template, no tools) and
    leave ``messages`` as it was (``check_render_assistant_turn``: d65ef2c's assistant turn)."""
    name = "Exercise 9.1 render_chat"
    for n, c in enumerate(RENDER_CASES):
        messages, gen = c["messages"], c["add_generation_prompt"]
        case = f"case {n}: {[m['role'] for m in messages]}, add_generation_prompt={gen}"
        got = call(guarded(render_chat, name, TEMPLATE_FUNCTIONS), [dict(m) for m in messages], gen, name=name, case=case, check_inputs=True,
                   hint="look at the case named above.")
        if not isinstance(got, str):
            fail(name, f"expected a str, got {type(got).__name__}: {got!r:.80} ({case})", "return the rendered string.")
        expected = _m2(messages, gen)
        if got != expected:
            seen = next((d for d, f in RENDER_MISTAKES.items() if f(messages, gen) == got), None)
            _string_failure(name, got, expected, seen, _render_region, case,
                            "compare that turn with the template of section 2, character by character.")
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


def _mask_position(ids: Sequence[int], bos: Sequence[int], eos: Sequence[int], k: int, max_length: int) -> str:
    """What position ``k`` of a 9.2 case is, in words."""
    bos, eos = list(bos), list(eos)
    if k >= max_length:
        return "at or past max_length"
    for j in range(len(ids)):
        if list(ids[j:j + len(bos)]) == bos and j <= k < j + len(bos):
            return "inside the assistant header"
        if list(ids[j:j + len(eos)]) == eos and j <= k < j + len(eos):
            return "in an end marker"
    opened = max((j for j in range(k + 1) if ids[j] == bos[0]), default=None)
    if opened is not None and list(ids[opened:opened + len(bos)]) == bos:
        return "in an assistant reply"
    return "in a system or user turn"


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
        {"ids": bos + [60, 61] + eos + user + bos + [70] + eos, "max_length": 64,
         "case": "a reply at the very start of the sequence, then another"},
    ]]


# what would answer 9.2, 9.4 and 9.5 without any of the work: the package's masks and what compares them
MASK_FUNCTIONS = {"minimind_ref.sft.assistant_loss_mask": ref_mask.assistant_loss_mask,
                  "minimind_ref.sft.upstream_loss_mask": ref_mask.upstream_loss_mask,
                  "minimind_ref.sft.rule_mask": ref_mask.rule_mask,
                  "minimind_ref.sft.reply_losses": ref_mask.reply_losses,
                  "minimind_ref.sft.unsupervised_replies": ref_mask.unsupervised_replies}

solution("9.2", "start = i + len(bos); end = start; while end < len(ids) and ids[end:end+len(eos)] != eos: "
                "end += 1; set mask[j] = 1 for j in range(start, min(end + len(eos), max_length, len(ids))); "
                "continue scanning at end + len(eos).")


@check("Exercise 9.2 assistant_loss_mask")
def check_assistant_loss_mask(assistant_loss_mask: Callable[..., Any]) -> str:
    """``assistant_loss_mask(input_ids, bos_ids, eos_ids, max_length)`` must equal
    ``minimind_ref.sft.upstream_loss_mask(..., "d65ef2c")`` (d65ef2c's ``generate_labels`` positions)
    as a list of 0/1 ints, one per token, and leave its inputs unchanged."""
    name = "Exercise 9.2 assistant_loss_mask"
    cases = _mask_cases()
    for c in cases:
        ids, bos, eos, max_length = c["ids"], c["bos"], c["eos"], c["max_length"]
        case = f"{c['case']}: ids={ids}, max_length={max_length}"
        got = call(guarded(assistant_loss_mask, name, MASK_FUNCTIONS), list(ids), list(bos), list(eos), max_length, name=name, case=case,
                   check_inputs=True, hint="look at the case named above.")
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)):
            fail(name, f"expected a list of 0/1, got {type(got).__name__}: {got!r:.80} ({case})", "return the mask list.")
        got = [int(v) for v in got]
        expected = ref_sft.upstream_loss_mask(ids, bos, eos, max_length, "d65ef2c")
        if len(got) != len(expected):
            fail(name, f"expected a list of 0/1, one per token ({len(ids)}), got {len(got)} values{_on(case)}",
                 "return one value per token.")
        if got != expected:
            seen = next((d for d, f in MASK_MISTAKES.items() if list(f(ids, bos, eos, max_length)) == got), None)
            k = next(j for j in range(len(ids)) if got[j] != expected[j])
            should = "should count but does not" if expected[k] else "counts but should not"
            fail(name, (f"this looks like {seen}: " if seen else "")
                 + f"position {k} ({_mask_position(ids, bos, eos, k, max_length)}) {should}{_on(case)}",
                 "look at the turn around that position and at section 4's rule.")
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
        "no shift (each position scored against its own label instead of the next one)":
            lambda: F.cross_entropy(logits.reshape(-1, v), labels.reshape(-1), ignore_index=-100),
        "masked positions zeroed but the mean taken over every position (divide by the number of supervised tokens)":
            lambda: per.sum() / per.numel(),
        "a mean per conversation, then over the batch (upstream averages over all supervised tokens of the batch)":
            per_row,
        "the shift in the wrong direction (each position scored against the label before it)":
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
                   hint="look at the shapes F.cross_entropy expects, and at which position predicts which label.")
        v = logits.shape[-1]
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1), ignore_index=-100)
        check_close(got, expected, name=name, case=case, rtol=1e-5, atol=1e-5, mistakes=_loss_mistakes(logits, labels),
                    hint="look at which position's logits predict which label, and at which labels count.")
        if not got.requires_grad:
            fail(name, f"the loss has no gradient ({case})", "compute it from the logits with torch operations "
                 "(no .item(), no .detach(), no torch.no_grad()).")
    return f"{len(cases)} batches, replies of unequal length, rtol = atol = 1e-5, gradient kept"


# ---------------------------------------------------------------------- 9.4 / 9.5 replies that begin with whitespace
# Synthetic ids: bos = [1, 7, 8] ("<|im_start|>assistant\n": 7 stands for "assistant", 8 is the newline),
# eos = [2, 8] ("<|im_end|>\n"); 30, 31 and 44 stand for tokens that swallowed the header's newline with
# the reply's leading whitespace ("\n   ", "\n\t", ...): the learner is not told which ids they are.
_BOS, _EOS = [1, 7, 8], [2, 8]
_SYSTEM, _USER = [1, 5, 8, 40, 41, 2, 8], [1, 6, 8, 50, 51, 52, 2, 8]
_OK, _MERGED_REPLY, _MERGED_REPLY2 = _BOS + [60, 61] + _EOS, [1, 7, 30, 62, 63] + _EOS, [1, 7, 31, 64] + _EOS


def _edge_sequences() -> List[Tuple[List[int], str]]:
    """(ids, what the sequence is) for Exercise 9.4."""
    return [
        (_SYSTEM + _USER + _OK, "one reply after its full marker"),
        (_SYSTEM + _USER + _MERGED_REPLY, "one reply whose first token swallowed the header's newline"),
        (_SYSTEM + _USER + _OK + _USER + _MERGED_REPLY2, "a reply after its full marker, then one whose first token "
                                                         "swallowed the newline"),
        (_USER + _OK + _USER + _OK, "two replies after their full markers"),
        (_SYSTEM + _USER + [1, 7, 44, 45] + _EOS, "one reply whose first token (44) swallowed the newline"),
        (_USER + _MERGED_REPLY + _USER + _MERGED_REPLY2, "two replies, each with a token that swallowed the newline"),
        (_SYSTEM + _USER, "no assistant turn"),
        (_SYSTEM + _USER + [1, 7, 30], "cut right after the first token of a reply that swallowed the newline: the "
                                        "assistant header sits at the very end"),
        (_SYSTEM + _USER + _OK + _USER + _BOS, "a reply, then a generation prompt: the full marker is the last thing "
                                                "in the sequence"),
        (_OK + _USER[:-3], "a reply, then a user turn cut before its end"),
        (_SYSTEM + _USER + _OK + _USER + _BOS[:-1], "a reply, then an assistant header that ends the sequence: nothing "
                                                     "follows the header"),
    ]


def lost_replies_reference(sequences: Sequence[Sequence[int]], bos_ids: Sequence[int], eos_ids: Sequence[int]) -> List[int]:
    """Indices of the sequences in which d65ef2c's rule (``sft.upstream_loss_mask``) leaves a reply
    without any label: an assistant header (``bos_ids`` without its last token, the newline) that
    is followed by a token other than that newline."""
    header, newline = list(bos_ids[:-1]), bos_ids[-1]
    out = []
    for n, ids in enumerate(sequences):
        ids = list(ids)
        if any(ids[j:j + len(header)] == header and ids[j + len(header)] != newline
               for j in range(len(ids) - len(header))):
            out.append(n)
    return out


def _lost_scan_short(sequences, bos, eos):  # both counts stop len(bos) short of the end
    out = []
    for n, ids in enumerate(sequences):
        headers = sum(ids[j:j + len(bos) - 1] == bos[:-1] for j in range(len(ids) - len(bos)))
        markers = sum(ids[j:j + len(bos)] == bos for j in range(len(ids) - len(bos)))
        if markers < headers:
            out.append(n)
    return out


def _lost_marker_scan_short(sequences, bos, eos):  # headers counted to the end, full markers not
    out = []
    for n, ids in enumerate(sequences):
        headers = sum(ids[j:j + len(bos) - 1] == bos[:-1] for j in range(len(ids)))
        markers = sum(ids[j:j + len(bos)] == bos for j in range(len(ids) - len(bos)))
        if markers < headers:
            out.append(n)
    return out


def _lost_any_turn(sequences, bos, eos):  # every <|im_start|> taken for an assistant header
    return [n for n, ids in enumerate(sequences)
            if sum(t == bos[0] for t in ids) > sum(ids[j:j + len(bos)] == bos for j in range(len(ids)))]


def _lost_end_markers(sequences, bos, eos):  # end markers compared with full markers (user turns end the same way)
    return [n for n, ids in enumerate(sequences)
            if sum(ids[j:j + len(eos)] == eos for j in range(len(ids))) > sum(ids[j:j + len(bos)] == bos
                                                                             for j in range(len(ids)))]


def _lost_headers_over_markers(sequences, bos, eos):  # more headers than full markers, wherever they sit
    return [n for n, ids in enumerate(sequences)
            if sum(ids[j:j + len(bos) - 1] == bos[:-1] for j in range(len(ids)))
            > sum(ids[j:j + len(bos)] == bos for j in range(len(ids)))]


def _lost_once_per_reply(sequences, bos, eos):
    header, out = bos[:-1], []
    for n, ids in enumerate(sequences):
        out += [n for j in range(len(ids) - len(header))
                if ids[j:j + len(header)] == header and ids[j + len(header)] != bos[-1]]
    return out


LOST_MISTAKES = {
    "a scan that stops short of the end of the sequence: an assistant header in the last positions is never seen":
        _lost_scan_short,
    "the full markers counted over fewer positions than the headers: a marker at the very end is missed":
        _lost_marker_scan_short,
    "an assistant header with nothing after it counted as a lost reply (a sequence cut right after the header has "
    "no reply there to lose)": _lost_headers_over_markers,
    "every <|im_start|> taken for an assistant header (system and user turns open with it too)": _lost_any_turn,
    "end markers compared with assistant markers (system and user turns end with <|im_end|> too)": _lost_end_markers,
    "a sequence listed once per lost reply (each index belongs in the list once)": _lost_once_per_reply,
    "the sequences whose replies ARE supervised listed instead of the others":
        lambda s, b, e: [n for n in range(len(s)) if n not in lost_replies_reference(s, b, e)],
}

solution("9.4", "header = bos_ids[:-1]; keep index n when some j in range(len(ids) - len(header)) has "
                "ids[j:j+len(header)] == header and ids[j+len(header)] != bos_ids[-1]")


@check("Exercise 9.4 lost_replies")
def check_lost_replies(lost_replies: Callable[..., Any]) -> str:
    """``lost_replies(sequences, bos_ids, eos_ids) -> list of indices``, ascending: the sequences
    (token ids of conversations encoded as one string) in which d65ef2c's rule leaves an assistant
    reply without any label (``lost_replies_reference``)."""
    name = "Exercise 9.4 lost_replies"
    cases = _edge_sequences()
    sequences = [list(ids) for ids, _ in cases]
    case = f"{len(cases)} sequences, bos_ids={_BOS}, eos_ids={_EOS}"
    got = call(guarded(lost_replies, name, {**MASK_FUNCTIONS, "ch09.lost_replies_reference": lost_replies_reference}),
               [list(s) for s in sequences], list(_BOS), list(_EOS), name=name, case=case,
               check_inputs=True, hint="look at the sequence the error names.")
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    if not isinstance(got, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in got):
        fail(name, f"expected a list of indices (ints), got {got!r:.80}", "return the indices of the sequences.")
    got = list(got)
    expected = lost_replies_reference(sequences, _BOS, _EOS)
    if got == expected:
        return f"{len(cases)} sequences, {len(expected)} of them lose a reply (headers and markers at the very end included)"
    seen = next((d for d, f in LOST_MISTAKES.items() if f(sequences, _BOS, _EOS) == got), None)
    prefix = f"this looks like {seen}: " if seen else ""
    hint = ("compare with what your mask of Exercise 9.2 labels in the sequence named above: a reply is there "
            "wherever an assistant turn opens.")
    wrong_in = [n for n in range(len(cases)) if (n in got) != (n in expected)]
    if wrong_in:
        n = wrong_in[0]
        verdict = ("left out, but upstream's rule gives one of its replies no label" if n in expected else
                   "listed, but upstream's rule labels every reply it has")
        fail(name, f"{prefix}sequence {n} ({cases[n][1]}: ids={sequences[n]}) was {verdict}", hint)
    if len(set(got)) != len(got):
        fail(name, f"{prefix}an index appears more than once in {got}", hint)
    fail(name, f"{prefix}the indices are right but not in ascending order: {got}", "return them sorted.")


def _keep_cases() -> List[Dict[str, Any]]:
    rows = [
        (_SYSTEM + _USER + _OK, 64, "a reply after its full marker"),
        (_SYSTEM + _USER + _MERGED_REPLY, 64, "a reply whose first token swallowed the header's newline"),
        (_SYSTEM + _USER + _OK + _USER + _MERGED_REPLY2, 64, "a reply after its full marker, then a merged one"),
        (_USER + _MERGED_REPLY + _USER + _MERGED_REPLY2, 64, "two merged replies"),
        (_USER + _MERGED_REPLY + _USER + _MERGED_REPLY2, len(_USER) + 4, "max_length inside the first merged reply"),
        (_SYSTEM + _USER + [1, 7, 44, 45, 46], 64, "a merged reply cut off before its end marker"),
        (_SYSTEM + _USER + [1, 7, 30], 64, "cut right after the merged token: the header sits at the very end"),
        (_SYSTEM + _USER + _OK + _USER + [1, 7], 64, "a reply, then a header that ends the sequence"),
        (_SYSTEM + _USER + _OK + _USER + _BOS, 64, "a reply, then a full marker that ends the sequence"),
        (_MERGED_REPLY + _USER + _OK, 64, "a merged reply at the very start of the sequence, then an ordinary one"),
    ]
    return [{"ids": ids, "max_length": ml, "case": c} for ids, ml, c in rows]


def _keep_from_header(ids, bos, eos, max_length):  # counting always starts right after the header
    out = list(ref_sft.assistant_loss_mask(ids, bos, eos, max_length))
    header = list(bos[:-1])
    for j in range(len(ids) - len(header)):
        if list(ids[j:j + len(header)]) == header and ids[j + len(header)] == bos[-1] and j + len(header) < max_length:
            out[j + len(header)] = 1
    return out


def _keep_without_max_length(ids, bos, eos, max_length):
    return ref_sft.assistant_loss_mask(ids, bos, eos, len(ids) + 10)


KEEP_MISTAKES = {
    "d65ef2c's rule (Exercise 9.2): a reply whose first token swallowed the header's newline gets no label":
        lambda ids, bos, eos, ml: ref_sft.upstream_loss_mask(ids, bos, eos, ml, "d65ef2c"),
    "c090b69's rule: the token after the header skipped always, so a merged first token (the reply's indentation) "
    "is lost": lambda ids, bos, eos, ml: ref_sft.upstream_loss_mask(ids, bos[:-1], eos[:1], ml, "c090b69"),
    "the header's own newline counted (it is the template's, not the reply's)": _keep_from_header,
    "max_length ignored (nothing at or past max_length counts)": _keep_without_max_length,
}


def _position(ids: Sequence[int], k: int, max_length: int) -> str:
    """What position ``k`` of a 9.5 case is, in words."""
    header = _BOS[:-1]
    starts = [j for j in range(len(ids)) if list(ids[j:j + len(header)]) == header]
    if k >= max_length:
        return "at or past max_length"
    if any(j <= k < j + len(header) for j in starts):
        return "inside an assistant header"
    if any(k == j + len(header) for j in starts):
        return ("the header's newline" if ids[k] == _BOS[-1] else
                "the token right after an assistant header, which swallowed the header's newline")
    opened = max((j for j, t in enumerate(ids[:k + 1]) if t == _BOS[0]), default=None)
    if opened is None or opened not in starts:
        return "in a system or user turn"
    return "in an assistant reply or its end marker"


solution("9.5", "at every j with ids[j:j+len(bos)-1] == bos[:-1] and j + len(bos) - 1 < len(ids): start = j + len(bos) "
                "if ids[j+len(bos)-1] == bos[-1] else j + len(bos) - 1; then count to the end of the next eos as in "
                "9.2 (never at or past max_length) and go on after it.")


@check("Exercise 9.5 keep_whole_mask")
def check_keep_whole_mask(keep_whole_mask: Callable[..., Any]) -> str:
    """``keep_whole_mask(input_ids, bos_ids, eos_ids, max_length)`` must equal the course's
    ``minimind_ref.sft.assistant_loss_mask``: d65ef2c's mask where the full marker matches, and a
    reply whose first token swallowed the header's newline counted from that token."""
    name = "Exercise 9.5 keep_whole_mask"
    cases = _keep_cases()
    hint = "look at the position named above and at the assistant header before it."
    for c in cases:
        ids, max_length = c["ids"], c["max_length"]
        case = f"{c['case']}: ids={ids}, max_length={max_length}"
        got = call(guarded(keep_whole_mask, name, MASK_FUNCTIONS), list(ids), list(_BOS), list(_EOS), max_length, name=name, case=case,
                   check_inputs=True, hint=hint)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)) or len(got) != len(ids):
            fail(name, f"expected a list of 0/1, one per token ({len(ids)}), got {got!r:.80} ({case})",
                 "return the mask list.")
        got = [int(v) for v in got]
        expected = ref_sft.assistant_loss_mask(ids, _BOS, _EOS, max_length)
        if got == expected:
            continue
        seen = next((d for d, f in KEEP_MISTAKES.items() if list(f(ids, _BOS, _EOS, max_length)) == got), None)
        k = next(j for j in range(len(ids)) if got[j] != expected[j])
        should = "should count but does not" if expected[k] else "counts but should not"
        fail(name, (f"this looks like {seen}: " if seen else "")
             + f"position {k} ({_position(ids, k, max_length)}) {should}{_on(case)}", hint)
    return f"{len(cases)} sequences (merged and ordinary replies, headers at the very end, cut-off, max_length)"


# ---------------------------------------------------------------------- 9.6 minimind-3's assistant turn
def _m3_turn(message: Dict[str, Any]) -> str:
    return ref_sft.render_chat([message], template="minimind-3")


_TURN_HEAD, _TURN_END = f"{S}assistant\n", f"{E}\n"


def _calls(message: Dict[str, Any], first: str = "if text", between: bool = True, encode_strings: bool = False,
           ascii_only: bool = False, sort_keys: bool = False) -> str:
    """The tool-call part of an assistant turn; ``first``: when a newline goes before the first call
    ("if text": when the message has content, as the template does; "always"; "never")."""
    out = ""
    for n, call_ in enumerate(message.get("tool_calls") or []):
        if (n == 0 and (first == "always" or (first == "if text" and message["content"]))) or (n > 0 and between):
            out += "\n"
        args = call_["arguments"]
        if encode_strings or not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=ascii_only, sort_keys=sort_keys)
        out += '<tool_call>\n{"name": "' + call_["name"] + '", "arguments": ' + args + "}\n</tool_call>"
    return out


def _turn_variant(message: Dict[str, Any], reasoning=lambda r: r.strip("\n"), content=lambda c: c.lstrip("\n"),
                  block_when_empty: bool = True, **calls: Any) -> str:
    r = message.get("reasoning_content") or ""
    block = "<think>\n" + reasoning(r) + "\n</think>\n\n" if (r or block_when_empty) else ""
    return _TURN_HEAD + block + content(message["content"]) + _calls(message, **calls) + _TURN_END


TURN_MISTAKES = {
    "the reasoning stripped of spaces too (only newlines go at its ends)":
        lambda m: _turn_variant(m, reasoning=lambda r: r.strip()),
    "the reasoning's newlines at its ends kept": lambda m: _turn_variant(m, reasoning=lambda r: r),
    "only one newline taken off each end of the reasoning (all of them go)":
        lambda m: _turn_variant(m, reasoning=lambda r: r[1 if r.startswith("\n") else 0:len(r) - (1 if r.endswith("\n") else 0)]),
    "no thinking block when the message has no reasoning (the block is always there, empty then)":
        lambda m: _turn_variant(m, block_when_empty=False),
    "the reply's leading newlines kept": lambda m: _turn_variant(m, content=lambda c: c),
    "the reply's leading spaces removed too (only newlines go)": lambda m: _turn_variant(m, content=lambda c: c.lstrip()),
    "the reply stripped at its end too (only its start changes)": lambda m: _turn_variant(m, content=lambda c: c.strip("\n")),
    "a newline before the first tool call of a turn without text": lambda m: _turn_variant(m, first="always"),
    "no newline between the reply's text and its first tool call": lambda m: _turn_variant(m, first="never"),
    "no newline between two tool calls": lambda m: _turn_variant(m, between=False),
    "arguments given as a string encoded as JSON again (a string goes in as it is)":
        lambda m: _turn_variant(m, encode_strings=True),
    "the arguments' characters outside ASCII escaped as \\u sequences (the template writes them as they are)":
        lambda m: _turn_variant(m, ascii_only=True),
    "the arguments' keys sorted (the template keeps them in the order the message gives them)":
        lambda m: _turn_variant(m, sort_keys=True),
}


def _turn_cases() -> List[Dict[str, Any]]:
    add = {"name": "add", "arguments": {"a": 12, "b": 30}}
    return [
        {"role": "assistant", "content": "12+30=042"},
        {"role": "assistant", "content": "\n\n12+30=042\n", "reasoning_content": "\n \nadd the ones  \n \n"},
        {"role": "assistant", "content": "  \n  return a + b", "reasoning_content": "  indent by four\n"},
        {"role": "assistant", "content": "", "tool_calls": [add]},
        {"role": "assistant", "content": "Two sums.", "reasoning_content": "\n\ntwo calls\n\n",
         "tool_calls": [add, {"name": "add", "arguments": '{"a": 1, "b": 2}'}]},
        {"role": "assistant", "content": "\nDone.", "tool_calls": [{"name": "lookup", "arguments": {"q": "x y"}},
                                                                   {"name": "add", "arguments": {}}]},
        # upstream's SFT data is mostly Chinese: arguments with characters outside ASCII, keys not in sorted order
        {"role": "assistant", "content": "我来查一下。", "reasoning_content": "用户想知道北京的天气。",
         "tool_calls": [{"name": "get_weather", "arguments": {"城市": "北京", "date": "明天", "unit": "°C"}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"b": 30, "a": 12}},
                                                              {"name": "add", "arguments": '{"a": 5, "b": 6}'}]},
    ]


def _region(text: str, k: int) -> str:
    """Which part of the template's assistant turn ``text`` position ``k`` falls in."""
    if k < len(_TURN_HEAD):
        return "the turn's header"
    if k >= len(text) - len(_TURN_END):
        return "the end of the turn"
    think_end = text.find("</think>\n\n")
    if think_end >= 0 and k < think_end + len("</think>\n\n"):
        return "the thinking block"
    call_at = text.find("<tool_call>")
    if call_at >= 0 and k >= call_at - 1:
        return "the tool calls"
    return "the reply's text"


solution("9.6", "'<|im_start|>assistant\\n<think>\\n' + (reasoning or '').strip('\\n') + '\\n</think>\\n\\n' + "
                "content.lstrip('\\n'), then for each tool call ('\\n' first if it is not the first call or the content "
                "is not empty) '<tool_call>\\n{\"name\": \"' + name + '\", \"arguments\": ' + (arguments if a str "
                "else json.dumps(arguments, ensure_ascii=False)) + '}\\n</tool_call>', then '<|im_end|>\\n'.")


@check("Exercise 9.6 render_assistant_turn")
def check_render_assistant_turn(render_assistant_turn: Callable[..., Any]) -> str:
    """``render_assistant_turn(message) -> str`` must return exactly what d65ef2c's template renders
    for one assistant message (``minimind_ref.sft.render_chat([message])``): its thinking block,
    its reply and its tool calls, between ``<|im_start|>assistant\\n`` and ``<|im_end|>\\n``."""
    name = "Exercise 9.6 render_assistant_turn"
    cases = _turn_cases()
    hint = "put the rendered examples before the exercise beside this case and compare that part, character by character."
    for n, message in enumerate(cases):
        case = f"case {n}: {message!r}"
        got = call(guarded(render_assistant_turn, name, TEMPLATE_FUNCTIONS), dict(message), name=name, case=case, check_inputs=True, hint=hint)
        if not isinstance(got, str):
            fail(name, f"expected a str, got {type(got).__name__}: {got!r:.80} ({case})", "return the rendered string.")
        expected = _m3_turn(message)
        if got == expected:
            continue
        seen = next((d for d, f in TURN_MISTAKES.items() if f(message) == got), None)
        _string_failure(name, got, expected, seen, _region, case, hint)
    return (f"{len(cases)} assistant messages (reasoning with spaces and newlines at both ends, tool calls, leading "
            "whitespace, arguments in Chinese)")


def check_all(render_chat: Callable[..., Any], assistant_loss_mask: Callable[..., Any], sft_loss: Callable[..., Any]) -> None:
    check_render_chat(render_chat)
    check_assistant_loss_mask(assistant_loss_mask)
    check_sft_loss(sft_loss)
