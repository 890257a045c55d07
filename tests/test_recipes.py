"""The recipes (``minimind_ref/configs/{pretrain,sft}_{minimind2_small,minimind3}.json``) reproduce
upstream's pretraining and full SFT, value by value.

No network and no upstream code: each value of a recipe has an entry in its ``_upstream`` notes
that cites upstream's line as ``COMMIT:PATH:LINE "fragment"``, and ``tools/check_upstream_citations.py``
verified in upstream's git history that the fragment is on that line (``tools/upstream_citations.json``;
``tests/test_upstream_citations.py`` fails while a citation is unverified). Here: the fragment
holds upstream's literal (``default=8``), the literal is the value upstream uses, and the recipe's
value equals it, or a note beside it says why the course's differs. Values upstream leaves to
torch (AdamW's betas and weight decay) are compared with torch's own defaults.
"""

import ast
import inspect
import json
import sys
from pathlib import Path

import pytest
import torch

from minimind_ref.train import CONFIG_DIR, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_upstream_citations as cuc  # noqa: E402

RECIPES = {"pretrain_minimind2_small": "c090b69", "sft_minimind2_small": "c090b69",
           "pretrain_minimind3": "d65ef2c", "sft_minimind3": "d65ef2c"}


def _raw(name):
    return json.loads((CONFIG_DIR / f"{name}.json").read_text(encoding="utf-8"))


def _entries(raw):
    """(dotted key, the recipe's value, its _upstream entry) for every value of the recipe."""
    notes = raw["_upstream"]
    for key, value in raw.items():
        if key.startswith("_"):
            continue
        if key == "model":
            for mkey, mvalue in value.items():
                yield f"model.{mkey}", mvalue, notes.get("model", {}).get(mkey)
        else:
            yield key, value, notes.get(key)


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a path or a word, as upstream writes it


def _same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == pytest.approx(b, rel=1e-12)
    return a == b


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_value_is_upstreams_or_says_why_not(name):
    raw = _raw(name)
    cfg = TrainConfig.from_json(name)  # loads: every value is valid
    assert cfg.to_dict()["model"] == {**TrainConfig().model, **raw["model"]}
    commit = RECIPES[name]
    checked = 0
    for key, value, entry in _entries(raw):
        assert isinstance(entry, dict), f"{name}: {key} has no entry in _upstream"
        if "course" in entry:  # no upstream counterpart: the entry says what the course's value does
            assert "cite" not in entry and len(entry["course"]) > 20, (name, key)
            continue
        found = cuc.find_in_text(entry["cite"], name, lambda _o: key)
        assert len(found) == 1 and found[0].kind == "citation" and found[0].fragment, (name, key, entry["cite"])
        occ = found[0]
        assert occ.commit == commit, f"{name}: {key} cites {occ.commit}, the recipe is {commit}'s"
        upstream = entry["upstream_value"]
        if "literal" in entry:
            assert entry["literal"] in occ.fragment, (name, key, entry["literal"], occ.fragment)
            literal = _literal(entry["literal"])
            if isinstance(upstream, bool):  # argparse's 0/1 switches
                literal = bool(literal)
            if upstream is None:  # upstream's from_resume=0: start afresh
                literal = None if literal == 0 else literal
            assert _same(literal, upstream), (name, key, literal, upstream)
        if "torch_default" in entry:
            default = inspect.signature(torch.optim.AdamW).parameters[entry["torch_default"]].default
            assert _same(list(default) if isinstance(default, tuple) else default, upstream), (name, key, default)
        expected = upstream * raw[entry["times"]] if "times" in entry else upstream
        if not _same(value, expected):
            assert len(entry.get("note", "")) > 20, f"{name}: {key}={value!r} differs from upstream's {expected!r} " \
                                                    "without a note saying why"
        checked += 1
    assert checked >= 25, (name, checked)


def test_the_recipes_differ_where_upstreams_scripts_do():
    pre2, sft2, pre3, sft3 = (TrainConfig.from_json(n) for n in ("pretrain_minimind2_small", "sft_minimind2_small",
                                                                 "pretrain_minimind3", "sft_minimind3"))
    assert (pre2.model["hidden_size"], pre3.model["hidden_size"]) == (512, 768)
    assert (pre2.accumulation_steps, sft2.accumulation_steps) == (8, 1)
    assert (pre2.epochs, pre3.epochs, sft2.epochs, sft3.epochs) == (1, 2, 2, 2)
    assert (sft2.lr, sft3.lr, sft3.seq_len) == (1e-6, 1e-5, 768)
    for cfg in (pre2, sft2, pre3, sft3):
        assert cfg.min_lr == pytest.approx(0.1 * cfg.lr) and cfg.warmup_steps == 0 and cfg.dtype == "auto"


def test_every_recipe_citation_is_in_the_record():
    """The checker reads the recipes' JSON (their string values) and verified every citation there."""
    found = [o for o in cuc.scan(ROOT) if o.file.startswith("minimind_ref/configs/")]
    assert {o.file.split("/")[-1][:-5] for o in found} >= set(RECIPES)
    keys = cuc.record_keys(cuc.load_record())
    for occ in found:
        assert keys.get(occ.key(), {}).get("status") == "verified", (occ.file, occ.where, occ.text)


def test_a_comment_key_is_ignored_and_an_unknown_key_refused():
    assert TrainConfig.from_dict({"_anything": {"x": 1}, "lr": 1e-3}).lr == 1e-3
    with pytest.raises(ValueError, match=r"unknown training option\(s\) \['lrr'\]"):
        TrainConfig.from_dict({"lrr": 1e-3})
