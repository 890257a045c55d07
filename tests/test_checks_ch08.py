"""Chapter 08 checks accept the reference and reject stubs and typical mistakes."""

import math

import pytest
import torch
import torch.nn.functional as F

from minimind_ref.checks import ch08
from minimind_ref.checks.core import ExerciseError
from minimind_ref.tokenizer import merge_pair
from minimind_ref.train import causal_lm_loss, lr_at, train_step


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 8.x: stub")


# ---------------------------------------------------------------------- 8.1
def merge_solution(ids, pair, new_id):
    """The exercise's worked solution (the package's own function is refused as an answer)."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def test_merge_pair_reference_passes(capsys):
    ch08.check_merge_pair(merge_solution)
    assert capsys.readouterr().out.count("✓") == 1


@pytest.mark.parametrize("check, fn", [
    (ch08.check_merge_pair, merge_pair),
    (ch08.check_merge_pair, lambda ids, pair, new_id: merge_pair(ids, pair, new_id)),
    (ch08.check_causal_lm_loss, causal_lm_loss),
    (ch08.check_causal_lm_loss, lambda logits, ids, mask: causal_lm_loss(logits, ids, mask)),
    (ch08.check_lr_at, lr_at),
    (ch08.check_lr_at, lambda *args: lr_at(*args)),
    (ch08.check_training_step, lambda m, o, x, y, n: float(train_step(m, o, x, y, n)["loss"])),
])
def test_the_packages_own_functions_are_refused(check, fn):
    """The package's function, called directly or through a wrapper, is not an answer."""
    with pytest.raises(ExerciseError, match="minimind_ref's own|the package's own answer to this exercise"):
        check(fn)


def merge_overlapping(ids, pair, new_id):  # merges overlapping occurrences: [5,5,5] -> [9,9]
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif not (i > 0 and (ids[i - 1], ids[i]) == pair):
            out.append(ids[i])
    return out


def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return list(ids[:i]) + [new_id] + list(ids[i + 2 :])
    return list(ids)


@pytest.mark.parametrize("wrong", [stub, merge_overlapping, merge_first_only, lambda ids, pair, new_id: None])
def test_merge_pair_rejects(wrong):
    with pytest.raises(ExerciseError):
        ch08.check_merge_pair(wrong)


# ---------------------------------------------------------------------- 8.2
def causal_lm_loss_solution(logits, input_ids, attention_mask):
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def test_causal_lm_loss_reference_passes(capsys):
    ch08.check_causal_lm_loss(causal_lm_loss_solution)
    assert capsys.readouterr().out.startswith("✓")


def loss_no_shift(logits, ids, mask):
    labels = ids.masked_fill(mask == 0, -100)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def loss_padding_counted(logits, ids, mask):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def loss_mask_on_inputs(logits, ids, mask):  # masks the predicting position instead of the target
    labels = ids[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def loss_mean_over_all(logits, ids, mask):  # zeroes padded terms but divides by every position
    per = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    return (per * mask[:, 1:].reshape(-1)).sum() / per.numel()


def loss_per_token(logits, ids, mask):
    labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none")


@pytest.mark.parametrize("wrong", [stub, loss_no_shift, loss_padding_counted, loss_mask_on_inputs, loss_mean_over_all, loss_per_token])
def test_causal_lm_loss_rejects(wrong):
    with pytest.raises(ExerciseError):
        ch08.check_causal_lm_loss(wrong)


# ---------------------------------------------------------------------- 8.3
def lr_at_solution(step, max_steps, warmup_steps, max_lr, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def test_lr_at_reference_passes(capsys):
    ch08.check_lr_at(lr_at_solution)
    assert capsys.readouterr().out.startswith("✓")


def lr_warmup_from_zero(step, max_steps, warmup, hi, lo):
    if step < warmup:
        return hi * step / warmup
    return lr_at_solution(step, max_steps, warmup, hi, lo)


def lr_no_floor(step, max_steps, warmup, hi, lo):
    if step < warmup:
        return hi * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return 0.5 * hi * (1 + math.cos(math.pi * p))


def lr_not_capped(step, max_steps, warmup, hi, lo):
    if step < warmup:
        return hi * (step + 1) / warmup
    p = (step - warmup) / max(1, max_steps - warmup)
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * p))


