"""Chapter 09 checks accept the reference and reject stubs and the common mistakes, naming each."""

import pytest
import torch
import torch.nn.functional as F

from _helpers import check_fails, stub
from minimind_ref import sft
from minimind_ref.checks import ch09, delegation


@pytest.fixture(autouse=True)
def _references_may_be_called(monkeypatch):
    """These tests pass the package's own functions, and mistakes built from them, as the learner's:
    the delegation guard is off here except in the tests of the guard."""
    monkeypatch.setattr(delegation, "ENFORCED", False)


@pytest.mark.parametrize("check, delegate", [
    (ch09.check_render_chat, lambda m, g=False: sft.render_chat(m, g, template="minimind2")),
    (ch09.check_assistant_loss_mask, lambda ids, b, e, m: sft.upstream_loss_mask(ids, b, e, m, "d65ef2c")),
    (ch09.check_reply_weights, lambda labels: torch.stack([
        __import__("minimind_ref.model", fromlist=["x"]).next_token_loss(torch.zeros(*labels.shape, 2), labels)])),
    (ch09.check_lost_replies, ch09.lost_replies_reference),
    (ch09.check_keep_whole_mask, sft.assistant_loss_mask),
    (ch09.check_render_assistant_turn, lambda m: sft.render_chat([m])),
])
def test_a_function_that_calls_the_package_answer_fails(monkeypatch, check, delegate):
    """The chapter imports the functions these exercises rebuild; handing the work to them passes nothing."""
    monkeypatch.setattr(delegation, "ENFORCED", True)
    check_fails(check, delegate, "your function calls ", "the package's own answer to this exercise")


# ---------------------------------------------------------------------- 9.1
def m2(messages, add_generation_prompt=False):
    """c090b69's template (exercise 9.1)."""
    return sft.render_chat(messages, add_generation_prompt, template="minimind2")


def test_render_chat_reference_passes(capsys):
    ch09.check_render_chat(m2)
    assert capsys.readouterr().out.startswith("✓")


def test_render_chat_rejects_stub():
    check_fails(ch09.check_render_chat, stub, "9.1")


@pytest.mark.parametrize("description", list(ch09.RENDER_MISTAKES))
def test_render_chat_names_each_mistake(description):
    message = check_fails(ch09.check_render_chat, ch09.RENDER_MISTAKES[description], "this looks like " + description,
                          "differs from the template's at character")
    assert "expected '" not in message  # the learner's own text is shown, never the template's


def test_render_chat_rejects_input_edits_and_non_strings():
    def edits(messages, add_generation_prompt=False):
        messages.append({"role": "assistant", "content": ""})
        return m2(messages[:-1], add_generation_prompt)

    check_fails(ch09.check_render_chat, edits, "in place")
    check_fails(ch09.check_render_chat, lambda m, g=False: m2(m, g).encode(), "expected a str")


# ---------------------------------------------------------------------- 9.2
def test_assistant_loss_mask_reference_passes(capsys):
    ch09.check_assistant_loss_mask(sft.assistant_loss_mask)
    assert capsys.readouterr().out.startswith("✓")


def test_assistant_loss_mask_rejects_stub():
    check_fails(ch09.check_assistant_loss_mask, stub, "9.2")


@pytest.mark.parametrize("description", list(ch09.MASK_MISTAKES))
def test_assistant_loss_mask_names_each_mistake(description):
    check_fails(ch09.check_assistant_loss_mask, ch09.MASK_MISTAKES[description], "this looks like " + description)


def test_assistant_loss_mask_failures_show_a_position_not_the_mask():
    message = check_fails(ch09.check_assistant_loss_mask, ch09._mask_truncated_dropped, "position 18 (in an assistant reply)",
                          "should count but does not")
    assert "expected [" not in message
    check_fails(ch09.check_assistant_loss_mask, lambda ids, b, e, m: [0] * (len(ids) - 1), "one per token")


def test_assistant_loss_mask_accepts_a_tensor_and_rejects_in_place_edits(capsys):
    ch09.check_assistant_loss_mask(lambda *a: torch.tensor(sft.assistant_loss_mask(*a)))
    assert capsys.readouterr().out.startswith("✓")

    def edits(ids, bos, eos, max_length):
        mask = sft.assistant_loss_mask(ids, bos, eos, max_length)
        ids[:] = mask
        return mask

    check_fails(ch09.check_assistant_loss_mask, edits, "in place")


