"""GRPO (chapter 12) equals upstream's trainer/train_grpo.py (jingyaogong/minimind at d65ef2c; its
c090b69 form as the variant): advantages, completion mask, per-token log-probabilities and the
CISPO and PPO-clip losses, in value and gradient, on cases written here; the rewards follow
c090b69's format reward; the objective is safe inside minimind_ref.train's loop.

Upstream's computations are transcribed below (from the training loop's body, where they are
inline) as the reference the tests compare with (the parity fixture of
tests/test_upstream_parity_posttrain.py runs upstream's own lines)."""

import copy
import math

import pytest
import torch

from _helpers import tiny_model
from minimind_ref import chat_data, grpo
from minimind_ref.data import make_corpus
from minimind_ref.tokenizer import train_bpe_tokenizer


# ---------------------------------------------------------------------- upstream, transcribed
def upstream_advantages(rewards, num_generations):
    """d65ef2c: one normalisation, the population std."""
    grouped_rewards = rewards.view(-1, num_generations)
    mean_r = grouped_rewards.mean(dim=1).repeat_interleave(num_generations)
    std_r = grouped_rewards.std(dim=1, unbiased=False).repeat_interleave(num_generations)
    return (rewards - mean_r) / (std_r + 1e-4)


def c090b69_advantages(rewards, num_generations):
    grouped_rewards = rewards.view(-1, num_generations)
    mean_r = grouped_rewards.mean(dim=1).repeat_interleave(num_generations)
    std_r = grouped_rewards.std(dim=1).repeat_interleave(num_generations)
    advantages = torch.clamp((rewards - mean_r) / (std_r + 1e-4), -10, 10)
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def upstream_completion_mask(completion_ids, eos_token_id):
    is_eos = completion_ids == eos_token_id
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    return (torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx.unsqueeze(1)).int()


def upstream_get_per_token_logps(mdl, input_ids, n_keep):
    input_ids = input_ids.detach().clone() if input_ids.is_inference() else input_ids
    logits = mdl(input_ids, logits_to_keep=n_keep + 1).logits[:, :-1, :]
    per_token_logps = []
    for logits_row, ids_row in zip(logits, input_ids[:, -n_keep:]):
        ids_row = ids_row.detach().clone() if ids_row.is_inference() else ids_row
        per_token_logps.append(torch.gather(logits_row.log_softmax(dim=-1), 1, ids_row.unsqueeze(1)).squeeze(1))
    return torch.stack(per_token_logps)


def upstream_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask, beta,
                  loss_type="cispo", epsilon=0.2, epsilon_high=5.0):
    """d65ef2c's loss lines (train_grpo.py, grpo_train_epoch)."""
    kl_div = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(kl_div) - kl_div - 1
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    if loss_type == "cispo":
        clamped_ratio = torch.clamp(ratio, max=epsilon_high).detach()
        per_token_loss = -(clamped_ratio * advantages.unsqueeze(1) * per_token_logps - beta * per_token_kl)
    else:
        clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
        per_token_loss1 = ratio * advantages.unsqueeze(1)
        per_token_loss2 = clipped_ratio * advantages.unsqueeze(1)
        per_token_loss = -(torch.min(per_token_loss1, per_token_loss2) - beta * per_token_kl)
    return ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1).clamp(min=1)).mean()


def c090b69_loss(per_token_logps, ref_per_token_logps, advantages, completion_mask, beta):
    kl_div = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(kl_div) - kl_div - 1
    per_token_loss = -(torch.exp(per_token_logps - per_token_logps.detach()) * advantages.unsqueeze(1) - beta * per_token_kl)
    return ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()


def upstream_format_reward(response):
    import re

    pattern = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
    pattern2 = r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$"
    reward = 0.5 if (re.match(pattern, response, re.S) or re.match(pattern2, response, re.S)) else 0.0
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        if response.count(tag) == 1:
            reward += 0.25
    return reward


