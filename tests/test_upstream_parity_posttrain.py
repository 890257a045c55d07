"""Parity of the post-training functions with upstream's current code (jingyaogong/minimind, d65ef2c).

``tests/data/upstream_posttrain_d65ef2c.pt`` was made by ``tools/upstream_fixtures_posttrain.py``
(see its docstring) from upstream's own files: ``dataset/lm_dataset.py`` (``SFTDataset`` with its
``pre_processing_chat`` / ``post_processing_chat`` and ``generate_labels``, tokenizing with
transformers 4.57.6's ``AutoTokenizer``), ``trainer/train_dpo.py`` (``logits_to_log_probs``,
``dpo_loss``; c090b69's mean-reduced ``dpo_loss`` for the variant), ``trainer/train_grpo.py`` (the
advantage, completion-mask, k3 and loss lines of ``grpo_train_epoch``) and ``model/model_lora.py``,
run with torch 2.13.0 on CPU in fp32. The fixture holds the inputs, upstream's outputs and, for
the losses, the gradients; for the SFT labels it also holds the two tokenizer folders it used
(minimind-3's format, and MiniMind2's, whose vocabulary merges a newline with the spaces after
it). Nothing of upstream's code is in the repository. The SFT labels of both pinned commits on
their real tokenizers: ``tests/test_upstream_parity_sft.py``.
"""

from pathlib import Path

import pytest
import torch

from minimind_ref import dpo, grpo, lora, pretrained, sft
import minimind_ref as mm

FIXTURE = torch.load(Path(__file__).parent / "data" / "upstream_posttrain_d65ef2c.pt", weights_only=True)
TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module", params=["minimind-3", "minimind2"])
def tokenizer_case(request, tmp_path_factory):
    fx = FIXTURE["sft"][request.param]
    folder = tmp_path_factory.mktemp(request.param)
    for name, text in fx["files"].items():
        (folder / name).write_text(text, encoding="utf-8")
    return request.param, pretrained.load_tokenizer_dir(folder), fx


def _tools(conversation):
    first = conversation[0]
    return first.get("tools") if first["role"] == "system" else None


# ---------------------------------------------------------------------- SFT
def test_marker_ids_accept_the_upstream_tokenizer(tokenizer_case):
    _, tok, fx = tokenizer_case
    assert sft.marker_ids(tok) == (fx["bos_id"], fx["eos_id"])


def test_rendering_equals_upstreams_processed_prompt(tokenizer_case):
    layout, _, fx = tokenizer_case
    for r in fx["records"]:
        conv = r["conversation"]
        assert sft.render_chat(conv, tools=_tools(conv), template=layout,
                               drop_empty_think=r["dropped_empty_think"]) == r["prompt"]


def test_upstream_rule_gives_upstreams_labels(tokenizer_case):
    _, tok, fx = tokenizer_case
    bos, eos = sft.marker_ids(tok)
    for r in fx["records"]:
        assert sft.generate_labels(r["input_ids"], bos, eos, r["max_length"], "d65ef2c") == r["labels"], r["prompt"]


def test_minimind3_labels_and_ids_equal_upstreams_with_the_course_rule_too():
    """With minimind-3's tokenizer no reply loses its header's newline: the course's rule and its
    piecewise encoding give exactly upstream's ids and labels."""
    fx = FIXTURE["sft"]["minimind-3"]
    folder = Path(__import__("tempfile").mkdtemp(prefix="minimind_m3_"))
    try:
        for name, text in fx["files"].items():
            (folder / name).write_text(text, encoding="utf-8")
        tok = pretrained.load_tokenizer_dir(folder)
    finally:
        __import__("shutil").rmtree(folder)
    bos, eos = sft.marker_ids(tok)
    merged = sft.merged_newline_ids(tok)
    for r in fx["records"]:
        conv = r["conversation"]
        ids = sft.encode_chat(tok, conv, tools=_tools(conv), drop_empty_think=r["dropped_empty_think"])
        assert ids[: r["max_length"]] == r["input_ids"][: r["n_real"]]
        assert sft.assistant_labels(r["input_ids"], bos, eos, r["max_length"], merged) == r["labels"]
        assert sft.assistant_labels(r["input_ids"], bos, eos, r["max_length"]) == r["labels"]


