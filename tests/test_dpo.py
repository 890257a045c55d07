"""Chapter 11's DPO equals upstream's trainer/train_dpo.py and dataset/lm_dataset.py DPODataset
(jingyaogong/minimind at d65ef2c: the summed log-probabilities; c090b69's mean as the variant), and
its objective is safe inside minimind_ref.train's loop.

The upstream functions are transcribed below as the reference the tests compare with (the parity
fixture of tests/test_upstream_parity_posttrain.py runs upstream's own files)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from _helpers import tiny_model
from minimind_ref import chat_data, dpo
from minimind_ref.data import make_corpus
from minimind_ref.sft import encode_chat, marker_ids, render_chat
from minimind_ref.tokenizer import train_bpe_tokenizer


# ---------------------------------------------------------------------- upstream, transcribed
def upstream_logits_to_log_probs(logits, labels):
    log_probs = F.log_softmax(logits, dim=2)
    return torch.gather(log_probs, dim=2, index=labels.unsqueeze(2)).squeeze(-1)


def c090b69_dpo_loss(ref_log_probs, policy_log_probs, mask, beta):
    """c090b69's dpo_loss: the mean log-probability per reply token (upstream issue #298)."""
    seq_lengths = mask.sum(dim=1, keepdim=True).clamp_min(1e-8)
    ref_log_probs = (ref_log_probs * mask).sum(dim=1) / seq_lengths.squeeze()
    policy_log_probs = (policy_log_probs * mask).sum(dim=1) / seq_lengths.squeeze()
    batch_size = ref_log_probs.shape[0]
    chosen_ref_log_probs = ref_log_probs[:batch_size // 2]
    reject_ref_log_probs = ref_log_probs[batch_size // 2:]
    chosen_policy_log_probs = policy_log_probs[:batch_size // 2]
    reject_policy_log_probs = policy_log_probs[batch_size // 2:]
    pi_logratios = chosen_policy_log_probs - reject_policy_log_probs
    ref_logratios = chosen_ref_log_probs - reject_ref_log_probs
    logits = pi_logratios - ref_logratios
    loss = -F.logsigmoid(beta * logits)
    return loss.mean()


def upstream_dpo_loss(ref_log_probs, policy_log_probs, mask, beta):
    """d65ef2c's dpo_loss and the DPO paper's: sequence log-probabilities are sums over the reply's tokens."""
    ref = (ref_log_probs * mask).sum(1)
    pol = (policy_log_probs * mask).sum(1)
    b = ref.shape[0] // 2
    return (-F.logsigmoid(beta * ((pol[:b] - pol[b:]) - (ref[:b] - ref[b:])))).mean()


def upstream_generate_loss_mask(input_ids, bos_id, eos_id, max_length):
    loss_mask = [0] * len(input_ids)
    i = 0
    while i < len(input_ids):
        if input_ids[i:i + len(bos_id)] == bos_id:
            start = i + len(bos_id)
            end = start
            while end < len(input_ids):
                if input_ids[end:end + len(eos_id)] == eos_id:
                    break
                end += 1
            for j in range(start, min(end + len(eos_id), max_length)):
                loss_mask[j] = 1
            i = end + len(eos_id) if end < len(input_ids) else len(input_ids)
        else:
            i += 1
    return loss_mask


def upstream_dpo_item(tok, record, max_length, pad_id=0, drop=False):
    """DPODataset.__getitem__ (d65ef2c): template (post_processing_chat: ``drop``), truncate + pad to
    max_length, mask, shift."""
    out = {}
    bos_id = tok.encode("<|im_start|>assistant\n").ids
    eos_id = tok.encode("<|im_end|>\n").ids
    for side in ("chosen", "rejected"):
        ids = tok.encode(render_chat(record[side], drop_empty_think=drop)).ids[:max_length]
        ids = ids + [pad_id] * (max_length - len(ids))
        mask = upstream_generate_loss_mask(ids, bos_id, eos_id, max_length)
        out[f"x_{side}"] = torch.tensor(ids[:-1], dtype=torch.long)
        out[f"y_{side}"] = torch.tensor(ids[1:], dtype=torch.long)
        out[f"mask_{side}"] = torch.tensor(mask[1:], dtype=torch.long)
    return out


# ---------------------------------------------------------------------- cases
def make_case(pairs, seq, lengths, seed, mask_dtype=torch.long):
    g = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(torch.randn(2 * pairs, seq, 7, generator=g), -1)[..., 0]
    pol = (ref + 0.3 * torch.randn(2 * pairs, seq, generator=g)).clamp_max(0)
    mask = torch.zeros(2 * pairs, seq, dtype=mask_dtype)
    for row, (start, n) in enumerate(lengths):
        mask[row, start : start + n] = 1
    return ref, pol, mask


CASES = {
    "equal lengths": (2, 9, [(2, 5)] * 4),
    "unequal lengths": (3, 12, [(1, 3), (4, 8), (2, 1), (0, 12), (5, 2), (3, 6)]),
    "one all-zero row": (2, 8, [(1, 4), (2, 0), (3, 5), (1, 2)]),
    "all-zero mask": (2, 6, [(0, 0)] * 4),
    "one pair": (1, 10, [(2, 7), (2, 3)]),
}
BETAS = [0.01, 0.1, 0.5, 2.0]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("mask_dtype", [torch.long, torch.float32])
def test_mean_variant_and_gradient_equal_c090b69(name, beta, mask_dtype):
    pairs, seq, lengths = CASES[name]
    ref, pol, mask = make_case(pairs, seq, lengths, seed=len(name), mask_dtype=mask_dtype)
    pol_ours = pol.clone().requires_grad_(True)
    pol_up = pol.clone().requires_grad_(True)
    ours = dpo.dpo_loss(ref, pol_ours, mask, beta, reduction="mean")
    expected = c090b69_dpo_loss(ref, pol_up, mask, beta)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-7)
    ours.backward()
    expected.backward()
    torch.testing.assert_close(pol_ours.grad, pol_up.grad, rtol=1e-6, atol=1e-8)
    assert torch.isfinite(pol_ours.grad).all()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("beta", BETAS)
def test_default_sum_equals_upstream_and_the_paper(name, beta):
    pairs, seq, lengths = CASES[name]
    ref, pol, mask = make_case(pairs, seq, lengths, seed=7)
    a = pol.clone().requires_grad_(True)
    b = pol.clone().requires_grad_(True)
    ours = dpo.dpo_loss(ref, a, mask, beta)
    expected = upstream_dpo_loss(ref, b, mask, beta)
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-7)
    ours.backward()
    expected.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-8)


def test_all_zero_mask_gives_ln2_and_no_gradient():
    ref, pol, mask = make_case(2, 6, [(0, 0)] * 4, seed=1)
    pol.requires_grad_(True)
    loss = dpo.dpo_loss(ref, pol, mask, 0.1)
    torch.testing.assert_close(loss, torch.tensor(math.log(2.0)), rtol=0, atol=1e-7)
    loss.backward()
    assert torch.equal(pol.grad, torch.zeros_like(pol))


def test_mean_and_sum_differ_by_the_reply_lengths():
    """Per token, 'mean' weighs a reply's tokens by 1/length; 'sum' weighs every token by 1."""
    ref, pol, mask = make_case(1, 10, [(0, 2), (0, 8)], seed=3)
    for reduction, expected_ratio in (("mean", 8 / 2), ("sum", 1.0)):
        p = ref.clone().requires_grad_(True)  # policy == reference: margin 0
        dpo.dpo_loss(ref, p, mask, 0.1, reduction).backward()
        chosen, rejected = p.grad[0, 0].abs(), p.grad[1, 0].abs()
        torch.testing.assert_close(chosen / rejected, torch.tensor(expected_ratio), rtol=1e-5, atol=0)


def test_logits_to_log_probs_equals_upstream():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 13, generator=g) * 3
    labels = torch.randint(0, 13, (4, 9), generator=g)
    torch.testing.assert_close(dpo.logits_to_log_probs(logits, labels), upstream_logits_to_log_probs(logits, labels),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="labels"):
        dpo.logits_to_log_probs(logits, labels[:, :-1])