def lr_cosine_over_all_steps(step, max_steps, warmup, hi, lo):  # ignores the warmup offset in the cosine
    if step < warmup:
        return hi * (step + 1) / warmup
    p = min(1.0, step / max_steps)
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * p))


@pytest.mark.parametrize("wrong", [stub, lr_warmup_from_zero, lr_no_floor, lr_not_capped, lr_cosine_over_all_steps,
                                   lambda *a: None])
def test_lr_at_rejects(wrong):
    with pytest.raises(ExerciseError):
        ch08.check_lr_at(wrong)


# ---------------------------------------------------------------------- 8.4
def step_reference(model, optimizer, x, y, max_norm):
    """The exercise's worked solution (the package's own train_step is refused as an answer)."""
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return out.loss.item()


def step_tensor_loss(model, optimizer, x, y, max_norm):
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return out.loss


def test_training_step_reference_passes(capsys):
    ch08.check_training_step(step_reference)
    assert capsys.readouterr().out.count("✓") == 1


def test_training_step_wants_a_float_not_a_tensor():
    assert "returns the loss as a tensor" in message(ch08.check_training_step, step_tensor_loss)


def step_no_clip(model, optimizer, x, y, max_norm):
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    optimizer.step()
    optimizer.zero_grad()
    return out.loss.item()


def step_clip_after(model, optimizer, x, y, max_norm):
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.zero_grad()
    return out.loss.item()


def step_no_zero_grad(model, optimizer, x, y, max_norm):
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return out.loss.item()


def step_no_aux(model, optimizer, x, y, max_norm):
    out = model(x, labels=y)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return out.loss.item()


def step_clip_value(model, optimizer, x, y, max_norm):  # clips each element, not the global norm
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return out.loss.item()


def step_returns_total(model, optimizer, x, y, max_norm):  # returns CE + aux instead of CE
    out = model(x, labels=y)
    loss = out.loss + out.aux_loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


@pytest.mark.parametrize("wrong", [stub, step_no_clip, step_clip_after, step_no_zero_grad, step_no_aux, step_clip_value,
                                   step_returns_total])
def test_training_step_rejects(wrong):
    with pytest.raises(ExerciseError):
        ch08.check_training_step(wrong)


# ---------------------------------------------------------------------- the messages name the mistake
def message(check, fn):
    with pytest.raises(ExerciseError) as err:
        check(fn)
    return str(err.value)


def merge_in_place(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == tuple(pair):
            ids[i:i + 2] = [new_id]
        i += 1
    return ids


def merge_misses_the_end(ids, pair, new_id):  # the look at the next token stops one position early
    out, i = [], 0
    while i < len(ids):
        if i + 2 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_drops_last(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_keeps_second(ids, pair, new_id):  # moves by one after a merge
    out = []
    for i in range(len(ids)):
        out.append(new_id if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair else ids[i])
    return out


def merge_from_the_right(ids, pair, new_id):
    out = merge_solution(list(reversed(ids)), (pair[1], pair[0]), new_id)
    return list(reversed(out))


@pytest.mark.parametrize("wrong, fragment", [
    (merge_misses_the_end, "a pair at the very end of the list left unmerged"),
    (merge_drops_last, "dropping the last token"),
    (merge_keeps_second, "the pair's second token kept"),
    (merge_from_the_right, "scanning from right to left"),
    (merge_overlapping, "merging overlapping occurrences"),
    (merge_first_only, "merging only the first occurrence"),
    (merge_in_place, "changed its input"),
    (lambda ids, pair, new_id: None, "returned None"),
])
def test_merge_pair_messages(wrong, fragment):
    assert fragment in message(ch08.check_merge_pair, wrong)


@pytest.mark.parametrize("wrong, fragment", [
    (loss_no_shift, "no shift"),
    (loss_padding_counted, "padding counted as targets"),
    (loss_mask_on_inputs, "the mask applied to the predicting position"),
    (loss_mean_over_all, "the mean taken over every position"),
])
def test_causal_lm_loss_messages(wrong, fragment):
    msg = message(ch08.check_causal_lm_loss, wrong)
    assert fragment in msg and msg.index("hint:") < msg.index('show_solution("8.2")')


def lr_warmup_late(step, max_steps, warmup, hi, lo):  # reaches max_lr only after the warmup
    if step < warmup:
        return hi * (step + 1) / (warmup + 1)
    return lr_at_solution(step, max_steps, warmup, hi, lo)


def lr_progress_over_all_steps(step, max_steps, warmup, hi, lo):
    if step < warmup:
        return hi * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max_steps)
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * p))