# ---------------------------------------------------------------------- advantages
@pytest.mark.parametrize("num_generations", [2, 4, 6, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_equal_upstream(num_generations, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (3 * num_generations,), generator=g).float() + torch.rand(3 * num_generations, generator=g)
    torch.testing.assert_close(grpo.group_advantages(rewards, num_generations), upstream_advantages(rewards, num_generations),
                               rtol=0, atol=1e-6)  # same operations in the same order
    torch.testing.assert_close(grpo.group_advantages(rewards, num_generations, **grpo.C090B69_ADVANTAGES),
                               c090b69_advantages(rewards, num_generations), rtol=0, atol=1e-6)


def test_a_group_with_equal_rewards_carries_no_signal():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = grpo.group_advantages(rewards, 4)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert adv[4] < 0 < adv[5]


def test_one_normalisation_with_the_population_std():
    # one right answer in a group of G: z = (1 - 1/G) / std; population std sqrt(G - 1) / G
    for group in (2, 6, 128):
        rewards = torch.zeros(group)
        rewards[0] = 1.0
        got = float(grpo.group_advantages(rewards, group)[0])
        assert got == pytest.approx((1 - 1 / group) / (math.sqrt(group - 1) / group + 1e-4), rel=1e-6)
    assert got > 10.0  # d65ef2c does not clamp; c090b69 did
    assert float(grpo.group_advantages(rewards, 128, **grpo.C090B69_ADVANTAGES)[0]) != got
    clamped = grpo.group_advantages(rewards, 128, unbiased=True, clamp=10.0)
    assert float(clamped[0]) == 10.0
    both = grpo.group_advantages(torch.tensor([0.0, 1.0, 0.0, 0.0, 3.0, 1.0]), 3, **grpo.C090B69_ADVANTAGES)
    assert float(both.mean()) == pytest.approx(0.0, abs=1e-6) and float(both.std()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("rewards, n, match", [(torch.zeros(2, 4), 4, "1-D"), (torch.zeros(6), 4, "groups"),
                                               (torch.zeros(4), 1, ">= 2")])
def test_group_advantages_reject_bad_input(rewards, n, match):
    with pytest.raises(ValueError, match=match):
        grpo.group_advantages(rewards, n)


# ---------------------------------------------------------------------- completion mask
def test_completion_mask_equals_upstream():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 20, (6, 9), generator=g)
    ids[0, 0] = 2          # ends at once: only the marker counts
    ids[1, 4] = 2
    ids[2, 3] = ids[2, 6] = 2  # the first marker ends it
    ids[3, 8] = 2          # marker at the last position
    # rows 4 and 5 have no marker: kept whole
    mask = grpo.completion_mask(ids, 2)
    torch.testing.assert_close(mask, upstream_completion_mask(ids, 2), rtol=0, atol=0)
    assert mask.sum(1).tolist() == [1, 5, 4, 9, 9, 9]


def test_completion_mask_with_an_engines_padding():
    ids = torch.tensor([[5, 6, 2, 7], [5, 6, 7, 2], [5, 2, 7, 7]])
    pad = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    # row 1: its marker lies under the padding, so it has none: kept up to the padding
    assert grpo.completion_mask(ids, 2, pad).tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    with pytest.raises(ValueError, match="pad_mask"):
        grpo.completion_mask(ids, 2, pad[:, :2])


def test_completion_mask_rejects_a_1d_input():
    with pytest.raises(ValueError, match="rows"):
        grpo.completion_mask(torch.tensor([1, 2, 3]), 2)


# ---------------------------------------------------------------------- per-token log-probabilities
@pytest.mark.parametrize("n_keep", [1, 5, 11])
def test_per_token_logps_equal_upstream_and_a_full_forward(n_keep):
    model = tiny_model(seed=1)
    ids = torch.randint(0, 61, (4, 12), generator=torch.Generator().manual_seed(1))
    got = grpo.per_token_logps(model, ids, n_keep)
    torch.testing.assert_close(got, upstream_get_per_token_logps(model, ids, n_keep), rtol=0, atol=1e-6)
    full = model(ids).logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)[:, -n_keep:]
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)  # logits_to_keep only saves work
    with torch.inference_mode():
        frozen = ids.clone()
    torch.testing.assert_close(grpo.per_token_logps(model, frozen, n_keep), got)


