"""Checks for chapter 09 (supervised fine-tuning): MiniMind's chat templates (c090b69's and
minimind-3's), the assistant-only loss mask, the masked next-token loss, and the newline edge case
(finding the replies upstream's markers miss, and the mask that keeps them).

Each check runs the learner's function on conversations / ids / logits it makes itself and
compares with ``minimind_ref.sft`` (upstream's ``tokenizer_config.json`` templates and
``dataset/lm_dataset.py`` ``generate_labels``); a mismatch names the known mistake it matches
when it can.
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


def _render_no_gen_prompt(messages, add_generation_prompt=False):
    return _m2(messages, False)


def _render_gen_prompt_no_newline(messages, add_generation_prompt=False):
    text = _m2(messages, False)
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
    ``minimind_ref.sft.render_chat(..., template="minimind2")`` (c090b69's template, no tools) and
    leave ``messages`` as it was. ``check_render_chat_minimind3`` checks d65ef2c's."""
    name = "Exercise 9.1 render_chat"
    for n, c in enumerate(RENDER_CASES):
        messages, gen = c["messages"], c["add_generation_prompt"]
        case = f"case {n}: {[m['role'] for m in messages]}, add_generation_prompt={gen}"
        got = call(render_chat, [dict(m) for m in messages], gen, name=name, case=case, check_inputs=True,
                   hint="build the string piece by piece: the system header first, then one block per message.")
        if not isinstance(got, str):
            fail(name, f"expected a str, got {type(got).__name__}: {got!r:.80} ({case})", "return the rendered string.")
        expected = _m2(messages, gen)
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


# ---------------------------------------------------------------------- 9.4 / 9.5 the newline edge case
# Synthetic ids: bos = [1, 7, 8] ("<|im_start|>assistant\n": 8 is the newline), eos = [2, 8]
# ("<|im_end|>\n"); 30 and 31 are tokens that begin with a newline ("\n  ", "\n\n"): a reply that
# begins with whitespace swallowed the header's newline into them.
_BOS, _EOS, _MERGED = [1, 7, 8], [2, 8], [30, 31]
_SYSTEM, _USER = [1, 5, 8, 40, 41, 2, 8], [1, 6, 8, 50, 51, 52, 2, 8]


def _edge_sequences() -> List[List[int]]:
    ok = _BOS + [60, 61] + _EOS
    merged = [1, 7, 30, 62, 63] + _EOS
    merged2 = [1, 7, 31, 64] + _EOS
    return [
        _SYSTEM + _USER + ok,                               # 0 fine
        _SYSTEM + _USER + merged,                           # 1 the reply swallowed the newline
        _SYSTEM + _USER + ok + _USER + merged2,             # 2 the second reply did
        _USER + ok + _USER + ok,                            # 3 fine, two replies
        _SYSTEM + _USER + [1, 7, 44, 45] + _EOS,            # 4 a header without its newline at all (not a merge)
        _USER + merged + _USER + merged2,                   # 5 both replies
        _SYSTEM + _USER,                                    # 6 no assistant turn
    ]


def lost_replies_reference(sequences: Sequence[Sequence[int]], bos_ids: Sequence[int], eos_ids: Sequence[int]) -> List[int]:
    """Indices of the sequences in which some assistant header (``bos_ids`` without its last token,
    the newline) is not followed by that newline, so upstream's marker misses the reply."""
    header = list(bos_ids[:-1])
    out = []
    for n, ids in enumerate(sequences):
        ids = list(ids)
        headers = sum(1 for j in range(len(ids)) if ids[j:j + len(header)] == header)
        markers = sum(1 for j in range(len(ids)) if ids[j:j + len(bos_ids)] == list(bos_ids))
        if markers < headers:
            out.append(n)
    return out


solution("9.4", "header = bos_ids[:-1]; keep n when sum(ids[j:j+len(header)] == header) > "
                "sum(ids[j:j+len(bos_ids)] == bos_ids)")