def lr_divides_by_zero(step, max_steps, warmup, hi, lo):  # no guard for a schedule without a decay phase
    if step < warmup:
        return hi * (step + 1) / warmup
    p = min(1.0, (step - warmup) / (max_steps - warmup))
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * p))


@pytest.mark.parametrize("wrong, fragment", [
    (lr_warmup_late, "a warmup that reaches max_lr one step late"),
    (lr_progress_over_all_steps, "measured over max_steps instead of over the decay phase"),
    (lr_warmup_from_zero, "a warmup that starts at 0"),
    (lr_no_floor, "decays to 0 instead of to min_lr"),
    (lr_not_capped, "progress not capped at 1"),
    (lr_cosine_over_all_steps, "ignores the warmup offset"),
])
def test_lr_at_messages(wrong, fragment):
    msg = message(ch08.check_lr_at, wrong)
    assert fragment in msg
    assert "expected" not in msg and "than the reference's" in msg, "8.3 hides the rate the schedule gives at a step"


def test_lr_at_without_a_guard_is_told_which_schedule_divides_by_zero():
    msg = message(ch08.check_lr_at, lr_divides_by_zero)
    assert "your function raised ZeroDivisionError" in msg and "max_steps=30, warmup_steps=30" in msg, msg


def step_draft(model, optimizer, x, y, max_norm):  # the chapter's draft: three flaws at once
    out = model(x, labels=y)
    out.loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return out.loss


def step_draft_aux_fixed(model, optimizer, x, y, max_norm):  # two flaws left
    out = model(x, labels=y)
    (out.loss + out.aux_loss).backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return out.loss


@pytest.mark.parametrize("wrong, fragments", [
    (step_draft, ["the clipping done after the optimizer's step", "gradients never cleared", "auxiliary loss left out"]),
    (step_draft_aux_fixed, ["the clipping done after the optimizer's step", "gradients never cleared"]),
])
def test_training_step_names_every_flaw_of_the_draft(wrong, fragments):
    msg = message(ch08.check_training_step, wrong)
    assert all(f in msg for f in fragments), msg
    if wrong is step_draft_aux_fixed:
        assert "auxiliary" not in msg


@pytest.mark.parametrize("wrong, fragment", [
    (step_no_clip, "gradients applied unclipped"),
    (step_clip_after, "the clipping done after the optimizer's step"),
    (step_no_zero_grad, "gradients never cleared"),
    (step_no_aux, "the MoE auxiliary loss left out"),
    (step_returns_total, "returning the total minimised loss"),
])
def test_training_step_messages(wrong, fragment):
    assert fragment in message(ch08.check_training_step, wrong)


# ---------------------------------------------------------------------- issue 44, third newcomer probe
from _helpers import check_fails  # noqa: E402


def _step(model, optimizer, input_ids, labels, max_grad_norm, clear_first=False, clip="norm"):
    if clear_first:
        optimizer.zero_grad()
    out = model(input_ids, labels=labels)
    (out.loss + out.aux_loss).backward()
    if clip == "norm":
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    elif clip == "value":
        torch.nn.utils.clip_grad_value_(model.parameters(), max_grad_norm)
    else:
        for p in model.parameters():
            torch.nn.utils.clip_grad_norm_([p], max_grad_norm)
    optimizer.step()
    if not clear_first:
        optimizer.zero_grad()
    return out.loss.item()


def test_training_step_that_clears_gradients_first_is_caught():
    """Probe 3: zero_grad at the start of the step passed the check, then the notebook's next cell (".grad holds
    nothing after the step") printed False and its assert fired. The check now catches it, and names it."""
    check_fails(ch08.check_training_step, lambda *a: _step(*a, clear_first=True),
                "this looks like the gradients cleared at the start of the step instead of after it")