def test_minimind2_tokenizer_whitespace_replies_stay_supervised(tokenizer_case):
    """MiniMind2's vocabulary merges the header's newline with a reply's leading spaces: upstream's
    labels drop those replies; the course's keep them and equal upstream's everywhere else."""
    layout, tok, fx = tokenizer_case
    if layout != "minimind2":
        pytest.skip("the merge happens with MiniMind2's vocabulary")
    bos, eos = sft.marker_ids(tok)
    merged = sft.merged_newline_ids(tok)
    assert merged, "the MiniMind2-format vocabulary has a newline+spaces token"
    lost_upstream = lost_ours = 0
    for r in fx["records"]:
        ids, ml = r["input_ids"], r["max_length"]
        ours = sft.assistant_labels(ids, bos, eos, ml)
        assert ours == sft.assistant_labels(ids, bos, eos, ml, merged)
        for mine, theirs in zip(ours, r["labels"]):
            assert theirs == -100 or mine == theirs  # wherever upstream supervises, the same label
        replies = sum(m["role"] == "assistant" for m in r["conversation"])
        n_real = r["n_real"]
        if n_real == ml:  # cut by max_length: the count of complete replies means nothing here
            continue
        ends = lambda labels: sum(1 for j in range(n_real) if ids[j:j + len(eos)] == eos and labels[j] != -100)
        lost_upstream += ends(r["labels"]) < replies
        lost_ours += ends(ours) < replies
    assert lost_upstream >= 2 and lost_ours == 0, (lost_upstream, lost_ours)


def test_piecewise_encoding_never_merges_the_header_newline(tokenizer_case):
    layout, tok, fx = tokenizer_case
    bos, eos = sft.marker_ids(tok)
    for r in fx["records"]:
        conv = r["conversation"]
        ids = sft.encode_chat(tok, conv, tools=_tools(conv), template=layout, drop_empty_think=r["dropped_empty_think"])
        n_headers = sum(1 for j in range(len(ids)) if ids[j:j + len(bos)] == bos)
        assert n_headers == sum(m["role"] == "assistant" for m in conv)


# ---------------------------------------------------------------------- DPO
@pytest.mark.parametrize("k", range(len(FIXTURE["dpo"])))
def test_dpo_loss_sum_and_mean_equal_upstream_with_gradients(k):
    case = FIXTURE["dpo"][k]
    torch.testing.assert_close(dpo.logits_to_log_probs(case["ref_logits"], case["labels"]), case["ref_log_probs"], **TOL)
    for reduction, key in (("sum", "sum"), ("mean", "mean")):
        policy = case["logits"].clone().requires_grad_(True)
        ref_lp = dpo.logits_to_log_probs(case["ref_logits"], case["labels"])
        loss = dpo.dpo_loss(ref_lp, dpo.logits_to_log_probs(policy, case["labels"]), case["mask"], case["beta"],
                            reduction=reduction)
        loss.backward()
        torch.testing.assert_close(loss.detach(), case[f"loss_{key}"], **TOL)
        torch.testing.assert_close(policy.grad, case[f"grad_{key}"], **TOL)


def test_dpo_defaults_are_d65ef2cs():
    case = FIXTURE["dpo"][0]
    ref_lp = dpo.logits_to_log_probs(case["ref_logits"], case["labels"])
    pol_lp = dpo.logits_to_log_probs(case["logits"], case["labels"])
    assert case["beta"] == 0.15
    torch.testing.assert_close(dpo.dpo_loss(ref_lp, pol_lp, case["mask"]), case["loss_sum"], **TOL)


