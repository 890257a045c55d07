"""Chapter 09 checks accept the reference and reject stubs and the common mistakes, naming each."""

import pytest
import torch
import torch.nn.functional as F

from _helpers import check_fails, stub
from minimind_ref import sft
from minimind_ref.checks import ch09


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
    check_fails(ch09.check_render_chat, ch09.RENDER_MISTAKES[description], "this looks like " + description)


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


# ---------------------------------------------------------------------- 9.4 / 9.5 / 9.6 (the newline edge case, minimind-3)
def test_lost_replies_reference_passes_and_mistakes_are_named(capsys):
    ch09.check_lost_replies(ch09.lost_replies_reference)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch09.check_lost_replies, stub, "9.4", "not implemented")
    seqs = ch09._edge_sequences()
    only_merged = lambda s, b, e: [n for n, ids in enumerate(s) if any(t in ch09._MERGED for t in ids)]
    check_fails(ch09.check_lost_replies, only_merged, "this looks like only the conversations with a newline-led token")
    every = lambda s, b, e: [n for n, ids in enumerate(s) if any(list(ids[j:j + 2]) == b[:2] for j in range(len(ids)))]
    check_fails(ch09.check_lost_replies, every, "this looks like every conversation with an assistant turn")
    check_fails(ch09.check_lost_replies, lambda s, b, e: "1, 2", "expected a list of indices")
    assert len(seqs) == 7


def test_keep_merged_mask_reference_passes_and_mistakes_are_named(capsys):
    ch09.check_keep_merged_mask(sft.assistant_loss_mask)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch09.check_keep_merged_mask, stub, "9.5", "not implemented")
    upstream = lambda ids, b, e, m, merged: sft.assistant_loss_mask(ids, b, e, m)
    check_fails(ch09.check_keep_merged_mask, upstream, "this looks like upstream's rule")
    any_token = lambda ids, b, e, m, merged: sft.assistant_loss_mask(ids, b, e, m, list(range(9, 100)))
    check_fails(ch09.check_keep_merged_mask, any_token, "this looks like any token after the header accepted")

    def after_merged(ids, b, e, m, merged):
        mask = sft.assistant_loss_mask(ids, b, e, m, merged)
        for j in range(len(ids) - 2):
            if ids[j:j + 2] == b[:2] and ids[j + 2] in merged:
                mask[j + 2] = 0
        return mask

    check_fails(ch09.check_keep_merged_mask, after_merged, "this looks like the merged token left out")


def test_render_chat_minimind3_reference_passes_and_mistakes_are_named(capsys):
    ch09.check_render_chat_minimind3(lambda m, g=False: sft.render_chat(m, g))
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch09.check_render_chat_minimind3, stub, "9.6")
    for description, mistake in ch09.M3_MISTAKES.items():
        check_fails(ch09.check_render_chat_minimind3, mistake, "this looks like " + description)
    check_fails(ch09.check_render_chat_minimind3, lambda m, g=False: sft.render_chat(m, g, template="minimind2"), "9.6")