@pytest.mark.parametrize("clip, fragment", [
    ("value", "every gradient entry clipped on its own"),
    ("each", "each parameter's gradient clipped to max_grad_norm on its own"),
])
def test_training_step_clipping_mistakes_are_named(clip, fragment):
    check_fails(ch08.check_training_step, lambda *a: _step(*a, clip=clip), "this looks like " + fragment)


def _lr(step, max_steps, warmup_steps, max_lr, min_lr, shape=None, min_from_max_steps=False):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if min_from_max_steps and step >= max_steps:
        return min_lr
    if step > max_steps:
        return min_lr
    if max_steps == warmup_steps:
        return max_lr
    p = (step - warmup_steps) / (max_steps - warmup_steps)
    return shape(p, max_lr, min_lr) if shape else min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))


def test_lr_at_probe_mistakes_are_named_across_every_schedule():
    """Probe 3: min_lr from step max_steps on was named 'a cosine that ignores the warmup offset' (the schedule
    it fails on matched that mistake alone); three decay formulas were not named."""
    check_fails(ch08.check_lr_at, lambda *a: _lr(*a, min_from_max_steps=True),
                "this looks like step max_steps run at min_lr in a schedule without a decay phase")
    check_fails(ch08.check_lr_at, lambda *a: _lr(*a, shape=lambda p, hi, lo: lo + (hi - lo) * math.cos(math.pi * p)),
                "this looks like the cosine's own range (from 1 down to -1) not mapped")
    check_fails(ch08.check_lr_at, lambda *a: _lr(*a, shape=lambda p, hi, lo: 0.5 * hi * (1 + math.cos(math.pi * p))),
                "this looks like a cosine that decays to 0 instead of to min_lr")
    check_fails(ch08.check_lr_at,
                lambda *a: _lr(*a, shape=lambda p, hi, lo: lo + (hi - lo) * math.cos(math.pi / 2 * p)),
                "this looks like a quarter period of the cosine")


def _loss_both_real(logits, input_ids, attention_mask):
    keep = (attention_mask[:, 1:] * attention_mask[:, :-1]) == 1
    labels = input_ids[:, 1:].masked_fill(~keep, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _loss_row_means(logits, input_ids, attention_mask):
    per = F.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    m = attention_mask[:, 1:].float()
    return ((per * m).sum(1) / m.sum(1)).mean()


def _loss_summed(logits, input_ids, attention_mask):
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum")


def test_causal_lm_loss_probe_mistakes_are_named_from_every_batch():
    """Probe 3: requiring both positions to be real was named 'the mask applied to the predicting position' (on the
    left-padded batch the two agree; on the right-padded one they do not); a per-row mean and a sum were unnamed."""
    message = check_fails(ch08.check_causal_lm_loss, _loss_both_real,
                          "this looks like a term kept only when both its predicting position and its target are real")
    assert "predicting position instead of the target" not in message
    check_fails(ch08.check_causal_lm_loss, _loss_row_means, "this looks like each row averaged on its own")
    check_fails(ch08.check_causal_lm_loss, _loss_summed, "this looks like the kept terms summed instead of averaged")


def test_merge_pair_matched_in_either_order_is_named():
    def either(ids, pair, new_id):
        out, i = [], 0
        while i < len(ids):
            if i + 1 < len(ids) and (ids[i], ids[i + 1]) in (tuple(pair), tuple(pair)[::-1]):
                out.append(new_id)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        return out

    check_fails(ch08.check_merge_pair, either, "this looks like the pair matched in either order")


def test_lr_at_named_from_the_first_wrong_schedule_when_none_explains_them_all():
    """Probe 3 (after the all-schedule naming): the cosine carried on past max_steps, in a function that keeps
    max_lr for a schedule without a decay phase, fits no mistake on every schedule; the one mistake that explains
    the first wrong schedule is named (as before)."""
    def carried_on(step, max_steps, warmup_steps, max_lr, min_lr):
        if step < warmup_steps:
            return max_lr * (step + 1) / warmup_steps
        if max_steps == warmup_steps:
            return max_lr
        p = (step - warmup_steps) / (max_steps - warmup_steps)
        return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))

    check_fails(ch08.check_lr_at, carried_on, "this looks like progress not capped at 1")