def test_pair_stats_agree_with_the_loss():
    ref, pol, mask = make_case(3, 12, CASES["unequal lengths"][2], seed=5)
    for reduction in dpo.REDUCTIONS:
        stats = dpo.dpo_pair_stats(ref, pol, mask, 0.3, reduction)
        torch.testing.assert_close(stats["loss"].mean(), dpo.dpo_loss(ref, pol, mask, 0.3, reduction), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(stats["margin"], stats["reward_chosen"] - stats["reward_rejected"], rtol=0, atol=0)
        torch.testing.assert_close(stats["reward_chosen"], 0.3 * (stats["policy_chosen"] - stats["ref_chosen"]),
                                   rtol=1e-6, atol=1e-7)
        assert torch.equal(stats["correct"], (stats["margin"] > 0).float())


@pytest.mark.parametrize("kwargs, match", [
    (dict(beta=0.0), "beta"), (dict(beta=-0.1), "beta"), (dict(beta=float("nan")), "beta"),
    (dict(beta=0.1, reduction="max"), "reduction"),
])
def test_bad_settings_raise(kwargs, match):
    ref, pol, mask = make_case(1, 4, [(0, 2), (0, 2)], seed=0)
    with pytest.raises(ValueError, match=match):
        dpo.dpo_loss(ref, pol, mask, **kwargs)


def test_odd_batch_raises():
    ref, pol, mask = make_case(1, 4, [(0, 2), (0, 2)], seed=0)
    with pytest.raises(ValueError, match="even"):
        dpo.dpo_loss(ref[:1], pol[:1], mask[:1], 0.1)


# ---------------------------------------------------------------------- the dataset
@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(make_corpus(300, seed=0), vocab_size=300)


@pytest.mark.parametrize("max_length", [256, 40, 24])
@pytest.mark.parametrize("drop", [False, True])
def test_dataset_item_equals_upstream(tok, max_length, drop):
    records = chat_data.preference_pairs(12, seed=1)
    ds = dpo.DPODataset(records, tok, max_length=max_length, empty_think_ratio=0.0 if drop else 1.0)
    for i, record in enumerate(records):
        ours, expected = ds[i], upstream_dpo_item(tok, record, max_length, drop=drop)
        assert set(ours) == set(expected)
        for key in expected:
            assert torch.equal(ours[key], expected[key]), (i, key)


def test_batch_is_the_items_cut_to_the_widest_row(tok):
    records = chat_data.preference_pairs(9, seed=2)
    ds = dpo.DPODataset(records, tok, max_length=128)
    idx = [4, 0, 7]
    batch = ds.batch(idx)
    width = batch["x_chosen"].shape[1]
    assert all(batch[k].shape == (3, width) for k in dpo.DPODataset.KEYS)
    for row, i in enumerate(idx):
        for key, value in ds[i].items():
            assert torch.equal(batch[key][row], value[:width])
            if not key.startswith("x_"):  # past the widest row: padding targets, never supervised
                assert not value[width:].any(), (i, key)
    x, y, mask = dpo.concat_pairs(batch)
    assert torch.equal(x[:3], batch["x_chosen"]) and torch.equal(x[3:], batch["x_rejected"])


def test_mask_covers_the_reply_its_end_marker_and_newline(tok):
    """The first supervised target is the reply's first token (predicted from the '\\n' after
    'assistant'), the last is the newline after <|im_end|>."""
    record = chat_data.preference_pairs(3, seed=0)[1]
    ds = dpo.DPODataset([record], tok, max_length=256, empty_think_ratio=0.0)
    _, eos = marker_ids(tok)
    for side in ("chosen", "rejected"):
        item = ds[0]
        y, mask = item[f"y_{side}"], item[f"mask_{side}"]
        reply = record[side][-1]["content"]
        assert y[mask.bool()].tolist() == tok.encode(reply).ids + eos
        first = int(mask.nonzero()[0])
        assert item[f"x_{side}"][first].item() == tok.encode("\n").ids[0]


def test_one_draw_per_pair_decides_the_thinking_block_for_both_sides(tok):
    records = chat_data.preference_pairs(200, seed=4)
    ds = dpo.DPODataset(records, tok, max_length=256)
    think = tok.encode("<think>").ids
    has = lambda ids: any(ids[j:j + len(think)] == think for j in range(len(ids)))
    kept = [has(c) for c, _, r, _ in ds.pairs]
    assert kept == [has(r) for c, _, r, _ in ds.pairs]
    assert 0.1 < sum(kept) / len(kept) < 0.3  # upstream keeps the empty block 20 % of the time


def test_dataset_rejects_bad_records(tok):
    with pytest.raises(ValueError, match="chosen"):
        dpo.DPODataset([{"conversations": []}], tok)
    with pytest.raises(ValueError, match="max_length"):
        dpo.DPODataset([], tok, max_length=1)


# ---------------------------------------------------------------------- the objective in the loop
def tiny_pair_batch(vocab, seed=0, pairs=2, seq=10, empty=False):
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for side in ("chosen", "rejected"):
        ids = torch.randint(3, vocab, (pairs, seq + 1), generator=g)
        mask = torch.zeros(pairs, seq, dtype=torch.long)
        if not empty:
            mask[:, 4:] = 1
        batch.update({f"x_{side}": ids[:, :-1], f"y_{side}": ids[:, 1:], f"mask_{side}": mask})
    return batch


class ListPairs:
    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def batch(self, indices):
        rows = [self.batches[int(i)] for i in indices]
        return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}


