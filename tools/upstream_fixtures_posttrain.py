"""Make the post-training parity fixture from upstream's own code (run by hand, never by the tests).

    python tools/upstream_fixtures_posttrain.py --from-git /path/to/minimind --upstream /tmp/upstream_posttrain
    # writes the folder --upstream from the clone's git history (d65ef2c, and c090b69 for the variant)
    python tools/upstream_fixtures_posttrain.py --upstream /tmp/upstream_posttrain
    # writes tests/data/upstream_posttrain_d65ef2c.pt

The folder given as ``--upstream`` (outside the repository) holds upstream's code, which
``--from-git`` takes from a clone of jingyaogong/minimind with its history (``git show COMMIT:PATH``,
nothing from a working tree), line ranges checked by their first line:

* ``dataset/lm_dataset.py`` and ``model/model_lora.py``: the files at d65ef2c, whole
  (``SFTDataset``, ``pre_processing_chat``, ``post_processing_chat``; ``apply_lora``, ``save_lora``,
  ``load_lora``, ``merge_lora``);
* ``trainer/train_dpo_functions.py``: ``logits_to_log_probs`` and ``dpo_loss``,
  `d65ef2c:trainer/train_dpo.py:25-50`;
* ``trainer/train_dpo_mean_c090b69.py``: c090b69's mean-reduced ``dpo_loss`` for the variant,
  `c090b69:trainer/train_dpo.py:24-51`;
* ``trainer/train_grpo_loss.py``: the advantage, completion-mask, k3 and loss lines of
  ``grpo_train_epoch``, which are not a function upstream: they are run as the body of a function,
  ``grpo_step_loss``, holding exactly `d65ef2c:trainer/train_grpo.py:121-144`.

(The stored fixture was first made from hand transcriptions of other stored versions: 101d7df's
``lm_dataset.py`` and ``model_lora.py``, and two commits outside upstream's history for the GRPO
and DPO lines. ``model_lora.py`` differs between 101d7df and d65ef2c: ``apply_lora`` tests
``module.in_features == module.out_features`` at d65ef2c instead of comparing the weight's two
dimensions, the same layers for a ``nn.Linear``. Re-made with ``--from-git`` at d65ef2c, every
tensor and label of the fixture came out equal to the stored one, so the file was kept.) It needs
``transformers`` (the project's ``.venv`` has 4.57.6): upstream's ``SFTDataset`` tokenizes with
``AutoTokenizer``.

What it stores (weights, inputs and upstream's outputs; upstream's code is not part of this repository):

* ``sft``: two tokenizer folders as files (``tokenizer.json`` + ``tokenizer_config.json``):
  minimind-3's format (``tests/_upstream_files.write_tokenizer_minimind3``) and MiniMind2's
  (``write_tokenizer``, whose vocabulary merges a newline with the spaces after it); for each, a
  list of conversations run through upstream's ``SFTDataset.__getitem__`` steps with
  ``random.seed(k)`` (``pre_processing_chat``, ``create_chat_prompt``, ``post_processing_chat``,
  ``tokenizer(prompt).input_ids`` cut and padded to ``max_length``, ``generate_labels``): the
  processed conversation, whether the empty thinking block was dropped, the prompt string, the
  ids and upstream's labels. (The labels of both pinned commits' own ``generate_labels`` on ids of
  their real tokenizers: ``tools/upstream_sft_tokens.py``.)
* ``dpo``: random logits, labels and masks; upstream's ``logits_to_log_probs`` and ``dpo_loss``
  (the sum, beta 0.15 and others) and c090b69's mean, with the gradients with respect to the policy logits.
* ``grpo``: random rewards, completions (with end markers, padding and rows without a marker) and
  per-token log-probabilities; upstream's advantages, completion mask, k3, and the policy loss for
  ``--loss_type cispo`` and ``grpo`` (several betas, epsilons, ratios far from 1), with the
  gradients with respect to ``per_token_logps``.
* ``lora``: a small ``minimind_ref`` model (MiniMind2 and minimind-3 layouts) given upstream's
  ``apply_lora`` (rank 16 and 4), random adapters; the state dict upstream's ``save_lora`` writes,
  the one its ``merge_lora`` writes, and the logits of the adapted model.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import random
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "upstream_posttrain_d65ef2c.pt"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def load_lm_dataset(checkout: Path) -> types.ModuleType:
    """Upstream's ``dataset/lm_dataset.py``. It imports Hugging Face ``datasets`` to read a jsonl
    file; this tool hands ``SFTDataset`` its records as a list instead, so while the file is imported
    a stand-in whose ``load_dataset`` returns ``data_files`` as it is takes the place of ``datasets``."""
    import transformers  # noqa: F401  (imported first: it probes for the real datasets)

    stand_in = types.ModuleType("datasets")
    stand_in.load_dataset = lambda kind, data_files=None, split=None, **kwargs: data_files
    stand_in.Features = stand_in.Sequence = stand_in.Value = lambda *args, **kwargs: None
    real = sys.modules.get("datasets")
    sys.modules["datasets"] = stand_in
    try:
        return load(checkout, "dataset/lm_dataset.py", "upstream_lm_dataset")
    finally:
        if real is None:
            del sys.modules["datasets"]
        else:
            sys.modules["datasets"] = real


def load(checkout: Path, relative: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, checkout / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------- SFT labels
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def conversations() -> List[Dict[str, Any]]:
    """Conversations of every shape upstream's SFT data has, and replies that begin with whitespace."""
    from minimind_ref import chat_data

    out: List[Dict[str, Any]] = [r for r in chat_data.sft_conversations(12, seed=5)]
    user = {"role": "user", "content": "Show me the code."}
    out += [
        {"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "hello"}]},
        {"conversations": [{"role": "user", "content": "What is 2 plus 3?"},
                           {"role": "assistant", "content": "02+03=005", "reasoning_content": "Add the ones."}]},
        {"conversations": [{"role": "user", "content": "Think first."},
                           {"role": "assistant", "content": "<think>\nstep one\n</think>\n\nThe answer."}]},
        {"conversations": [{"role": "system", "content": "You can call tools.", "tools": TOOLS},
                           {"role": "user", "content": "Add 2 and 3."},
                           {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2}}]},
                           {"role": "tool", "content": "5"}, {"role": "assistant", "content": "It is 5."}]},
        # replies that begin with whitespace: four spaces of indentation, two newlines, one space
        {"conversations": [user, {"role": "assistant", "content": "    return a + b"}]},
        {"conversations": [user, {"role": "assistant", "content": "\n\ndef add(a, b):\n    return a + b"}]},
        {"conversations": [user, {"role": "assistant", "content": " def add(a, b): pass"},
                           {"role": "user", "content": "And indented?"},
                           {"role": "assistant", "content": "     return a + b"}]},
    ]
    return out