@check("Exercise 9.4 lost_replies")
def check_lost_replies(lost_replies: Callable[..., Any]) -> str:
    """``lost_replies(sequences, bos_ids, eos_ids) -> list of indices``: the sequences (token ids of
    conversations encoded as one string) in which upstream's rule supervises fewer assistant replies
    than there are: an assistant header ``bos_ids[:-1]`` whose newline ``bos_ids[-1]`` was merged
    into the next token, so the whole marker ``bos_ids`` never matches."""
    name = "Exercise 9.4 lost_replies"
    sequences = _edge_sequences()
    case = "7 conversations: normal replies, replies that swallowed the header's newline, no assistant turn"
    got = call(lost_replies, [list(s) for s in sequences], list(_BOS), list(_EOS), name=name, case=case,
               check_inputs=True)
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    if not isinstance(got, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in got):
        fail(name, f"expected a list of indices, got {got!r:.80} ({case})", "return the indices of the sequences.")
    expected = lost_replies_reference(sequences, _BOS, _EOS)
    got = sorted(got)
    if got == expected:
        return f"{len(sequences)} conversations, {len(expected)} of them lose a reply"
    only_merged = [n for n, ids in enumerate(sequences) if any(t in _MERGED for t in ids)]
    mistakes = {
        "only the conversations with a newline-led token (30, 31) listed: a header followed by any token other than "
        "the newline loses its reply too (conversation 4)": only_merged,
        "every conversation with an assistant turn listed: a reply is lost only where the header's newline is missing":
            [n for n, ids in enumerate(sequences) if any(list(ids[j:j + 2]) == _BOS[:2] for j in range(len(ids)))],
        "the conversations whose replies ARE supervised listed instead of the others":
            [n for n in range(len(sequences)) if n not in expected and n != 6],
    }
    seen = [k for k, v in mistakes.items() if sorted(v) == got]
    fail(name, f"expected {expected}, got {got} ({case})" + (f"; this looks like {seen[0]}" if seen else ""),
         "count the assistant headers (bos_ids without its last token) and the full markers (bos_ids) in each "
         "sequence; where there are fewer markers than headers, a reply got no label.")


def _keep_cases() -> List[Dict[str, Any]]:
    seqs = _edge_sequences()
    return [{"ids": ids, "max_length": ml, "case": c} for ids, ml, c in [
        (seqs[0], 64, "a normal reply"), (seqs[1], 64, "a reply that swallowed the newline"),
        (seqs[2], 64, "a normal reply, then one that swallowed the newline"),
        (seqs[4], 64, "a header followed by a token that does not begin with the newline"),
        (seqs[5], 64, "two replies that swallowed the newline"),
        (seqs[5], len(_USER) + 4, "max_length inside the first reply"),
        (seqs[1][:-3], 64, "a cut-off reply that swallowed the newline"),
    ]]


def _keep_mistakes(ids, max_length) -> Dict[str, Callable[[], List[int]]]:
    def after_merged() -> List[int]:  # starts one token later: the merged token (the reply's first whitespace) left out
        mask = list(ref_sft.assistant_loss_mask(ids, _BOS, _EOS, max_length, _MERGED))
        for j in range(len(ids) - 2):
            if list(ids[j:j + 2]) == _BOS[:2] and ids[j + 2] in _MERGED:
                mask[j + 2] = 0
        return mask

    def any_token() -> List[int]:  # any token after the header starts a reply
        return ref_sft.assistant_loss_mask(ids, _BOS, _EOS, max_length, list(range(9, 100)))

    return {
        "upstream's rule: a reply whose first token swallowed the header's newline is not supervised":
            lambda: ref_sft.assistant_loss_mask(ids, _BOS, _EOS, max_length),
        "the merged token left out (it carries the reply's first characters: count from it)": after_merged,
        "any token after the header accepted: only a token that begins with the newline (merged_starts) stands "
        "for the missing one": any_token,
    }


solution("9.5", "at i: if ids[i:i+len(bos)] == bos: start = i + len(bos); elif ids[i:i+len(bos)-1] == bos[:-1] "
                "and ids[i+len(bos)-1] in merged_starts: start = i + len(bos) - 1; then count to the end of the next "
                "eos as in 9.2.")


@check("Exercise 9.5 keep_merged_mask")
def check_keep_merged_mask(assistant_loss_mask: Callable[..., Any]) -> str:
    """``assistant_loss_mask(input_ids, bos_ids, eos_ids, max_length, merged_starts)``: upstream's
    mask, and also a reply whose header ``bos_ids[:-1]`` is followed by a token of
    ``merged_starts`` (a token that begins with the newline) counts, from that token on
    (``minimind_ref.sft.assistant_loss_mask`` with ``merged_starts``)."""
    name = "Exercise 9.5 keep_merged_mask"
    cases = _keep_cases()
    for c in cases:
        ids, max_length = c["ids"], c["max_length"]
        case = f"{c['case']}: ids={ids}, max_length={max_length}"
        got = call(assistant_loss_mask, list(ids), list(_BOS), list(_EOS), max_length, list(_MERGED), name=name,
                   case=case, check_inputs=True)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)):
            fail(name, f"expected a list of 0/1, got {type(got).__name__}: {got!r:.80} ({case})", "return the mask list.")
        got = [int(v) for v in got]
        expected = ref_sft.assistant_loss_mask(ids, _BOS, _EOS, max_length, _MERGED)
        check_equal(got, expected, name=name, case=case, mistakes=_keep_mistakes(ids, max_length),
                    hint="a reply starts after the full marker bos_ids, or at a merged token when the header "
                         "bos_ids[:-1] is followed by one (merged_starts); from there the rule is upstream's.")
    return f"{len(cases)} sequences (normal and merged replies, cut-off, max_length)"