def test_objective_at_the_start_is_ln2_and_matches_upstream():
    policy = tiny_model(seed=1)
    objective = dpo.DPOObjective(dpo.freeze_reference(policy), beta=0.1)
    batch = tiny_pair_batch(61)
    metrics = objective(policy.train(), batch)
    torch.testing.assert_close(metrics["dpo_loss"], torch.tensor(math.log(2.0)), rtol=0, atol=1e-6)
    assert float(metrics["margin"]) == pytest.approx(0.0, abs=1e-6) and float(metrics["kl"]) == pytest.approx(0, abs=1e-6)
    x, y, mask = dpo.concat_pairs(batch)
    other = tiny_model(seed=2)
    ref = dpo.freeze_reference(other)
    metrics = dpo.DPOObjective(ref, beta=0.1)(policy, batch)
    expected = upstream_dpo_loss(upstream_logits_to_log_probs(other(x).logits, y),
                                 upstream_logits_to_log_probs(policy(x).logits, y), mask, 0.1)
    torch.testing.assert_close(metrics["dpo_loss"], expected.detach(), rtol=1e-5, atol=1e-6)
    assert metrics["loss"].requires_grad and int(metrics["tokens"]) == int(mask.sum())


def test_training_moves_the_policy_and_leaves_the_reference_untouched():
    from minimind_ref.train import RunData, TrainConfig

    policy = tiny_model(seed=3)
    ref = dpo.freeze_reference(policy)
    before = copy.deepcopy(ref.state_dict())
    data = RunData(None, ListPairs([tiny_pair_batch(61, seed=s, pairs=1) for s in range(8)]), None, [])
    cfg = TrainConfig(batch_size=4, max_steps=6, lr=1e-2, min_lr=1e-3, warmup_steps=0, eval_every=0, log_every=0,
                      eval_problems=0, progress=False, device="cpu")
    result = dpo.train_dpo(policy, None, cfg, beta=0.5, ref_model=ref, data=data, log=lambda s: None)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.grad is None for p in ref.parameters())
    for k, v in ref.state_dict().items():
        assert torch.equal(v, before[k]), f"the reference changed: {k}"
    assert any(not torch.equal(v, before[k]) for k, v in result.model.state_dict().items())
    h = result.history
    assert h["dpo_loss"][0] == pytest.approx(math.log(2), abs=1e-5) and h["dpo_loss"][-1] < math.log(2)
    assert h["reward_accuracy"][-1] > 0.5 and h["margin"][-1] > 0