def sft_fixture(upstream_ds: types.ModuleType, folder: Path, max_lengths=(512, 48)) -> Dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    records = []
    for k, record in enumerate(conversations()):
        for max_length in max_lengths:
            ds = upstream_ds.SFTDataset([record], tokenizer, max_length=max_length)
            random.seed(1000 * k + max_length)
            conv = upstream_ds.pre_processing_chat(record["conversations"])
            prompt = ds.create_chat_prompt(conv)
            processed = upstream_ds.post_processing_chat(prompt)
            ids = tokenizer(processed).input_ids[:max_length]
            n_real = len(ids)
            ids += [tokenizer.pad_token_id] * (max_length - len(ids))
            labels = ds.generate_labels(ids)
            records.append({"conversation": conv, "dropped_empty_think": processed != prompt, "prompt": processed,
                            "max_length": max_length, "n_real": n_real, "input_ids": ids, "labels": labels})
    return {"files": {name: (folder / name).read_text(encoding="utf-8")
                      for name in ("tokenizer.json", "tokenizer_config.json")},
            "bos_id": list(ds.bos_id), "eos_id": list(ds.eos_id), "records": records}


# ---------------------------------------------------------------------- DPO
def dpo_fixture(train_dpo: types.ModuleType, dpo_mean: types.ModuleType) -> List[Dict[str, Any]]:
    cases = []
    g = torch.Generator().manual_seed(11)
    for rows, length, vocab, beta in [(4, 9, 13, 0.15), (6, 12, 7, 0.1), (2, 5, 11, 1.0), (8, 16, 17, 0.5)]:
        logits = torch.randn(rows, length, vocab, generator=g) * 2
        ref_logits = logits + 0.5 * torch.randn(rows, length, vocab, generator=g)
        labels = torch.randint(0, vocab, (rows, length), generator=g)
        mask = torch.zeros(rows, length)
        for r in range(rows):  # replies of different lengths; one row of the last case has no supervised token
            start = int(torch.randint(1, length // 2, (1,), generator=g))
            stop = int(torch.randint(start + 1, length + 1, (1,), generator=g))
            mask[r, start:stop] = 1
        if rows == 8:
            mask[3] = 0
        case = {"logits": logits, "ref_logits": ref_logits, "labels": labels, "mask": mask, "beta": beta}
        for name, fn in (("sum", train_dpo.dpo_loss), ("mean", dpo_mean.dpo_loss)):
            policy = logits.clone().requires_grad_(True)
            ref_lp = train_dpo.logits_to_log_probs(ref_logits, labels)
            policy_lp = train_dpo.logits_to_log_probs(policy, labels)
            loss = fn(ref_lp, policy_lp, mask, beta)
            loss.backward()
            case[f"loss_{name}"] = loss.detach()
            case[f"grad_{name}"] = policy.grad.detach()
        case["ref_log_probs"] = train_dpo.logits_to_log_probs(ref_logits, labels)
        cases.append(case)
    return cases


# ---------------------------------------------------------------------- GRPO
def grpo_fixture(train_grpo: types.ModuleType) -> List[Dict[str, Any]]:
    eos = 2
    tokenizer = types.SimpleNamespace(eos_token_id=eos)
    cases = []
    g = torch.Generator().manual_seed(12)
    settings = [(2, 6, 7, 0.1, 0.2, 5.0), (3, 4, 9, 0.0, 0.2, 5.0), (1, 8, 5, 0.04, 0.1, 2.0), (4, 6, 11, 1.0, 0.3, 1.5)]
    for b, gsize, length, beta, eps, eps_high in settings:
        n = b * gsize
        rewards = torch.randint(0, 3, (n,), generator=g).float() / 2
        rewards[:gsize] = 1.0  # a group with no spread
        completion_ids = torch.randint(3, 20, (n, length), generator=g)
        for r in range(n - 1):  # the last row has no end marker
            completion_ids[r, int(torch.randint(0, length, (1,), generator=g))] = eos
        completion_ids[0, -1] = eos  # a second marker after the first
        pad = torch.ones(n, length, dtype=torch.long)
        pad[1, length // 2:] = 0  # an engine's padding: an end marker under it does not count
        completion_ids[1, -1] = eos
        lp = -torch.rand(n, length, generator=g) * 3
        old = lp + 0.6 * torch.randn(n, length, generator=g)  # ratios from about 0.2 to 5 and beyond
        ref = lp + 0.4 * torch.randn(n, length, generator=g)
        case = {"rewards": rewards, "num_generations": gsize, "completion_ids": completion_ids, "pad_mask": pad,
                "per_token_logps": lp, "old_per_token_logps": old, "ref_per_token_logps": ref, "beta": beta,
                "epsilon": eps, "epsilon_high": eps_high, "eos": eos}
        for loss_type in ("cispo", "grpo"):
            args = types.SimpleNamespace(num_generations=gsize, beta=beta, loss_type=loss_type, epsilon=eps,
                                         epsilon_high=eps_high, device="cpu", accumulation_steps=1)
            policy = lp.clone().requires_grad_(True)
            adv, cmask, kl, policy_loss, loss = train_grpo.grpo_step_loss(
                args, tokenizer, rewards, completion_ids, pad, policy, old, ref, torch.tensor(0.0))
            loss.backward()
            case.update({"advantages": adv.detach(), "completion_mask": cmask, "per_token_kl": kl.detach(),
                         f"loss_{loss_type}": policy_loss.detach(), f"grad_{loss_type}": policy.grad.detach()})
        cases.append(case)
    return cases


# ---------------------------------------------------------------------- LoRA
def lora_fixture(model_lora: types.ModuleType) -> List[Dict[str, Any]]:
    import minimind_ref as mm

    cases = []
    layouts = {
        "minimind2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                          vocab_size=61, max_position_embeddings=64),
        "minimind-3": dict(generation="minimind-3", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                           num_key_value_heads=4, vocab_size=61, max_position_embeddings=64),
    }
    for (layout, kwargs), rank in zip(layouts.items(), (16, 4)):
        torch.manual_seed(21)
        model = mm.MiniMindForCausalLM(mm.MiniMindConfig(**kwargs)).eval()
        base_state = {k: v.clone() for k, v in model.state_dict().items()}
        type(model).device = property(lambda self: next(self.parameters()).device)  # what transformers provides
        try:
            model_lora.apply_lora(model, rank=rank)
            g = torch.Generator().manual_seed(22)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if ".lora." in name:
                        p.copy_(0.05 * torch.randn(p.shape, generator=g))
            with tempfile.TemporaryDirectory(prefix="minimind_fixture_") as tmp:
                model_lora.save_lora(model, f"{tmp}/lora.pth")
                saved = torch.load(f"{tmp}/lora.pth", weights_only=True)
                fresh = copy.deepcopy(model)
                model_lora.merge_lora(fresh, f"{tmp}/lora.pth", f"{tmp}/merged.pth")
                merged = torch.load(f"{tmp}/merged.pth", weights_only=True)
            ids = torch.randint(0, 61, (2, 9), generator=g)
            with torch.no_grad():
                logits = model(ids).logits
        finally:
            del type(model).device
        cases.append({"layout": layout, "config": kwargs, "rank": rank, "base_state": base_state, "lora_file": saved,
                      "merged_file": merged, "input_ids": ids, "logits": logits})
    return cases


# ---------------------------------------------------------------------- upstream's code, from git
#: (file written, commit, upstream path, first line, last line or None for the whole file, the first
#: line's start, code put before it).
FROM_GIT = [
    ("dataset/lm_dataset.py", "d65ef2c", "dataset/lm_dataset.py", 1, None, "from torch.utils.data import Dataset", ""),
    ("model/model_lora.py", "d65ef2c", "model/model_lora.py", 1, None, "import torch", ""),
    ("trainer/train_dpo_functions.py", "d65ef2c", "trainer/train_dpo.py", 25, 50, "def logits_to_log_probs",
     "import torch\nimport torch.nn.functional as F\n\n\n"),
    ("trainer/train_dpo_mean_c090b69.py", "c090b69", "trainer/train_dpo.py", 24, 51, "def logits_to_log_probs",
     "import torch\nimport torch.nn.functional as F\n\n\n"),
    ("trainer/train_grpo_loss.py", "d65ef2c", "trainer/train_grpo.py", 121, 144, "grouped_rewards = rewards.view",
     "import types\n\nimport torch\n\n\n"
     "def grpo_step_loss(args, tokenizer, rewards, completion_ids, completion_pad_mask, per_token_logps,\n"
     "                   old_per_token_logps, ref_per_token_logps, aux_loss):\n"
     "    rollout_result = types.SimpleNamespace(completion_mask=completion_pad_mask)\n"),
]
GRPO_RETURN = "        return advantages, completion_mask, per_token_kl, policy_loss, loss\n"


def from_git(clone: Path, folder: Path) -> None:
    """Write the ``--upstream`` folder from the clone's history (``FROM_GIT``)."""
    import subprocess

    for name, commit, path, first, last, starts, head in FROM_GIT:
        text = subprocess.run(["git", "-C", str(clone), "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        lines = text.splitlines(keepends=True)
        body = lines[first - 1:last] if last else lines
        if not body[0].strip().startswith(starts):
            raise SystemExit(f"{commit}:{path}:{first} should start with {starts!r}, found {body[0].strip()[:60]!r}")
        if name.endswith("grpo_loss.py"):  # the loop body's lines, one level less indented, as a function body
            body = [line[4:] if line.startswith("        ") else line for line in body] + [GRPO_RETURN[4:]]
        out = folder / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(head + "".join(body), encoding="utf-8")
        print(f"{out}: {commit}:{path}" + (f":{first}-{last}" if last else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, type=Path, help="a folder with upstream's files (see the docstring)")
    p.add_argument("--from-git", type=Path, default=None,
                   help="a clone of jingyaogong/minimind with its history: write the --upstream folder from it and stop")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.from_git is not None:
        from_git(args.from_git, args.upstream)
        return 0
    import _upstream_files as uf

    up_ds = load_lm_dataset(args.upstream)
    up_dpo = load(args.upstream, "trainer/train_dpo_functions.py", "upstream_train_dpo")
    up_dpo_mean = load(args.upstream, "trainer/train_dpo_mean_c090b69.py", "upstream_train_dpo_c090b69")
    up_grpo = load(args.upstream, "trainer/train_grpo_loss.py", "upstream_train_grpo")
    up_lora = load(args.upstream, "model/model_lora.py", "upstream_model_lora")
    with tempfile.TemporaryDirectory(prefix="minimind_fixture_") as tmp:
        m3 = uf.write_tokenizer_minimind3(Path(tmp) / "minimind-3")
        m2 = uf.write_tokenizer(Path(tmp) / "minimind2")
        sft = {"minimind-3": sft_fixture(up_ds, m3), "minimind2": sft_fixture(up_ds, m2)}
    fixture = {"sft": sft, "dpo": dpo_fixture(up_dpo, up_dpo_mean), "grpo": grpo_fixture(up_grpo),
               "lora": lora_fixture(up_lora), "torch": str(torch.__version__)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