# ---------------------------------------------------------------------- 9.6 minimind-3's template
def _m3(messages, add_generation_prompt=False):
    return ref_sft.render_chat(messages, add_generation_prompt, template="minimind-3")


def _m3_with_default(messages, gen):
    text = _m3(messages, gen)
    if messages[0]["role"] != "system":
        text = ref_sft.render_chat([{"role": "system", "content": ref_sft.DEFAULT_SYSTEM_PROMPT}],
                                   template="minimind-3") + text
    return text


def _m3_no_think(messages, gen):
    stripped = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    return ref_sft.render_chat(stripped, gen, template="minimind-3", drop_empty_think=True)


def _m3_raw_reasoning(messages, gen):
    text = _m3(messages, gen)
    for m in messages:
        r = m.get("reasoning_content")
        if r and r != r.strip("\n"):
            text = text.replace("".join(("<think>\n", r.strip("\n"), "\n</think>")), "".join(("<think>\n", r, "\n</think>")))
    return text


M3_MISTAKES = {
    "c090b69's default system prompt added (minimind-3 renders a system turn only when the conversation has one)":
        lambda m, g: _m3_with_default(m, g),
    "no thinking block in the assistant turns (minimind-3 opens every one with <think>\n...\n</think>\n\n)":
        _m3_no_think,
    "the generation prompt without the empty thinking block (upstream's non-thinking mode appends "
    "'<think>\n\n</think>\n\n')": lambda m, g: _m3(m, False) + (f"{S}assistant\n" if g else ""),
    "the reasoning not stripped of its surrounding newlines (the template writes reasoning.strip('\\n'))":
        lambda m, g: _m3_raw_reasoning(m, g),
}


M3_CASES: List[Dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "What is 37 plus 45?"}, {"role": "assistant", "content": "37+45=082"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1", "reasoning_content": "\nfirst add the ones\n"},
                  {"role": "user", "content": "u2"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "later"}, {"role": "user", "content": "v"}],
     "add_generation_prompt": True},
]


solution("9.6", "turns as in 9.1 without the default system turn; for an assistant message write the thinking block "
                "before the content; append the generation prompt with its empty block.")


@check("Exercise 9.6 render_chat (minimind-3)")
def check_render_chat_minimind3(render_chat: Callable[..., Any]) -> str:
    """``render_chat(messages, add_generation_prompt)`` must return exactly
    ``minimind_ref.sft.render_chat(..., template="minimind-3")`` (d65ef2c's template without tools:
    no default system prompt, a thinking block in every assistant turn, ``reasoning_content``
    inside it, the empty block after the generation prompt)."""
    name = "Exercise 9.6 render_chat (minimind-3)"
    for n, c in enumerate(M3_CASES):
        messages, gen = c["messages"], c["add_generation_prompt"]
        case = f"case {n}: {[m['role'] for m in messages]}, add_generation_prompt={gen}"
        got = call(render_chat, [dict(m) for m in messages], gen, name=name, case=case, check_inputs=True)
        if not isinstance(got, str):
            fail(name, f"expected a str, got {type(got).__name__}: {got!r:.80} ({case})", "return the rendered string.")
        check_equal(got, _m3(messages, gen), name=name, case=case,
                    mistakes={d: (lambda f=f: f(messages, gen)) for d, f in M3_MISTAKES.items()},
                    hint="no system turn unless the conversation has one; an assistant turn is '<|im_start|>assistant\\n"
                         "<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content + '<|im_end|>\\n'; "
                         "the generation prompt is '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'.")
    return f"{len(M3_CASES)} conversations (reasoning, no default system prompt, generation prompt)"


def check_all(render_chat: Callable[..., Any], assistant_loss_mask: Callable[..., Any], sft_loss: Callable[..., Any]) -> None:
    check_render_chat(render_chat)
    check_assistant_loss_mask(assistant_loss_mask)
    check_sft_loss(sft_loss)
