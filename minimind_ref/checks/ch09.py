"""Checks for chapter 09 (supervised fine-tuning): c090b69's chat template (9.1), d65ef2c's loss
mask (9.2), how much each conversation weighs in the batch's loss (9.3, predicted from the labels), replies that begin with whitespace (9.4: which
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
from .delegation import forbid, guarded
from .diagnosis import close_tensors, explaining

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


def _render_no_last_newline(messages, add_generation_prompt=False):  # turns joined by a newline
    text = _m2(messages, add_generation_prompt)
    return text if add_generation_prompt else text[:-1]


def _render_period(messages, add_generation_prompt=False):
    return _m2(messages, add_generation_prompt).replace(
        f"system\n{ref_sft.DEFAULT_SYSTEM_PROMPT}{E}", f"system\n{ref_sft.DEFAULT_SYSTEM_PROMPT}.{E}")


def _render_system_twice(messages, add_generation_prompt=False):
    head = "" if messages[0]["role"] == "system" else _turn("system", ref_sft.DEFAULT_SYSTEM_PROMPT)
    text = head + "".join(_turn(m["role"], m["content"]) for m in messages)
    if messages[0]["role"] == "system":
        text = _turn("system", messages[0]["content"]) + text
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _render_default_always(messages, add_generation_prompt=False):
    text = _turn("system", ref_sft.DEFAULT_SYSTEM_PROMPT) + "".join(_turn(m["role"], m["content"]) for m in messages)
    return text + (f"{S}assistant\n" if add_generation_prompt else "")


def _render_any_system(messages, add_generation_prompt=False):  # no default once ANY message is a system message
    if any(m["role"] == "system" for m in messages):
        return _render_no_default(messages, add_generation_prompt) if messages[0]["role"] != "system" else \
            _m2(messages, add_generation_prompt)
    return _m2(messages, add_generation_prompt)


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


def _render_edited(edit):
    return lambda messages, add_generation_prompt=False: _m2([dict(m, content=edit(m["content"])) for m in messages],
                                                            add_generation_prompt)


RENDER_MISTAKES = {
    "the default system prompt left out because a system message comes later in the conversation":
        _render_any_system,
    "the default system prompt left out of a conversation that does not open with a system message":
        _render_no_default,
    f"a missing newline after {E}": _render_no_newline,
    f"no newline after the last turn's {E}": _render_no_last_newline,
    "a period after the default system prompt": _render_period,
    "the first system message rendered twice, as the header and again as a turn of its own": _render_system_twice,
    "the default system prompt written before a conversation's own first system message": _render_default_always,
    "an empty first system message taken for no system message": _render_empty_system_default,
    "the whitespace at both ends of a message's text removed": _render_edited(str.strip),
    "the whitespace at the end of a message's text removed": _render_edited(str.rstrip),
    "the whitespace at the start of a message's text removed": _render_edited(str.lstrip),
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
        return f"the text after turn {turn} ({role})" if text.find(E, opened) != -1 else f"turn {turn} ({role}, the generation prompt)"
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
    # the template writes a message's text as it is: whitespace at its ends stays
    {"messages": [{"role": "user", "content": "  indented, and a newline at the end\n"},
                  {"role": "assistant", "content": "\n a reply between blank lines \n\n"}], "add_generation_prompt": True},
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
    learner = guarded(render_chat, name, TEMPLATE_FUNCTIONS)
    got, expected = [], []
    for n, c in enumerate(RENDER_CASES):
        messages, gen = c["messages"], c["add_generation_prompt"]
        case = f"case {n}: {[m['role'] for m in messages]}, add_generation_prompt={gen}"
        out = call(learner, [dict(m) for m in messages], gen, name=name, case=case, check_inputs=True,
                   hint="look at the case named above.")
        if not isinstance(out, str):
            fail(name, f"expected a str, got {type(out).__name__}: {out!r:.80} ({case})", "return the rendered string.")
        got.append(out)
        expected.append(_m2(messages, gen))
    wrong = next((n for n in range(len(got)) if got[n] != expected[n]), None)
    if wrong is not None:
        c = RENDER_CASES[wrong]
        seen = explaining({d: (lambda c, f=f: f(c["messages"], c["add_generation_prompt"]))
                            for d, f in RENDER_MISTAKES.items()}, RENDER_CASES, got, expected, wrong)
        case = f"case {wrong}: {[m['role'] for m in c['messages']]}, add_generation_prompt={c['add_generation_prompt']}"
        _string_failure(name, got[wrong], expected[wrong], seen, _render_region, case,
                        "compare that turn with the renderings before the exercise, character by character.")
    return (f"{len(RENDER_CASES)} conversations (default and custom system prompt, multi-turn, generation prompt, "
            "whitespace at the ends of a message)")


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


def _mask_late_start(ids, bos, eos, max_length):  # the reply's first token skipped
    out = list(ref_sft.upstream_loss_mask(ids, bos, eos, max_length, "d65ef2c"))
    for j in range(len(ids)):
        if list(ids[j:j + len(bos)]) == list(bos) and j + len(bos) < len(out):
            out[j + len(bos)] = 0
    return out


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
    "max_length ignored": _mask_ignores_max_length,
    "the position max_length itself counted, one past the limit":
        lambda ids, bos, eos, m: ref_sft.upstream_loss_mask(ids, bos, eos, m + 1, "d65ef2c"),
    "every token counted (system and user turns must not count)": _mask_all,
    "a reply cut off before its end marker not counted": _mask_truncated_dropped,
    "a reply's first token skipped": _mask_late_start,
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


def _fail_at_first_wrong_position(name: str, cases: Sequence[Dict[str, Any]], got_all: Sequence[List[int]],
                                  expected_all: Sequence[List[int]], mistakes: Dict[str, Callable[[Any], Any]],
                                  describe: Callable[[Dict[str, Any], int], str], hint: str) -> None:
    """Fail a mask check at the first case the learner got wrong: the first wrong position, what sits there
    (``describe(case, position)``), whether it should count, and the mistake that explains every case."""
    wrong = next((n for n in range(len(cases)) if got_all[n] != expected_all[n]), None)
    if wrong is None:
        return
    c, got, expected = cases[wrong], got_all[wrong], expected_all[wrong]
    seen = explaining(mistakes, cases, got_all, expected_all, wrong)
    k = next(j for j in range(len(c["ids"])) if got[j] != expected[j])
    should = "should count but does not" if expected[k] else "counts but should not"
    case = f"{c['case']}: ids={c['ids']}, max_length={c['max_length']}"
    fail(name, (f"this looks like {seen}: " if seen else "") + f"position {k} ({describe(c, k)}) {should}{_on(case)}",
         hint)


@check("Exercise 9.2 assistant_loss_mask")
def check_assistant_loss_mask(assistant_loss_mask: Callable[..., Any]) -> str:
    """``assistant_loss_mask(input_ids, bos_ids, eos_ids, max_length)`` must equal
    ``minimind_ref.sft.upstream_loss_mask(..., "d65ef2c")`` (d65ef2c's ``generate_labels`` positions)
    as a list of 0/1 ints, one per token, and leave its inputs unchanged."""
    name = "Exercise 9.2 assistant_loss_mask"
    cases = _mask_cases()
    learner = guarded(assistant_loss_mask, name, MASK_FUNCTIONS)
    got_all, expected_all = [], []
    for c in cases:
        ids, bos, eos, max_length = c["ids"], c["bos"], c["eos"], c["max_length"]
        case = f"{c['case']}: ids={ids}, max_length={max_length}"
        got = call(learner, list(ids), list(bos), list(eos), max_length, name=name, case=case,
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
        got_all.append(got)
        expected_all.append(list(expected))
    _fail_at_first_wrong_position(
        name, cases, got_all, expected_all,
        {d: (lambda c, f=f: list(f(c["ids"], c["bos"], c["eos"], c["max_length"]))) for d, f in MASK_MISTAKES.items()},
        lambda c, k: _mask_position(c["ids"], c["bos"], c["eos"], k, c["max_length"]),
        "look at the turn around that position and at section 4's rule.")
    return f"{len(cases)} sequences (multi-turn, multi-token markers, cut-off reply, max_length)"


# ---------------------------------------------------------------------- 9.3 how much each conversation weighs
def _weight_cases() -> List[Dict[str, Any]]:
    """Label batches ``[b, t]`` (-100 where the loss does not count): replies of unequal length; a reply cut at the
    end of its row; a conversation cut on the left, which opens inside a reply (its label at position 0 is not
    -100); a conversation whose replies were all cut away (no label counts). Each mistake of ``_weight_mistakes``
    gives a result of its own on at least one of them."""
    rows = [
        ("3 conversations, replies of 2, 5 and 7 tokens", 12, [(5, 7), (3, 8), (4, 11)]),
        ("4 conversations, one reply cut at the end of its row", 10, [(2, 4), (5, 10), (3, 6), (6, 7)]),
        ("2 conversations, the first opening inside a reply (its first label is not -100)", 9, [(0, 3), (3, 8)]),
        ("3 conversations, one without any label that counts", 8, [(1, 4), (2, 7), (0, 0)]),
    ]
    g = seeded(93)
    out = []
    for case, t, spans in rows:
        ids = torch.randint(3, 50, (len(spans), t), generator=g)
        labels = torch.full((len(spans), t), -100, dtype=torch.long)
        for row, (start, stop) in enumerate(spans):
            labels[row, start:stop] = ids[row, start:stop]
        out.append({"labels": labels, "case": case})
    return out


def reply_weights_reference(labels: torch.Tensor) -> torch.Tensor:
    """``[b]`` float: the weight ``w_k`` of conversation ``k`` in the batch's SFT loss (the model's ``.loss`` for
    ``labels``), written as ``sum_k w_k * L_k`` with ``L_k`` the mean loss over conversation ``k``'s own counted
    labels: its number of labels that count after the shift (``labels[:, 1:] != -100``: nothing predicts the label
    at position 0) over the batch's number. A conversation without a counted label weighs 0."""
    counted = (labels[:, 1:] != -100).sum(1).double()
    return (counted / counted.sum()).float()


