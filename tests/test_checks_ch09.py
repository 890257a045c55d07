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


# ---------------------------------------------------------------------- 9.3
def reference_loss(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def loss_no_shift(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def loss_mean_over_all(logits, labels):
    y = labels[:, 1:].reshape(-1)
    per = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), y.clamp_min(0), reduction="none")
    return (per * (y != -100)).mean()


def loss_per_row(logits, labels):
    y = labels[:, 1:]
    per = F.cross_entropy(logits[:, :-1].transpose(1, 2), y.clamp_min(0), reduction="none") * (y != -100)
    return (per.sum(1) / (y != -100).sum(1)).mean()


def loss_wrong_direction(logits, labels):
    return F.cross_entropy(logits[:, 1:].reshape(-1, logits.shape[-1]), labels[:, :-1].reshape(-1), ignore_index=-100)


def test_sft_loss_reference_passes(capsys):
    ch09.check_sft_loss(reference_loss)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("wrong, words", [
    (stub, ["9.3"]),
    (loss_no_shift, ["this looks like no shift"]),
    (loss_mean_over_all, ["this looks like masked positions zeroed but the mean taken over every position"]),
    (loss_per_row, ["this looks like a mean per conversation"]),
    (loss_wrong_direction, ["this looks like the shift in the wrong direction"]),
    (lambda logits, labels: reference_loss(logits, labels).detach(), ["no gradient"]),
    (lambda logits, labels: float(reference_loss(logits, labels).detach()), ["expected a torch.Tensor"]),
])
def test_sft_loss_names_each_mistake(wrong, words):
    check_fails(ch09.check_sft_loss, wrong, *words)


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

    check_fails(ch09.check_render_assistant_turn, strips_all, "this looks like the reasoning stripped of spaces too",
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