# ---------------------------------------------------------------------- 9.3 how much each conversation weighs
def test_reply_weights_reference_passes_and_predicts_the_models_loss(capsys):
    ch09.check_reply_weights(ch09.reply_weights_reference)
    assert capsys.readouterr().out.startswith("✓")
    # the weights are what they claim: the batch's loss is the weighted sum of each conversation's own mean loss
    from minimind_ref.model import next_token_loss

    for c in ch09._weight_cases():
        labels = c["labels"]
        logits = torch.randn(*labels.shape, 50, generator=torch.Generator().manual_seed(1))
        own = torch.stack([next_token_loss(logits[k:k + 1], labels[k:k + 1]) if (labels[k, 1:] != -100).any()
                           else torch.tensor(0.0) for k in range(labels.shape[0])])
        torch.testing.assert_close((ch09.reply_weights_reference(labels) * own).sum(), next_token_loss(logits, labels),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("description", list(ch09._weight_mistakes(ch09._weight_cases()[0]["labels"])))
def test_reply_weights_names_each_mistake(description):
    message = check_fails(ch09.check_reply_weights, lambda labels: ch09._weight_mistakes(labels)[description](),
                          "this looks like " + description)
    assert "expected " not in message  # shown=False: only which way a weight is off


@pytest.mark.parametrize("wrong, words", [
    (stub, ["9.3", "not implemented"]),
    (lambda labels: (labels[:, 1:] != -100).sum(1), ["expected a float tensor"]),
    (lambda labels: [0.5] * labels.shape[0], ["values differ"]),
])
def test_reply_weights_other_failures(wrong, words):
    check_fails(ch09.check_reply_weights, wrong, *words)


def measured_with_cross_entropy(labels):
    """Measuring the weights on a loss instead of predicting them."""
    b, t = labels.shape
    out = []
    for k in range(b):
        logits = torch.zeros(b, t, 2)
        logits[k, :, 0] = 5.0
        y = torch.where(labels == -100, labels, torch.ones_like(labels))
        out.append(F.cross_entropy(logits[:, :-1].reshape(-1, 2), y[:, 1:].reshape(-1), ignore_index=-100))
    return torch.stack(out)


def measured_with_autograd(labels):
    b, t = labels.shape
    logits = torch.zeros(b, t, 3, requires_grad=True)
    y = torch.where(labels == -100, labels, torch.ones_like(labels))
    logp = logits[:, :-1].log_softmax(-1).gather(-1, y[:, 1:].clamp(min=0)[..., None])[..., 0]
    (-(logp * (y[:, 1:] != -100)).sum()).backward()
    g = logits.grad.abs().sum((1, 2))
    return g / g.sum()


@pytest.mark.parametrize("measuring, fragment", [
    (measured_with_cross_entropy, "a loss function (F.cross_entropy"),
    (measured_with_autograd, "a loss function (F.cross_entropy"),
])
def test_reply_weights_refuses_a_measurement(monkeypatch, measuring, fragment):
    """Issue 44 (probe 2): the weights are predicted from the labels; measuring them on a loss is refused."""
    monkeypatch.setattr(delegation, "ENFORCED", True)
    check_fails(ch09.check_reply_weights, measuring, fragment, "not to measure them on a loss")


# ---------------------------------------------------------------------- 9.4 which conversations lose a reply
def test_lost_replies_reference_passes(capsys):
    ch09.check_lost_replies(ch09.lost_replies_reference)
    assert capsys.readouterr().out.startswith("✓")


def headers_minus_markers(sequences, bos, eos):
    """Another right answer: count the headers and the full markers over every position."""
    return [n for n, ids in enumerate(sequences)
            if sum(ids[j:j + len(bos) - 1] == bos[:-1] for j in range(len(ids)))
            > sum(ids[j:j + len(bos)] == bos for j in range(len(ids)))]


def test_lost_replies_names_a_header_at_the_very_end_counted_as_lost():
    """Issue 44: counting headers against full markers lists a sequence cut right after an assistant
    header, which has no reply to lose; the text promises that case, so the check tries it."""
    check_fails(ch09.check_lost_replies, headers_minus_markers, "this looks like an assistant header with nothing after "
                "it counted as a lost reply", "sequence 10", "listed, but upstream's rule labels every reply it has")


@pytest.mark.parametrize("description", list(ch09.LOST_MISTAKES))
def test_lost_replies_names_each_mistake(description):
    message = check_fails(ch09.check_lost_replies, ch09.LOST_MISTAKES[description], "this looks like " + description)
    assert "expected [" not in message  # the list of indices is never shown


def test_lost_replies_boundaries_and_other_failures():
    """Issue 37: a scan that stops len(bos_ids) short of the end is caught on the sequence whose header
    sits at the very end; a full marker at the very end must not be listed."""
    message = check_fails(ch09.check_lost_replies, ch09._lost_scan_short, "sequence 7", "the very end", "left out")
    assert "hint: compare with what your mask of Exercise 9.2 labels" in message
    check_fails(ch09.check_lost_replies, ch09._lost_marker_scan_short, "sequence 8", "the last thing", "listed")
    check_fails(ch09.check_lost_replies, stub, "9.4", "not implemented")
    check_fails(ch09.check_lost_replies, lambda s, b, e: "1, 2", "expected a list of indices")
    check_fails(ch09.check_lost_replies, lambda s, b, e: ch09.lost_replies_reference(s, b, e)[::-1], "ascending order")

    def edits(sequences, bos, eos):
        sequences.pop()
        return ch09.lost_replies_reference(sequences, bos, eos)

    check_fails(ch09.check_lost_replies, edits, "in place")


# ---------------------------------------------------------------------- 9.5 a mask that keeps every reply whole
def test_keep_whole_mask_reference_passes(capsys):
    ch09.check_keep_whole_mask(sft.assistant_loss_mask)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("description", list(ch09.KEEP_MISTAKES))
def test_keep_whole_mask_names_each_mistake(description):
    message = check_fails(ch09.check_keep_whole_mask, ch09.KEEP_MISTAKES[description], "this looks like " + description,
                          "position ")
    assert "expected [" not in message  # the mask is never shown


def test_keep_whole_mask_other_failures():
    check_fails(ch09.check_keep_whole_mask, stub, "9.5", "not implemented")

    def reads_past_the_end(ids, bos, eos, max_length):  # looks at the token after every header, even at the end
        header = bos[:-1]
        for j in range(len(ids)):
            if ids[j:j + len(header)] == header:
                ids[j + len(header)]
        return sft.assistant_loss_mask(ids, bos, eos, max_length)

    check_fails(ch09.check_keep_whole_mask, reads_past_the_end, "IndexError", "a header that ends the sequence")

    def counts_the_newline_at_the_end(ids, bos, eos, max_length):
        mask = sft.assistant_loss_mask(ids, bos, eos, max_length)
        if ids[-len(bos):] == bos:
            mask[-1] = 1
        return mask

    check_fails(ch09.check_keep_whole_mask, counts_the_newline_at_the_end, "the header's newline) counts but should not",
                "a full marker that ends the sequence")
    check_fails(ch09.check_keep_whole_mask, lambda ids, b, e, m: [1] * len(ids), "in a system or user turn")
    check_fails(ch09.check_keep_whole_mask, lambda ids, b, e, m: [0], "one per token")


# ---------------------------------------------------------------------- 9.6 minimind-3's assistant turn
def test_render_assistant_turn_reference_passes(capsys):
    ch09.check_render_assistant_turn(lambda m: sft.render_chat([m]))
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("description", list(ch09.TURN_MISTAKES))
def test_render_assistant_turn_names_each_mistake(description):
    message = check_fails(ch09.check_render_assistant_turn, ch09.TURN_MISTAKES[description],
                          "this looks like " + description, "differs from the template's at character")
    assert "<think>\\n\\n</think>" not in message and "lstrip" not in message and "strip(" not in message


def test_render_assistant_turn_catches_strip_instead_of_strip_newline():
    """Issue 37: .strip() instead of .strip("\\n") on the reasoning, caught on a case with spaces and
    newlines at both ends."""
    def strips_all(m):
        r = (m.get("reasoning_content") or "").strip()
        return sft.render_chat([dict(m, reasoning_content=r)]) if r else sft.render_chat([dict(m, reasoning_content=None)])

    check_fails(ch09.check_render_assistant_turn, strips_all, "this looks like the reasoning's spaces at its ends removed",
                "in the thinking block", "case 1")


def test_render_assistant_turn_names_escaped_and_sorted_arguments():
    """Issue 44: json.dumps with its default escaping, or with sorted keys, on arguments in Chinese."""
    import json

    def with_dumps(**options):
        def render(m):
            calls = [dict(c, arguments=c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"],
                                                                                                        **options))
                     for c in m.get("tool_calls") or []]
            return sft.render_chat([dict(m, tool_calls=calls) if calls else m])
        return render

    check_fails(ch09.check_render_assistant_turn, with_dumps(), "this looks like the arguments' characters outside ASCII "
                "escaped", "in the tool calls")
    check_fails(ch09.check_render_assistant_turn, with_dumps(ensure_ascii=False, sort_keys=True),
                "this looks like the arguments' keys sorted", "in the tool calls")


