"""Chapter 09 checks accept the reference and reject stubs and the common mistakes, naming each."""

import pytest
import torch
import torch.nn.functional as F

from _helpers import check_fails, stub
from minimind_ref import sft
from minimind_ref.checks import ch09


# ---------------------------------------------------------------------- 9.1
def test_render_chat_reference_passes(capsys):
    ch09.check_render_chat(sft.render_chat)
    assert capsys.readouterr().out.startswith("✓")


def test_render_chat_rejects_stub():
    check_fails(ch09.check_render_chat, stub, "9.1")


@pytest.mark.parametrize("description", list(ch09.RENDER_MISTAKES))
def test_render_chat_names_each_mistake(description):
    check_fails(ch09.check_render_chat, ch09.RENDER_MISTAKES[description], "this looks like " + description)


def test_render_chat_rejects_input_edits_and_non_strings():
    def edits(messages, add_generation_prompt=False):
        messages.append({"role": "assistant", "content": ""})
        return sft.render_chat(messages[:-1], add_generation_prompt)

    check_fails(ch09.check_render_chat, edits, "in place")
    check_fails(ch09.check_render_chat, lambda m, g=False: sft.render_chat(m, g).encode(), "expected a str")


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