# ---------------------------------------------------------------------- GRPO
@pytest.mark.parametrize("k", range(len(FIXTURE["grpo"])))
def test_grpo_advantages_mask_and_k3_equal_upstream(k):
    case = FIXTURE["grpo"][k]
    torch.testing.assert_close(grpo.group_advantages(case["rewards"], case["num_generations"]), case["advantages"], **TOL)
    mask = grpo.completion_mask(case["completion_ids"], case["eos"], case["pad_mask"])
    assert torch.equal(mask, case["completion_mask"])
    torch.testing.assert_close(grpo.per_token_kl(case["per_token_logps"], case["ref_per_token_logps"]),
                               case["per_token_kl"], **TOL)


@pytest.mark.parametrize("loss_type", ["cispo", "grpo"])
@pytest.mark.parametrize("k", range(len(FIXTURE["grpo"])))
def test_grpo_and_cispo_losses_equal_upstream_with_gradients(k, loss_type):
    case = FIXTURE["grpo"][k]
    policy = case["per_token_logps"].clone().requires_grad_(True)
    loss = grpo.grpo_loss(policy, case["old_per_token_logps"], case["ref_per_token_logps"], case["advantages"],
                          case["completion_mask"], case["beta"], loss_type=loss_type, epsilon=case["epsilon"],
                          epsilon_high=case["epsilon_high"])
    loss.backward()
    torch.testing.assert_close(loss.detach(), case[f"loss_{loss_type}"], **TOL)
    torch.testing.assert_close(policy.grad, case[f"grad_{loss_type}"], **TOL)


def test_grpo_loss_defaults_are_d65ef2cs():
    case = FIXTURE["grpo"][0]
    assert (case["epsilon"], case["epsilon_high"]) == (0.2, 5.0)
    loss = grpo.grpo_loss(case["per_token_logps"], case["old_per_token_logps"], case["ref_per_token_logps"],
                          case["advantages"], case["completion_mask"], case["beta"])
    torch.testing.assert_close(loss, case["loss_cispo"], **TOL)


# ---------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("k", range(len(FIXTURE["lora"])))
def test_lora_reads_upstreams_file_and_writes_the_same(k, tmp_path):
    case = FIXTURE["lora"][k]
    model = mm.MiniMindForCausalLM(mm.MiniMindConfig(**case["config"])).eval()
    model.load_state_dict(case["base_state"])
    torch.save(case["lora_file"], tmp_path / "upstream_lora.pth")
    lora.apply_lora(model, rank=case["rank"])
    lora.load_lora(model, tmp_path / "upstream_lora.pth")  # upstream's file, read by ours
    with torch.no_grad():
        # the file is fp16, upstream's model held the fp32 values: logits agree to fp16 rounding
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], rtol=0, atol=2e-3)
    lora.save_lora(model, tmp_path / "ours.pth")  # ours, in upstream's format: same keys, fp16, same values
    ours = torch.load(tmp_path / "ours.pth", weights_only=True)
    # and our record of the base last (lora.BASE_KEY: no ".lora." in it, so upstream's load_lora and merge_lora skip it)
    assert list(ours) == list(case["lora_file"]) + [lora.BASE_KEY]
    for key, value in case["lora_file"].items():
        assert ours[key].dtype == value.dtype == torch.float16
        assert torch.equal(ours[key], value), key
    lora.merge_lora(model, tmp_path / "upstream_lora.pth", tmp_path / "merged.pth")  # upstream's file-to-file merge
    merged = torch.load(tmp_path / "merged.pth", weights_only=True)
    assert set(merged) == set(case["merged_file"])
    for key, value in case["merged_file"].items():
        assert merged[key].dtype == value.dtype and torch.equal(merged[key], value), key
    assert lora.lora_modules(model), "the file-to-file merge leaves the model's adapters in place"
    lora.merge_lora(model)  # in place, in fp32
    plain = mm.MiniMindForCausalLM(mm.MiniMindConfig(**case["config"])).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    for key, value in case["merged_file"].items():
        torch.testing.assert_close(plain.state_dict()[key].half(), value, rtol=0, atol=2e-3)