def test_render_assistant_turn_other_failures():
    check_fails(ch09.check_render_assistant_turn, stub, "9.6", "not implemented")
    check_fails(ch09.check_render_assistant_turn, lambda m: sft.render_chat([m], template="minimind2"),
                "in the turn's header")
    check_fails(ch09.check_render_assistant_turn, lambda m: sft.render_chat([m])[:-1], "in the end of the turn")
    check_fails(ch09.check_render_assistant_turn, lambda m: sft.render_chat([m]).encode(), "expected a str")

    def edits(m):
        m.pop("reasoning_content", None)
        return sft.render_chat([m])

    check_fails(ch09.check_render_assistant_turn, edits, "in place")


# ---------------------------------------------------------------------- issue 44, the second newcomer probe
# The mistakes a newcomer planted in chapter 09's exercises that the checks passed, misnamed or left unnamed;
# each is a learner's own code (not one of the checks' mistake functions), and its message must name it.
def probe_render(default_when=lambda messages: messages[0]["role"] != "system", edit=lambda text: text,
                 joiner=None):
    def render(messages, add_generation_prompt=False):
        turns = list(messages)
        if default_when(messages):
            turns = [{"role": "system", "content": "You are a helpful assistant"}] + turns
        parts = ["<|im_start|>" + m["role"] + "\n" + edit(m["content"]) + "<|im_end|>" for m in turns]
        if joiner is not None:
            out = joiner.join(parts) + ("\n<|im_start|>assistant\n" if add_generation_prompt else "")
        else:
            out = "".join(p + "\n" for p in parts) + ("<|im_start|>assistant\n" if add_generation_prompt else "")
        return out

    return render