def _weight_mistakes(labels: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    b = labels.shape[0]

    def share(counted: torch.Tensor) -> torch.Tensor:
        return (counted.double() / counted.sum()).float()

    counted = (labels[:, 1:] != -100).sum(1)
    return {
        "every conversation weighed alike, as a mean per conversation and then over the batch would":
            lambda: torch.full((b,), 1.0 / b),
        "every conversation that counts a label weighed alike": lambda: (counted > 0).float() / (counted > 0).sum(),
        "the label at position 0 counted": lambda: share((labels != -100).sum(1)),
        "the label at the last position left out": lambda: share((labels[:, :-1] != -100).sum(1)),
        "each conversation's number of counted labels, not divided by the batch's": lambda: counted.float(),
        "each conversation's number of counted labels divided by the batch's number of positions":
            lambda: counted.float() / labels[:, 1:].numel(),
    }


solution("9.3", "counted = (labels[:, 1:] != -100).sum(1).float(); return counted / counted.sum()")

# measuring the weights on a loss answers nothing: the exercise predicts them from the labels
MEASURING = "the exercise asks you to predict the weights from the labels alone, not to measure them on a loss"


def _loss_functions():
    from .. import train as ref_train
    from ..model import next_token_loss

    return [forbid("minimind_ref.model.next_token_loss", next_token_loss),
            forbid("minimind_ref.train.causal_lm_loss", ref_train.causal_lm_loss),
            forbid("ch09.reply_weights_reference", reply_weights_reference),
            forbid("a loss function (F.cross_entropy, F.nll_loss, log_softmax)", F.cross_entropy, F.nll_loss,
                   F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax, reason=MEASURING),
            forbid("autograd (backward, torch.autograd.grad)", torch.Tensor.backward, torch.autograd.backward,
                   torch.autograd.grad, reason=MEASURING)]


@check("Exercise 9.3 reply_weights", shown=False,
       why="the weights are shares of counts the case's labels determine: a shown weight would give the rule away")
def check_reply_weights(reply_weights: Callable[..., Any]) -> str:
    """``reply_weights(labels [b, t]) -> [b]``: how much each conversation weighs in the batch's SFT loss (the
    model's ``.loss`` is ``sum_k w_k * L_k``, ``L_k`` the mean over conversation ``k``'s own counted labels), from
    the labels alone (``reply_weights_reference``); a function that measures them on a loss is refused."""
    name = "Exercise 9.3 reply_weights"
    hint = ("work it out on a batch of two conversations whose labels count at one and at three positions: which "
            "positions enter the loss after the shift, and how does chapter 08's mean weigh them?")
    forbidden = _loss_functions()
    cases = _weight_cases()
    got_all, expected_all = [], []
    for c in cases:
        labels, case = c["labels"], c["case"]
        got = call(guarded(reply_weights, name, forbidden, case=case, hint=hint), labels.clone(), name=name,
                   case=case, check_inputs=True, hint=hint)
        if isinstance(got, (list, tuple)):
            got = torch.tensor(got, dtype=torch.float64)
        if isinstance(got, torch.Tensor) and not got.is_floating_point():
            fail(name, f"expected a float tensor of weights, got dtype {got.dtype}{_on(case)}",
                 "a weight is a share of the batch's loss: a float between 0 and 1.")
        if not isinstance(got, torch.Tensor) or got.shape != (labels.shape[0],):
            check_close(got, reply_weights_reference(labels), name=name, case=case, check_dtype=False, hint=hint)
        got_all.append(got)
        expected_all.append(reply_weights_reference(labels))
    same = close_tensors(1e-6, 1e-7)
    wrong = next((n for n in range(len(cases)) if not same(got_all[n], expected_all[n])), None)
    if wrong is not None:
        seen = explaining({d: (lambda c, d=d: _weight_mistakes(c["labels"])[d]()) for d in _weight_mistakes(cases[0]["labels"])},
                          cases, got_all, expected_all, wrong, same)
        check_close(got_all[wrong], expected_all[wrong], name=name, case=cases[wrong]["case"], rtol=1e-6, atol=1e-7,
                    check_dtype=False, mistakes={seen: got_all[wrong]} if seen else None, hint=hint)
    return "4 batches: replies of unequal length, a reply cut at its row's end, one opening the row, an empty one"


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


def _lost_no_marker(sequences, bos, eos):  # no full marker anywhere in the sequence
    return [n for n, ids in enumerate(sequences) if not any(ids[j:j + len(bos)] == bos for j in range(len(ids)))]


def _lost_first_header_only(sequences, bos, eos):
    header, out = bos[:-1], []
    for n, ids in enumerate(sequences):
        j = next((j for j in range(len(ids) - len(header)) if ids[j:j + len(header)] == header), None)
        if j is not None and ids[j + len(header)] != bos[-1]:
            out.append(n)
    return out


def _lost_prompt_at_end(sequences, bos, eos):  # a full marker that ends the sequence counted as a lost reply
    ends = [n for n, ids in enumerate(sequences) if len(ids) >= len(bos) and ids[len(ids) - len(bos):] == bos]
    return sorted(set(lost_replies_reference(sequences, bos, eos)) | set(ends))


LOST_MISTAKES = {
    "a scan that stops short of the end of the sequence, so an assistant header in the last positions is never seen":
        _lost_scan_short,
    "the full markers counted over fewer positions than the headers, so a marker at the very end is missed":
        _lost_marker_scan_short,
    "an assistant header with nothing after it counted as a lost reply": _lost_headers_over_markers,
    "a full marker that ends the sequence (a generation prompt) counted as a lost reply": _lost_prompt_at_end,
    "every <|im_start|> taken for an assistant header": _lost_any_turn,
    "end markers compared with assistant markers": _lost_end_markers,
    "a sequence without any full assistant marker listed, whether or not it has a reply": _lost_no_marker,
    "only the first assistant header of a sequence looked at": _lost_first_header_only,
    "a sequence listed once per lost reply": _lost_once_per_reply,
    "the indices counted from 1": lambda s, b, e: [n + 1 for n in lost_replies_reference(s, b, e)],
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
    return [{"ids": ids, "max_length": ml, "case": c, "ends_in_header": ids[-2:] == _BOS[:-1]} for ids, ml, c in rows]


def _keep_from_header(ids, bos, eos, max_length):  # counting always starts right after the header
    out = list(ref_sft.assistant_loss_mask(ids, bos, eos, max_length))
    header = list(bos[:-1])
    for j in range(len(ids) - len(header)):
        if list(ids[j:j + len(header)]) == header and ids[j + len(header)] == bos[-1] and j + len(header) < max_length:
            out[j + len(header)] = 1
    return out


def _keep_without_max_length(ids, bos, eos, max_length):
    return ref_sft.assistant_loss_mask(ids, bos, eos, len(ids) + 10)


def _keep_scan(ids, bos, eos, max_length, header_length=None, keep_newline=False, end_length=None):
    """The course's mask with one rule changed: the header matched on its first ``header_length`` tokens, the
    header's newline counted (``keep_newline``), the end marker counted on its first ``end_length`` tokens."""
    ids, eos = list(ids), list(eos)
    header = list(bos[:-1])[:header_length] if header_length else list(bos[:-1])
    end_length = len(eos) if end_length is None else end_length
    mask, i = [0] * len(ids), 0
    while i < len(ids):
        after = i + len(header)
        if after >= len(ids) or ids[i:after] != header:
            i += 1
            continue
        start = after + 1 if ids[after] == bos[-1] and not keep_newline else after
        end = start
        while end < len(ids) and ids[end:end + len(eos)] != eos:
            end += 1
        for j in range(start, min(end + end_length, max_length, len(ids))):
            mask[j] = 1
        i = end + len(eos)
    return mask


KEEP_MISTAKES = {
    "d65ef2c's rule of Exercise 9.2: a reply whose first token swallowed the header's newline gets no label":
        lambda ids, bos, eos, ml: ref_sft.upstream_loss_mask(ids, bos, eos, ml, "d65ef2c"),
    "c090b69's rule: the token after the header skipped always, so a merged first token is lost":
        lambda ids, bos, eos, ml: ref_sft.upstream_loss_mask(ids, bos[:-1], eos[:1], ml, "c090b69"),
    "the header's own newline counted": _keep_from_header,
    "max_length ignored": _keep_without_max_length,
    "the newline after <|im_end|> left out": lambda ids, bos, eos, ml: _keep_scan(ids, bos, eos, ml, end_length=1),
    "every <|im_start|> taken for an assistant header":
        lambda ids, bos, eos, ml: _keep_scan(ids, bos, eos, ml, header_length=1),
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
    learner = guarded(keep_whole_mask, name, MASK_FUNCTIONS)
    got_all, expected_all = [], []
    for c in cases:
        ids, max_length = c["ids"], c["max_length"]
        case = f"{c['case']}: ids={ids}, max_length={max_length}"
        hint = ("a header can be the last thing in a sequence: nothing follows it there." if c.get("ends_in_header")
                else "look at the position named above and at the assistant header before it.")
        got = call(learner, list(ids), list(_BOS), list(_EOS), max_length, name=name, case=case,
                   check_inputs=True, hint=hint)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if not isinstance(got, (list, tuple)) or len(got) != len(ids):
            fail(name, f"expected a list of 0/1, one per token ({len(ids)}), got {got!r:.80} ({case})",
                 "return the mask list.")
        got_all.append([int(v) for v in got])
        expected_all.append(list(ref_sft.assistant_loss_mask(ids, _BOS, _EOS, max_length)))
    _fail_at_first_wrong_position(
        name, cases, got_all, expected_all,
        {d: (lambda c, f=f: list(f(c["ids"], _BOS, _EOS, c["max_length"]))) for d, f in KEEP_MISTAKES.items()},
        lambda c, k: _position(c["ids"], k, c["max_length"]),
        "look at the position named above and at the assistant header before it.")
    return f"{len(cases)} sequences (merged and ordinary replies, headers at the very end, cut-off, max_length)"


# ---------------------------------------------------------------------- 9.6 minimind-3's assistant turn
def _m3_turn(message: Dict[str, Any]) -> str:
    return ref_sft.render_chat([message], template="minimind-3")


_TURN_HEAD, _TURN_END = f"{S}assistant\n", f"{E}\n"


def _calls(message: Dict[str, Any], first: str = "if text", between: bool = True, encode_strings: bool = False,
           ascii_only: bool = False, sort_keys: bool = False, separators: Any = None) -> str:
    """The tool-call part of an assistant turn; ``first``: when a newline goes before the first call
    ("if text": when the message has content, as the template does; "if stripped text": when content is left
    once its leading newlines go; "always"; "never")."""
    out = ""
    text = message["content"].lstrip("\n") if first == "if stripped text" else message["content"]
    for n, call_ in enumerate(message.get("tool_calls") or []):
        if (n == 0 and (first == "always" or (first in ("if text", "if stripped text") and text))) or (n > 0 and between):
            out += "\n"
        args = call_["arguments"]
        if encode_strings or not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=ascii_only, sort_keys=sort_keys, separators=separators)
        out += '<tool_call>\n{"name": "' + call_["name"] + '", "arguments": ' + args + "}\n</tool_call>"
    return out


def _turn_variant(message: Dict[str, Any], reasoning=lambda r: r.strip("\n"), content=lambda c: c.lstrip("\n"),
                  block_when_empty: bool = True, **calls: Any) -> str:
    r = message.get("reasoning_content") or ""
    block = "<think>\n" + reasoning(r) + "\n</think>\n\n" if (r or block_when_empty) else ""
    return _TURN_HEAD + block + content(message["content"]) + _calls(message, **calls) + _TURN_END


TURN_MISTAKES = {
    "the reasoning's spaces at its ends removed": lambda m: _turn_variant(m, reasoning=lambda r: r.strip()),
    "the reasoning's newlines at its ends kept": lambda m: _turn_variant(m, reasoning=lambda r: r),
    "only one newline taken off each end of the reasoning":
        lambda m: _turn_variant(m, reasoning=lambda r: r[1 if r.startswith("\n") else 0:len(r) - (1 if r.endswith("\n") else 0)]),
    "no thinking block when the message has no reasoning": lambda m: _turn_variant(m, block_when_empty=False),
    "the reply's leading newlines kept": lambda m: _turn_variant(m, content=lambda c: c),
    "the reply's leading spaces removed": lambda m: _turn_variant(m, content=lambda c: c.lstrip()),
    "the reply stripped at its end too": lambda m: _turn_variant(m, content=lambda c: c.strip("\n")),
    "the reply stripped of all whitespace at both ends": lambda m: _turn_variant(m, content=lambda c: c.strip()),
    "a newline before the first tool call of a turn without text": lambda m: _turn_variant(m, first="always"),
    "no newline between the reply's text and its first tool call": lambda m: _turn_variant(m, first="never"),
    "the newline before the first tool call decided on the reply's text after its leading newlines were removed":
        lambda m: _turn_variant(m, first="if stripped text"),
    "no newline between two tool calls": lambda m: _turn_variant(m, between=False),
    "arguments given as a string encoded as JSON again": lambda m: _turn_variant(m, encode_strings=True),
    "the arguments' characters outside ASCII escaped as \\u sequences": lambda m: _turn_variant(m, ascii_only=True),
    "the arguments' keys sorted": lambda m: _turn_variant(m, sort_keys=True),
    "the arguments' JSON written without the spaces after its commas and colons":
        lambda m: _turn_variant(m, separators=(",", ":")),
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
        # a reply of newlines alone is text all the same: its tool call follows a newline
        {"role": "assistant", "content": "\n\n", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
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
    learner = guarded(render_assistant_turn, name, TEMPLATE_FUNCTIONS)
    got, expected = [], []
    for n, message in enumerate(cases):
        case = f"case {n}: {message!r}"
        out = call(learner, dict(message), name=name, case=case, check_inputs=True, hint=hint)
        if not isinstance(out, str):
            fail(name, f"expected a str, got {type(out).__name__}: {out!r:.80} ({case})", "return the rendered string.")
        got.append(out)
        expected.append(_m3_turn(message))
    wrong = next((n for n in range(len(cases)) if got[n] != expected[n]), None)
    if wrong is not None:
        seen = explaining(TURN_MISTAKES, cases, got, expected, wrong)
        _string_failure(name, got[wrong], expected[wrong], seen, _region, f"case {wrong}: {cases[wrong]!r}", hint)
    return (f"{len(cases)} assistant messages (reasoning with spaces and newlines at both ends, tool calls, leading "
            "whitespace, arguments in Chinese)")


def check_all(render_chat: Callable[..., Any], assistant_loss_mask: Callable[..., Any],
              reply_weights: Callable[..., Any]) -> None:
    check_render_chat(render_chat)
    check_assistant_loss_mask(assistant_loss_mask)
    check_reply_weights(reply_weights)