def test_batch_without_supervised_tokens_is_harmless():
    from minimind_ref.train import make_optimizer, objective_step, TrainConfig

    policy = tiny_model(seed=4).train()
    objective = dpo.DPOObjective(dpo.freeze_reference(policy), beta=0.1)
    batch = tiny_pair_batch(61, empty=True)
    metrics = objective(policy, batch)
    assert int(metrics["tokens"]) == 0 and torch.isfinite(metrics["loss"])
    metrics["loss"].backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters()), "no token, no gradient"
    policy.zero_grad(set_to_none=True)
    before = copy.deepcopy(policy.state_dict())
    out = objective_step(policy, make_optimizer(policy, TrainConfig(lr=1e-2)), batch, objective)
    assert float(out["skipped"]) == 1.0
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())


def test_without_a_reference_the_loss_compares_the_policy_alone():
    policy = tiny_model(seed=5).train()
    batch = tiny_pair_batch(61, seed=3)
    x, y, mask = dpo.concat_pairs(batch)
    metrics = dpo.DPOObjective(None, beta=0.2)(policy, batch)
    lp = upstream_logits_to_log_probs(policy(x).logits, y)
    expected = upstream_dpo_loss(torch.zeros_like(lp), lp, mask, 0.2)
    torch.testing.assert_close(metrics["dpo_loss"], expected.detach(), rtol=1e-5, atol=1e-6)
    assert float(metrics["kl"]) == 0.0


