"""Chapter 09's SFT token data, from upstream's real tokenizers and code (run by hand, never by the tests).

    python tools/upstream_sft_tokens.py --upstream /path/to/minimind
    # --upstream: a clone of jingyaogong/minimind with its history (a bare git directory works too)
    # writes minimind_ref/reference_outputs/upstream_sft_tokens.json and tests/data/upstream_sft_labels.json

What it reads, with ``git show COMMIT:PATH`` from the clone, into a temporary folder outside the
repository, for each of the two commits the course pins (c090b69, MiniMind2; d65ef2c, minimind-3):
``model/tokenizer.json``, ``model/tokenizer_config.json`` (the chat template) and
``dataset/lm_dataset.py``. It runs that commit's own ``SFTDataset`` steps on each conversation:
``create_chat_prompt`` (transformers' ``apply_chat_template`` with the commit's template),
d65ef2c's ``pre_processing_chat`` / ``post_processing_chat`` where the commit has them,
``tokenizer(prompt).input_ids`` with transformers' ``AutoTokenizer`` on the commit's tokenizer files,
the padding to ``max_length`` and ``generate_labels``, with the marker ids its ``__init__`` computes.
(``datasets`` is replaced by a stub: the steps above do not use it.) It needs ``transformers`` and
``tokenizers`` (the project's ``.venv`` has both).

What it writes (token ids, token strings, the course's own conversations and upstream's labels;
nothing of upstream's code or tokenizer files):

* ``minimind_ref/reference_outputs/upstream_sft_tokens.json`` (package data, chapter 09): per
  commit, the marker ids its ``SFTDataset`` searches for (``bos_id``, ``eos_id``), the ids of
  ``<|im_start|>assistant`` and of the newline, the ids of the vocabulary's tokens that begin with
  a newline and go on, and the string of every token the file uses; conversations whose replies
  begin with whitespace (named examples, and a sample drawn from ``chat_data`` with a whitespace
  prefix drawn for every reply), encoded by each commit's steps: c090b69's; d65ef2c's with the
  empty thinking blocks kept and with them dropped (``post_processing_chat`` forced either way);
  and d65ef2c's with its own random draws (``random.seed(k)`` before the k-th conversation).
* ``tests/data/upstream_sft_labels.json`` (the parity fixture of ``tests/test_upstream_parity_sft.py``):
  for every encoding above and three ``max_length`` values (longer than the conversation, so it is
  padded; cut inside the last reply; cut right after the token that follows the last assistant
  header), upstream's ``generate_labels`` as ``[start, stop)`` spans (every label upstream sets is
  the token id at its position; the tool asserts it).

Before writing, it asserts what the package claims about these tokenizers: ``sft.marker_ids`` equals
upstream's ``bos_id``/``eos_id`` (d65ef2c's form; ``newline=False``: c090b69's), ``sft.render_chat``
equals upstream's rendered prompt, ``sft.encode_rendered`` equals upstream's ids (with the
``tokenizers`` library, through ``pretrained.load_tokenizer_dir``), and ``sft.merged_newline_ids``
equals the tokens found by reading the vocabulary.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA_OUT = ROOT / "minimind_ref" / "reference_outputs" / "upstream_sft_tokens.json"
FIXTURE_OUT = ROOT / "tests" / "data" / "upstream_sft_labels.json"
COMMAND = "python tools/upstream_sft_tokens.py --upstream /path/to/minimind"
COMMITS = {"c090b69": "minimind2", "d65ef2c": "minimind-3"}  # commit -> sft.render_chat template
FILES = ("model/tokenizer.json", "model/tokenizer_config.json", "dataset/lm_dataset.py")
PAD_LENGTH = 256

#: Whitespace a reply may begin with (indentation, a blank line, a stray space or tab); "" keeps some ordinary.
PREFIXES = ("", " ", "  ", "    ", "\t", "\n", "\n\n", " \n", "\n    ", "\n\n    ")
SAMPLE_SIZE, SAMPLE_SEED = 80, 34
SAMPLE_KINDS = {"sum": 0.6, "identity": 0.2, "refusal": 0.2}  # chat_data's kinds without the long story prompts

_USER = {"role": "user", "content": "Write the body of add(a, b)."}
EXAMPLES: Dict[str, List[Dict[str, str]]] = {
    "indented code": [_USER, {"role": "assistant", "content": "    return a + b"}],
    "a tab first": [_USER, {"role": "assistant", "content": "\treturn a + b"}],
    "a blank line first": [_USER, {"role": "assistant", "content": "\n\ndef add(a, b):\n    return a + b"}],
    "a space, then a newline": [_USER, {"role": "assistant", "content": " \nreturn a + b"}],
    "two replies, the second indented": [
        {"role": "user", "content": "What is 12 plus 30?"}, {"role": "assistant", "content": "12+30=042"},
        _USER, {"role": "assistant", "content": "    return a + b"}],
    "ordinary": [{"role": "user", "content": "What is 12 plus 30?"}, {"role": "assistant", "content": "12+30=042"}],
}


def git_show(upstream: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(upstream), "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def git_blob(upstream: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(upstream), "rev-parse", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout.strip()


def load_commit(upstream: Path, commit: str, folder: Path) -> Tuple[types.ModuleType, Any]:
    """That commit's ``dataset/lm_dataset.py`` (as a module) and ``AutoTokenizer`` on its ``model/`` files."""
    from transformers import AutoTokenizer

    for path in FILES:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(git_show(upstream, commit, path))
    stub = types.ModuleType("datasets")  # lm_dataset.py imports it; the steps used here never call it
    stub.load_dataset = lambda *a, **k: []
    stub.Features = stub.Sequence = stub.Value = lambda *a, **k: None
    sys.modules["datasets"] = stub
    spec = importlib.util.spec_from_file_location(f"upstream_lm_dataset_{commit}", folder / "dataset" / "lm_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, AutoTokenizer.from_pretrained(str(folder / "model"))


def sample_conversations() -> List[List[Dict[str, str]]]:
    """``SAMPLE_SIZE`` conversations of ``chat_data`` (train split, ``SAMPLE_KINDS``), every reply given a
    prefix drawn from ``PREFIXES``."""
    from minimind_ref import chat_data

    rng = random.Random(SAMPLE_SEED)
    out = []
    for record in chat_data.sft_conversations(SAMPLE_SIZE, seed=SAMPLE_SEED, weights=SAMPLE_KINDS):
        conv = [dict(m) for m in record["conversations"]]
        for m in conv:
            if m["role"] == "assistant":
                m["content"] = rng.choice(PREFIXES) + m["content"]
        out.append(conv)
    return out


def run_steps(commit: str, module: types.ModuleType, tokenizer: Any, conversation: List[Dict[str, str]],
              max_length: int, mode: str, seed: int = 0) -> Dict[str, Any]:
    """One conversation through the commit's ``SFTDataset.__getitem__`` steps. ``mode`` (d65ef2c):
    ``"kept"`` / ``"dropped"`` force ``post_processing_chat``'s draw (its own function, called with
    ``empty_think_ratio`` 1.0 or -1.0), ``"upstream"`` runs ``pre_processing_chat`` and
    ``post_processing_chat`` as ``__getitem__`` does after ``random.seed(seed)``."""
    ds = module.SFTDataset(None, tokenizer, max_length=max_length)
    conv = conversation
    if commit == "c090b69":
        prompt = ds.create_chat_prompt(conv)
        dropped = False
    else:
        if mode == "upstream":
            random.seed(seed)
            conv = module.pre_processing_chat(conversation)
        rendered = ds.create_chat_prompt(conv)
        if mode == "upstream":
            prompt = module.post_processing_chat(rendered)
        else:
            prompt = module.post_processing_chat(rendered, empty_think_ratio=1.0 if mode == "kept" else -1.0)
        dropped = prompt != rendered
    ids = tokenizer(prompt).input_ids[:max_length]
    n_real = len(ids)
    ids = ids + [tokenizer.pad_token_id] * (max_length - len(ids))
    labels = ds.generate_labels(ids)
    return {"conversation": conv, "prompt": prompt, "dropped": dropped, "ids": ids, "n_real": n_real,
            "labels": labels, "bos_id": list(ds.bos_id), "eos_id": list(ds.eos_id)}


def spans(labels: Sequence[int], ids: Sequence[int]) -> List[List[int]]:
    """``[start, stop)`` runs where ``labels`` is set; each set label must be the id at its position."""
    out: List[List[int]] = []
    for j, (label, token) in enumerate(zip(labels, ids)):
        if label == -100:
            continue
        assert label == token, (j, label, token)
        if out and out[-1][1] == j:
            out[-1][1] = j + 1
        else:
            out.append([j, j + 1])
    return out


def merged_by_vocabulary(tokenizer: Any) -> List[int]:
    """Ids of the tokens whose text is a newline followed by more, read off the byte-level vocabulary
    (``Ċ`` is the newline byte's picture), independently of ``sft.merged_newline_ids``."""
    return sorted(i for t, i in tokenizer.get_vocab().items() if t.startswith("Ċ") and len(t) > 1
                  and i not in tokenizer.all_special_ids)


def encodings_of(commit: str) -> Tuple[str, ...]:
    return ("c090b69",) if commit == "c090b69" else ("d65ef2c kept", "d65ef2c dropped", "d65ef2c upstream")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, type=Path, help="a clone of jingyaogong/minimind with its history")
    p.add_argument("--data-out", type=Path, default=DATA_OUT)
    p.add_argument("--fixture-out", type=Path, default=FIXTURE_OUT)
    args = p.parse_args(argv)
    from minimind_ref import pretrained, sft

    examples = dict(EXAMPLES)
    sample = sample_conversations()
    data: Dict[str, Any] = {
        "about": "Token ids made from upstream's real tokenizers and SFTDataset steps by tools/upstream_sft_tokens.py "
                 "(see its docstring); read by minimind_ref.sft.upstream_sft_tokens.",
        "command": COMMAND, "prefixes": list(PREFIXES), "sample_seed": SAMPLE_SEED,
        "commits": {}, "examples": {name: {"conversation": conv, "ids": {}} for name, conv in examples.items()},
        "sample": {"conversations": sample, "ids": {}, "system_upstream": [], "dropped_upstream": []},
    }
    fixture: Dict[str, Any] = {"command": COMMAND, "fields": ["commit", "encoding", "conversation", "max_length",
                                                              "n_real", "label_spans"], "records": []}
    with tempfile.TemporaryDirectory(prefix="minimind_upstream_sft_") as tmp:
        for commit, template in COMMITS.items():
            folder = Path(tmp) / commit
            module, tokenizer = load_commit(args.upstream, commit, folder)
            ours = pretrained.load_tokenizer_dir(folder / "model")
            header = tokenizer(f"{tokenizer.bos_token}assistant", add_special_tokens=False).input_ids
            newline = tokenizer("\n", add_special_tokens=False).input_ids
            assert len(newline) == 1
            merged = merged_by_vocabulary(tokenizer)
            assert sorted(sft.merged_newline_ids(ours)) == merged, commit
            used = set(header) | set(newline) | set(merged)
            entry: Dict[str, Any] = {"blobs": {path: git_blob(args.upstream, commit, path) for path in FILES},
                                     "header_ids": header, "newline_id": newline[0],
                                     "im_end_id": tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
                                     "pad_id": tokenizer.pad_token_id, "merged_newline_ids": merged}

            def record(key: str, index: Any, conversation: List[Dict[str, str]], mode: str, seed: int = 0):
                full = run_steps(commit, module, tokenizer, conversation, PAD_LENGTH, mode, seed)
                assert full["n_real"] < PAD_LENGTH, "raise PAD_LENGTH"
                entry.setdefault("bos_id", full["bos_id"])
                entry.setdefault("eos_id", full["eos_id"])
                assert (entry["bos_id"], entry["eos_id"]) == (full["bos_id"], full["eos_id"])
                real = full["ids"][: full["n_real"]]
                # the package's view of the same conversation
                assert sft.render_chat(full["conversation"], template=template, drop_empty_think=full["dropped"]) \
                    == full["prompt"], (commit, key, index)
                assert sft.encode_rendered(ours, full["prompt"]) == real, (commit, key, index)
                used.update(real)
                starts = [j for j in range(len(real)) if real[j:j + len(header)] == header]
                cuts = {PAD_LENGTH, full["n_real"] - 3}
                if starts and starts[-1] + len(header) < full["n_real"]:
                    cuts.add(starts[-1] + len(header) + 1)
                for max_length in sorted(cuts):
                    r = full if max_length == PAD_LENGTH else run_steps(commit, module, tokenizer, conversation,
                                                                        max_length, mode, seed)
                    fixture["records"].append([commit, key, index, max_length, r["n_real"],
                                               spans(r["labels"], r["ids"])])
                return full

            for key in encodings_of(commit):
                mode = key.split()[-1] if commit == "d65ef2c" else "c090b69"
                for name, conv in examples.items():
                    if mode == "upstream":
                        continue
                    full = record(key, name, conv, mode)
                    data["examples"][name]["ids"][key] = full["ids"][: full["n_real"]]
                rows = []
                for k, conv in enumerate(sample):
                    full = record(key, k, conv, mode, seed=k)
                    rows.append(full["ids"][: full["n_real"]])
                    if mode == "upstream":
                        added = full["conversation"][: len(full["conversation"]) - len(conv)]
                        assert full["conversation"][len(added):] == conv and len(added) <= 1
                        data["sample"]["system_upstream"].append(added[0]["content"] if added else None)
                        data["sample"]["dropped_upstream"].append(full["dropped"])
                data["sample"]["ids"][key] = rows
            assert sft.marker_ids(ours) == (entry["bos_id"], entry["eos_id"]) if commit == "d65ef2c" else \
                sft.marker_ids(ours, newline=False) == (entry["bos_id"], entry["eos_id"]), commit
            entry["tokens"] = {str(i): tokenizer.convert_ids_to_tokens(i) for i in sorted(used)}
            data["commits"][commit] = entry
    args.data_out.parent.mkdir(parents=True, exist_ok=True)
    args.data_out.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    args.fixture_out.write_text(json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    for path in (args.data_out, args.fixture_out):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