@pytest.mark.parametrize("n_keep", [0, 12])
def test_per_token_logps_reject_bad_n_keep(n_keep):
    with pytest.raises(ValueError, match="n_keep"):
        grpo.per_token_logps(tiny_model(), torch.zeros(2, 12, dtype=torch.long), n_keep)


# ---------------------------------------------------------------------- the loss
def loss_case(seed, rows=6, length=7, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    lp = (-3 * torch.rand(rows, length, generator=g)).requires_grad_(True)
    old = lp.detach() + spread * torch.randn(rows, length, generator=g)  # ratios far from 1
    ref = -3 * torch.rand(rows, length, generator=g)
    adv = torch.randn(rows, generator=g)
    ids = torch.randint(3, 9, (rows, length), generator=g)
    ids[torch.arange(rows), torch.randint(0, length, (rows,), generator=g)] = 2
    return lp, old, ref, adv, upstream_completion_mask(ids, 2)


@pytest.mark.parametrize("loss_type", ["cispo", "grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.02, 0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_loss_and_gradient_equal_upstream(beta, seed, loss_type):
    lp, old, ref, adv, mask = loss_case(seed)
    for eps, eps_high in ((0.2, 5.0), (0.1, 1.5)):
        a = lp.detach().clone().requires_grad_(True)
        b = lp.detach().clone().requires_grad_(True)
        ours = grpo.grpo_loss(a, old, ref, adv, mask, beta, loss_type=loss_type, epsilon=eps, epsilon_high=eps_high)
        theirs = upstream_loss(b, old, ref, adv, mask, beta, loss_type, eps, eps_high)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        ours.backward()
        theirs.backward()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_c090b69s_loss_is_ppo_clip_with_the_current_policy_as_the_old_one(seed):
    lp, _, ref, adv, mask = loss_case(seed)
    a = lp.detach().clone().requires_grad_(True)
    b = lp.detach().clone().requires_grad_(True)
    ours = grpo.grpo_loss(a, a.detach(), ref, adv, mask, 0.1, loss_type="grpo")
    theirs = c090b69_loss(b, ref, adv, mask, 0.1)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


def test_with_ratio_one_cispo_and_ppo_clip_are_the_policy_gradient():
    lp, _, ref, adv, mask = loss_case(3)
    counts = mask.sum(1, keepdim=True).float()
    expected = -(adv[:, None] * mask / counts) / mask.size(0)  # gradient of -mean_rows(mean_tokens(A * lp))
    for loss_type in grpo.LOSS_TYPES:
        p = lp.detach().clone().requires_grad_(True)
        loss = grpo.grpo_loss(p, p.detach(), p.detach(), adv, mask, beta=0.0, loss_type=loss_type)
        loss.backward()
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=1e-7)


def test_ppo_clip_stops_the_gradient_where_the_ratio_left_the_range_and_cispo_does_not():
    lp = torch.zeros(2, 3, requires_grad=True)
    old = torch.log(torch.tensor([[1 / 1.5, 1.0, 1 / 0.5], [1 / 1.5, 1.0, 1 / 0.5]]))  # ratios 1.5, 1, 0.5
    adv, mask, ref = torch.tensor([1.0, -1.0]), torch.ones(2, 3), torch.zeros(2, 3)
    grpo.grpo_loss(lp, old, ref, adv, mask, 0.0, loss_type="grpo").backward()
    # row 0 (A > 0): the ratio 1.5 above 1 + eps is clipped; row 1 (A < 0): the ratio 0.5 below 1 - eps is clipped
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] != 0 and lp.grad[0, 2] != 0
    assert lp.grad[1, 2] == 0 and lp.grad[1, 0] != 0 and lp.grad[1, 1] != 0
    frac = grpo.clip_fraction(lp, old, adv, mask, "grpo")
    assert float(frac) == pytest.approx(2 / 6)
    lp2 = torch.zeros(2, 3, requires_grad=True)
    grpo.grpo_loss(lp2, old, ref, adv, mask, 0.0, loss_type="cispo", epsilon_high=1.2).backward()
    assert bool((lp2.grad != 0).all())  # every token keeps a gradient ...
    torch.testing.assert_close(lp2.grad[0] * 6, -torch.tensor([1.2, 1.0, 0.5]))  # ... weighed by min(ratio, 1.2)
    assert float(grpo.clip_fraction(lp2, old, adv, mask, "cispo", epsilon_high=1.2)) == pytest.approx(2 / 6)


def test_k3_is_nonnegative_and_estimates_the_kl():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=g), -1)
    q = torch.softmax(torch.randn(50, generator=g), -1)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=g)
    k3 = grpo.per_token_kl(p.log()[samples], q.log()[samples])
    exact = float((p * (p.log() - q.log())).sum())
    assert float(k3.min()) >= 0
    assert float(k3.mean()) == pytest.approx(exact, rel=0.02)  # 200,000 samples: the error is well under 2%