@pytest.mark.parametrize("fn, fragment", [
    (probe_render(default_when=lambda ms: not any(m["role"] == "system" for m in ms)),
     "the default system prompt left out because a system message comes later"),
    (probe_render(default_when=lambda ms: True), "the default system prompt written before a conversation's own"),
    (probe_render(joiner="\n"), "no newline after the last turn's <|im_end|>"),
    (probe_render(edit=str.strip), "the whitespace at both ends of a message's text removed"),
    (probe_render(edit=str.rstrip), "the whitespace at the end of a message's text removed"),
])
def test_probe_render_chat_mistakes_are_named(fn, fragment):
    check_fails(ch09.check_render_chat, fn, "this looks like " + fragment)


def probe_mask(stop_past=0, skip_first=False):
    def mask_fn(input_ids, bos_ids, eos_ids, max_length):
        n, mask, i = len(input_ids), [0] * len(input_ids), 0
        while i < n:
            if list(input_ids[i:i + len(bos_ids)]) == list(bos_ids):
                start = end = i + len(bos_ids)
                while end < n and list(input_ids[end:end + len(eos_ids)]) != list(eos_ids):
                    end += 1
                for j in range(start + skip_first, min(end + len(eos_ids), max_length + stop_past, n)):
                    mask[j] = 1
                i = end + len(eos_ids) if end < n else n
            else:
                i += 1
        return mask

    return mask_fn