def test_objective_validates_its_settings():
    with pytest.raises(ValueError, match="beta"):
        dpo.DPOObjective(None, beta=0)
    with pytest.raises(ValueError, match="reduction"):
        dpo.DPOObjective(None, reduction="avg")
    with pytest.raises(ValueError, match="keys"):
        dpo.concat_pairs({"x_chosen": torch.zeros(1, 2)})
    with pytest.raises(ValueError, match="ref_model"):
        dpo.train_dpo(tiny_model(), None, ref_model="none")


# ---------------------------------------------------------------------- the chapter's pair kinds
def test_dpo_preference_pairs_extend_preference_pairs():
    for split in ("train", "test"):
        records = chat_data.dpo_preference_pairs(40, seed=3, split=split)
        assert [r["kind"] for r in records] == [chat_data.DPO_PAIR_KINDS[i % 4] for i in range(40)]
        old = [r for r in records if r["kind"] != "sum_instead"]
        assert old == chat_data.preference_pairs(len(old), seed=3, split=split)
        assert records == chat_data.dpo_preference_pairs(40, seed=3, split=split)  # a pure function
    only_old = chat_data.dpo_preference_pairs(9, seed=0, kinds=chat_data.PAIR_KINDS)
    assert only_old == chat_data.preference_pairs(9, seed=0)


def test_sum_instead_pairs_keep_the_held_out_requests_apart():
    held_out = {r for r, _ in chat_data.cannot_do_requests("test")}
    for split in ("train", "test"):
        for record in chat_data.dpo_preference_pairs(60, seed=0, split=split, kinds=("sum_instead",)):
            request = record["chosen"][0]["content"]
            assert (request in held_out) == (split == "test")
            assert record["chosen"][-1]["content"] == chat_data.REFUSAL
            drill = record["rejected"][-1]["content"]
            a, b = int(drill[:2]), int(drill[3:5])
            assert drill == f"{a:02d}+{b:02d}={chat_data.format_answer(a, b)}"
            assert (a, b) in set(chat_data.sum_problems(split))
    with pytest.raises(ValueError, match="unknown pair kind"):
        chat_data.dpo_preference_pairs(3, kinds=("nope",))


def test_preference_report_with_cached_reference_log_probs():
    ref = tiny_model(seed=1)
    policy = copy.deepcopy(ref)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    dataset = ListPairs([tiny_pair_batch(61, seed=s) for s in range(3)])
    dataset.kinds = [None] * 6
    cached = dpo.pair_log_probs(ref, dataset)
    assert dpo.preference_report(policy, ref, dataset, ref_pair_log_probs=cached) == dpo.preference_report(policy, ref, dataset)
    with pytest.raises(ValueError, match="ref_pair_log_probs"):
        dpo.preference_report(policy, ref, dataset, ref_pair_log_probs=(cached[0][:1], cached[1][:1]))