def test_token_reduction_weighs_long_completions_more():
    lp, _, ref, adv, mask = loss_case(4)
    per_token = -(adv[:, None] * lp.detach() - 0.1 * grpo.per_token_kl(lp.detach(), ref)) * mask
    token = grpo.grpo_loss(lp, lp.detach(), ref, adv, mask, 0.1, reduction="token")
    torch.testing.assert_close(token, per_token.sum() / mask.sum(), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(token, grpo.grpo_loss(lp, lp.detach(), ref, adv, mask, 0.1))


@pytest.mark.parametrize("kwargs, match", [({"beta": -1}, "beta"), ({"reduction": "mean"}, "reduction"),
                                           ({"loss_type": "ppo"}, "loss_type"), ({"epsilon": -0.1}, "epsilon"),
                                           ({"epsilon_high": float("nan")}, "epsilon_high")])
def test_grpo_loss_rejects_bad_settings(kwargs, match):
    lp, old, ref, adv, mask = loss_case(0)
    settings = {"beta": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        grpo.grpo_loss(lp, old, ref, adv, mask, **settings)


def test_grpo_loss_rejects_mismatched_shapes():
    lp, old, ref, adv, mask = loss_case(0)
    with pytest.raises(ValueError, match="same shape"):
        grpo.grpo_loss(lp, old, ref[:, :-1], adv, mask, 0.1)
    with pytest.raises(ValueError, match="same shape"):
        grpo.grpo_loss(lp, old[:, :-1], ref, adv, mask, 0.1)
    with pytest.raises(ValueError, match="advantages"):
        grpo.grpo_loss(lp, old, ref, adv[:-1], mask, 0.1)


# ---------------------------------------------------------------------- rewards
@pytest.mark.parametrize("reply", [
    "<think>\nadd the tens\n</think>\n<answer>\n082\n</answer>",
    "<think>\nadd the tens\n</think>\n\n<answer>\n082\n</answer>",
    "<think>\nx\n</think>\n\n\n<answer>\n082\n</answer>",
    "<think>add</think><answer>082</answer>",
    "<answer>\n082\n</answer>",
    "<think>\n<think>\n</think>\n<answer>\n1\n</answer>",
    "37+45=082",
    "",
])
def test_format_reward_equals_upstream(reply):
    assert grpo.format_reward(reply) == upstream_format_reward(reply)


def test_format_reward_values():
    assert grpo.format_reward("<think>\na\n</think>\n<answer>\nb\n</answer>") == 1.5
    assert grpo.format_reward("<think>a</think><answer>b</answer>") == 1.0
    assert grpo.format_reward("no tags") == 0.0


def test_sum_reward_needs_the_whole_answer():
    assert grpo.sum_reward(" 37+45=082\n", "37+45=082") == 1.0
    assert grpo.sum_reward("37+45=083", "37+45=082") == 0.0
    assert grpo.sum_reward("37+45=082 and more", "37+45=082") == 0.0


# ---------------------------------------------------------------------- the objective in the loop
@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(make_corpus(300, seed=0), vocab_size=300)


def test_rl_dataset_checks_its_records():
    records = chat_data.rl_prompts(5, split="test")
    data = grpo.RLPromptDataset(records)
    assert len(data) == 5 and data.batch(torch.tensor([1, 3])) == [records[1], records[3]]
    with pytest.raises(ValueError, match="reference answer"):
        grpo.RLPromptDataset([{"conversations": [{"role": "user", "content": "hi"}]}])


def test_sampling_gives_groups_that_end_with_the_marker(tok):
    model = tiny_model(seed=2, vocab_size=tok.get_vocab_size(), max_position_embeddings=256)
    prompt = chat_data.rl_prompts(1, split="test")[0]["conversations"][:-1]
    g = torch.Generator().manual_seed(0)
    out = grpo.sample_completions(model, tok, prompt, 4, 6, generator=g)
    assert out["input_ids"].shape[0] == 4 and out["completion_ids"].shape[1] <= 6
    assert torch.equal(out["input_ids"][:, out["prompt_length"]:], out["completion_ids"])
    again = grpo.sample_completions(model, tok, prompt, 4, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out["input_ids"], again["input_ids"])  # seeded: reproducible


def test_objective_matches_upstream_on_its_own_samples(tok):
    torch.manual_seed(0)
    policy = tiny_model(seed=3, vocab_size=tok.get_vocab_size(), max_position_embeddings=256).train()
    ref = copy.deepcopy(policy)
    records = chat_data.rl_prompts(2, split="train")
    answers = {r["conversations"][-1]["content"] for r in records}
    # a reward that tells the samples apart, so the advantages are not all zero
    objective = grpo.GRPOObjective(ref, tok, num_generations=4, max_new_tokens=6, beta=0.1,
                                   reward_fn=lambda reply, answer: float(len(reply) % 3), seed=1)
    metrics = objective(policy, records)
    assert {s["text"] for s in objective.last_samples}.isdisjoint(answers)  # an untrained model never answers
    # recompute with upstream's code from the same samples
    objective2 = grpo.GRPOObjective(copy.deepcopy(ref), tok, num_generations=4, max_new_tokens=6, beta=0.1,
                                    reward_fn=lambda reply, answer: float(len(reply) % 3), seed=1)
    lps, refs, masks, rewards = [], [], [], []
    samples = [grpo.sample_completions(policy, tok, r["conversations"][:-1], 4, 6, generator=objective2.generator)
               for r in records]
    width = max(s["completion_ids"].size(1) for s in samples)
    end = objective.end
    for s in samples:
        x = torch.nn.functional.pad(s["input_ids"], (0, width - s["completion_ids"].size(1)), value=end)
        lps.append(upstream_get_per_token_logps(policy, x, width))
        with torch.no_grad():
            refs.append(upstream_get_per_token_logps(ref, x, width))
        masks.append(upstream_completion_mask(x[:, -width:], end))
        rewards += [float(len(t) % 3) for t in s["texts"]]
    adv = upstream_advantages(torch.tensor(rewards), 4)
    lp = torch.cat(lps)
    expected = upstream_loss(lp, lp.detach(), torch.cat(refs), adv, torch.cat(masks), 0.1)  # sampled by the policy
    torch.testing.assert_close(metrics["grpo_loss"], expected.detach(), rtol=1e-5, atol=1e-6)
    assert metrics["loss"].requires_grad and int(metrics["tokens"]) == int(torch.cat(masks).sum())
    assert float(metrics["kl"]) == pytest.approx(0.0, abs=1e-6)  # policy == reference before any step


def test_training_moves_the_policy_and_leaves_the_reference_untouched(tok):
    from minimind_ref.train import RunData, TrainConfig, train

    policy = tiny_model(seed=4, vocab_size=tok.get_vocab_size(), max_position_embeddings=256)
    ref = copy.deepcopy(policy)
    before = copy.deepcopy(ref.state_dict())
    data = RunData(tok, grpo.RLPromptDataset(chat_data.rl_prompts(8, split="train")), None, [])
    objective = grpo.GRPOObjective(ref, tok, num_generations=4, max_new_tokens=5, beta=0.1,
                                   reward_fn=lambda reply, answer: float(len(reply) > 8), seed=0)
    cfg = TrainConfig(batch_size=2, max_steps=3, lr=1e-2, min_lr=1e-3, warmup_steps=0, eval_every=0, log_every=0,
                      eval_problems=0, progress=False, device="cpu")
    result = train(cfg, model=policy, data=data, objective=objective, log=lambda s: None)
    assert not ref.training and all(p.grad is None for p in ref.parameters())
    assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items()), "the reference changed"
    h = result.history
    assert len(h["reward"]) == 3 and all(0 <= r <= 1 for r in h["reward"])
    assert any(not torch.equal(v, before[k]) for k, v in result.model.state_dict().items()) or \
        all(z == 1.0 for z in h["zero_std_groups"])  # a batch of all-equal rewards gives no gradient
    assert all(math.isfinite(v) for v in h["grpo_loss"])


def test_a_lagging_sampler_makes_the_ratio_act(tok):
    from minimind_ref.train import RunData, TrainConfig, train

    policy = tiny_model(seed=6, vocab_size=tok.get_vocab_size(), max_position_embeddings=256)
    data = RunData(tok, grpo.RLPromptDataset(chat_data.rl_prompts(8, split="train")), None, [])
    cfg = TrainConfig(batch_size=2, max_steps=4, lr=3e-2, min_lr=3e-2, warmup_steps=0, eval_every=0, log_every=0,
                      eval_problems=0, progress=False, device="cpu")
    ratios = {}
    for sync_every in (1, 4):
        objective = grpo.GRPOObjective(copy.deepcopy(policy), tok, num_generations=4, max_new_tokens=5, beta=0.0,
                                       reward_fn=lambda reply, answer: float(len(reply) % 2), sync_every=sync_every,
                                       seed=0)
        result = train(cfg, model=copy.deepcopy(policy), data=data, objective=objective, log=lambda s: None)
        ratios[sync_every] = result.history["ratio_mean"]
    assert all(r == 1.0 for r in ratios[1])  # the policy samples: old log-probabilities are its own
    assert ratios[4][0] == 1.0 and any(abs(r - 1.0) > 1e-4 for r in ratios[4][1:])  # the copy lags after step 1


def test_objective_validates_its_settings(tok):
    with pytest.raises(ValueError, match="reference model"):
        grpo.GRPOObjective(None, tok, beta=0.1)
    with pytest.raises(ValueError, match="num_generations"):
        grpo.GRPOObjective(None, tok, num_generations=1, beta=0.0)
    with pytest.raises(ValueError, match="reduction"):
        grpo.GRPOObjective(None, tok, beta=0.0, reduction="mean")
    with pytest.raises(ValueError, match="loss_type"):
        grpo.GRPOObjective(None, tok, beta=0.0, loss_type="ppo")
    with pytest.raises(ValueError, match="sync_every"):
        grpo.GRPOObjective(None, tok, beta=0.0, sync_every=0)
    with pytest.raises(ValueError, match="advantages"):
        grpo.GRPOObjective(None, tok, beta=0.0, advantages={"clip": 3})