@pytest.mark.parametrize("fn, fragment", [
    (probe_mask(stop_past=1), "the position max_length itself counted"),
    (probe_mask(skip_first=True), "a reply's first token skipped"),
])
def test_probe_assistant_loss_mask_mistakes_are_named(fn, fragment):
    check_fails(ch09.check_assistant_loss_mask, fn, "this looks like " + fragment)


def probe_lost(rule):
    def lost(sequences, bos_ids, eos_ids):
        return [k for k, seq in enumerate(sequences) if rule(list(seq), list(bos_ids[:-1]), bos_ids[-1], list(bos_ids))]
    return lost


def _no_full_marker(seq, head, nl, bos):
    return not any(seq[i:i + len(bos)] == bos for i in range(len(seq)))


def _first_header_only(seq, head, nl, bos):
    i = next((i for i in range(len(seq) - len(head)) if seq[i:i + len(head)] == head), None)
    return i is not None and seq[i + len(head)] != nl


def _prompt_at_end_too(seq, head, nl, bos):
    return any(seq[i:i + len(head)] == head and (seq[i + len(head)] != nl or i + len(bos) == len(seq))
               for i in range(len(seq) - len(head)))


@pytest.mark.parametrize("fn, fragment", [
    (probe_lost(_no_full_marker), "a sequence without any full assistant marker listed"),
    (probe_lost(_first_header_only), "only the first assistant header of a sequence looked at"),
    (probe_lost(_prompt_at_end_too), "a full marker that ends the sequence (a generation prompt) counted as a lost reply"),
    (lambda s, b, e: [k + 1 for k in ch09.lost_replies_reference(s, b, e)], "the indices counted from 1"),
])
def test_probe_lost_replies_mistakes_are_named(fn, fragment):
    check_fails(ch09.check_lost_replies, fn, "this looks like " + fragment)


def probe_keep(header_length=None, end_length=None, guard_end=True):
    def keep(input_ids, bos_ids, eos_ids, max_length):
        ids, n = list(input_ids), len(input_ids)
        head, nl = list(bos_ids[:-1])[:header_length], bos_ids[-1]
        mask, i = [0] * n, 0
        while i < n:
            if ids[i:i + len(head)] == head and (i + len(head) < n or not guard_end):
                start = i + len(head) + (1 if ids[i + len(head)] == nl else 0)
                end = start
                while end < n and ids[end:end + len(eos_ids)] != list(eos_ids):
                    end += 1
                for j in range(start, min(end + (end_length or len(eos_ids)), max_length, n)):
                    mask[j] = 1
                i = end + len(eos_ids) if end < n else n
            else:
                i += 1
        return mask

    return keep


@pytest.mark.parametrize("fn, fragments", [
    (probe_keep(end_length=1), ["this looks like the newline after <|im_end|> left out"]),
    (probe_keep(header_length=1), ["this looks like every <|im_start|> taken for an assistant header"]),
    (probe_keep(guard_end=False), ["IndexError", "a header can be the last thing in a sequence"]),
])
def test_probe_keep_whole_mask_mistakes_are_named(fn, fragments):
    check_fails(ch09.check_keep_whole_mask, fn, *fragments)


def probe_turn(first_newline_on=lambda content: content, separators=None):
    import json

    def turn(message):
        out = ("<|im_start|>assistant\n<think>\n" + (message.get("reasoning_content") or "").strip("\n")
               + "\n</think>\n\n" + message["content"].lstrip("\n"))
        for k, call in enumerate(message.get("tool_calls") or []):
            if k > 0 or first_newline_on(message["content"]):
                out += "\n"
            args = call["arguments"]
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, separators=separators)
            out += '<tool_call>\n{"name": "' + call["name"] + '", "arguments": ' + args + "}\n</tool_call>"
        return out + "<|im_end|>\n"

    return turn


def test_probe_assistant_turn_reference_passes(capsys):
    ch09.check_render_assistant_turn(probe_turn())
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("fn, fragment", [
    (probe_turn(first_newline_on=lambda content: content.lstrip("\n")),
     "the newline before the first tool call decided on the reply's text after its leading newlines were removed"),
    (probe_turn(separators=(",", ":")), "the arguments' JSON written without the spaces after its commas and colons"),
])
def test_probe_assistant_turn_mistakes_are_named(fn, fragment):
    check_fails(ch09.check_render_assistant_turn, fn, "this looks like " + fragment)
