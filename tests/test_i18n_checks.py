"""The exercise checks' messages in Simplified Chinese (minimind_ref.i18n, tools/i18n_checks.py).

English stays the default and unchanged; ``MINIMIND_LANG=zh`` or ``set_language("zh")`` switches a
kernel to Chinese. The catalog is complete and faithful (placeholders, numbers and code kept), it
holds exactly the templates of the check sources (a new English message without a translation
fails here), and a planted mistake of every chapter gives a Chinese message with the numbers of
the English one and no English sentence left in it.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F

from _helpers import check_fails
from minimind_ref import grpo, i18n
from minimind_ref.checks import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11, ch12
from minimind_ref.checks.core import ExerciseError, check_close, passed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import i18n_checks  # noqa: E402  (tools/ is not a package)

CJK = re.compile(r"[\u4e00-\u9fff]")
NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?")
QUOTED = re.compile(r"`[^`]*`|'[^']*'")  # code spans and quoted strings (reprs of data)
PY_WORDS = {"for", "in", "if", "else", "return", "and", "or", "not", "is", "while", "with", "as", "def", "lambda"}
ENGLISH_WORD = re.compile(r"[A-Za-z][a-z]+[,.;:!?]?")


@pytest.fixture(autouse=True)
def _language(monkeypatch):
    """Every test starts in the default state (no call, no environment variable) and leaves it so."""
    monkeypatch.delenv(i18n.ENV_VAR, raising=False)
    i18n.set_language(None)
    yield
    monkeypatch.delenv(i18n.ENV_VAR, raising=False)
    i18n.set_language(None)


def english_runs(text: str, n: int = 4):
    """Runs of ``n`` or more English words in ``text``, outside code spans and quoted strings; an
    identifier (``x.float()``, ``rms_norm``, ``x``) or a Python keyword ends a run."""
    runs, current = [], []
    for token in QUOTED.sub(" ", text).split():
        if ENGLISH_WORD.fullmatch(token) and token.rstrip(",.;:!?") not in PY_WORDS:
            current.append(token)
        else:
            if len(current) >= n:
                runs.append(" ".join(current))
            current = []
    if len(current) >= n:
        runs.append(" ".join(current))
    return runs


def numbers(text: str) -> Counter:
    return Counter(n.replace(",", "") for n in NUMBER.findall(QUOTED.sub(" ", text)))


# ----------------------------------------------------------------------------------- the catalog
def test_catalog_is_complete_and_valid():
    total = i18n_checks.coverage("zh_CN")[-1]
    assert total["templates"] > 0
    assert total["translated"] == total["templates"], total
    assert total["fuzzy"] == 0 and total["untranslated"] == 0, total
    assert i18n_checks.validate("zh_CN") == []


def test_catalog_holds_exactly_the_templates_of_the_check_sources():
    """A message added to (or changed in) minimind_ref/checks without `tools/i18n_checks.py extract`
    and a translation fails here."""
    extracted = [template for template, _ in i18n_checks.extract_all()]
    shipped = i18n.parse_po(i18n_checks.catalog_path("zh_CN").read_text(encoding="utf-8"))
    assert len(extracted) == len(set(extracted))
    missing = sorted(set(extracted) - {msgid for msgid, _, _ in shipped})
    stale = sorted({msgid for msgid, _, _ in shipped} - set(extracted))
    assert not missing, f"run `python tools/i18n_checks.py extract` and translate: {missing[:5]}"
    assert not stale, f"run `python tools/i18n_checks.py extract`: {stale[:5]}"


def test_extraction_rules():
    assert i18n_checks.is_message("x of shape {0}")
    assert i18n_checks.is_message("{0}: {1}")          # punctuation Chinese writes full-width
    assert not i18n_checks.is_message("head_dim")        # an identifier
    assert not i18n_checks.is_message("{0} {1}")        # nothing but a space
    templates = {t for t, _ in i18n_checks.extract_all()}
    assert "x of shape {0}" in templates                   # f"x of shape {shape}"
    assert "{0} (gradient)" in templates                   # name + " (gradient)"
    assert "✓ {0} passed: {1}" in templates
    assert not any(t.startswith("Checks for chapter") for t in templates)  # docstrings
    assert "check_rms_norm" not in templates               # __all__


def test_extract_keeps_translations_and_marks_changed_english_fuzzy(tmp_path, monkeypatch):
    import polib

    checks = tmp_path / "minimind_ref" / "checks"
    checks.mkdir(parents=True)
    monkeypatch.setattr(i18n_checks, "ROOT", tmp_path)
    monkeypatch.setattr(i18n_checks, "SOURCES", checks)
    monkeypatch.setattr(i18n_checks, "LOCALE", tmp_path / "minimind_ref" / "locale")
    source = checks / "ch99.py"
    source.write_text('"""Docstring."""\nHINT = "keep the last dimension"\ndef f(n):\n'
                      '    return f"{n} cases match the reference"\n', encoding="utf-8")
    assert i18n_checks.extract("zh_CN") == (2, 0, 0)
    path = i18n_checks.catalog_path("zh_CN")
    po = polib.pofile(str(path))
    for entry, text in zip(po, ["保留最后一维", "{0} 个用例与参考实现一致"]):
        entry.msgstr = text
    po.save(str(path))
    source.write_text(source.read_text(encoding="utf-8").replace("cases match", "cases all match"), encoding="utf-8")
    assert i18n_checks.extract("zh_CN") == (2, 1, 1)
    changed = polib.pofile(str(path)).find("{0} cases all match the reference")
    assert changed.fuzzy and changed.msgstr == "{0} 个用例与参考实现一致"
    assert changed.previous_msgid == "{0} cases match the reference"
    assert i18n_checks.coverage("zh_CN")[-1] == {"file": "total", "templates": 2, "translated": 1, "fuzzy": 1,
                                                 "untranslated": 0, "percent": 50.0}
    # a fuzzy translation is never shown
    assert i18n.Catalog(i18n.parse_po(path.read_text(encoding="utf-8"))).translate("3 cases all match the reference") \
        == "3 cases all match the reference"


def test_validate_catches_broken_translations():
    assert i18n_checks.problems("expected {0}, got {1}", "期望 {0}，得到 {1}") == []
    assert i18n_checks.problems("expected {0}, got {1}", "得到 {1}，期望 {0}") == []  # any order
    assert i18n_checks.problems("expected {0}, got {1}", "期望 {0}")                    # a placeholder lost
    assert i18n_checks.problems("x of shape (4, 16)", "形状为 (4, 61) 的 x")           # a number changed
    assert i18n_checks.problems("end with `return a, b`.", "最后写 return a, b。")       # a code span lost
    assert i18n_checks.problems("got {1}{2}", "得到 {1}，{2}")                           # a run split


def test_the_po_parser_reads_what_gettext_tools_write():
    source = ('msgid ""\nmsgstr ""\n"Language: zh_CN\\n"\n\n'
              '#: a.py:1\nmsgid "a \\"quoted\\" "\n"text\\n"\nmsgstr "译文"\n\n'
              '#, fuzzy\nmsgid "old"\nmsgstr "旧"\n\n'
              'msgid "empty"\nmsgstr ""\n\n'
              '#~ msgid "gone"\n#~ msgstr "无"\n')
    assert i18n.parse_po(source) == [('a "quoted" text\n', "译文", False), ("old", "旧", True), ("empty", "", False)]
    catalog = i18n.Catalog(i18n.parse_po(source))
    assert catalog.translate("old") == "old" and catalog.translate("empty") == "empty"  # never used


# ----------------------------------------------------------------------------------- choosing the language
def test_english_is_the_default():
    assert i18n.get_language() == "en"
    assert i18n.translate("shape mismatch: expected (2,), got (3,)") == "shape mismatch: expected (2,), got (3,)"
    assert i18n.available_languages() == ("en", "zh_CN")


@pytest.mark.parametrize("lang", ["zh", "zh_CN", "zh-cn", "ZH"])
def test_set_language_accepts_chinese_spellings(lang):
    assert i18n.set_language(lang) == "zh_CN"
    assert i18n.get_language() == "zh_CN"
    assert i18n.set_language("en") == "en"


def test_environment_variable_and_explicit_call(monkeypatch):
    monkeypatch.setenv(i18n.ENV_VAR, "zh")
    assert i18n.get_language() == "zh_CN"
    assert i18n.set_language("en") == "en"  # the call wins over the environment
    assert i18n.get_language() == "en"
    assert i18n.set_language(None) == "zh_CN"  # forgetting the call: the environment again
    monkeypatch.setenv(i18n.ENV_VAR, "")
    assert i18n.get_language() == "en"


@pytest.mark.parametrize("bad", ["fr", "chinese", "", 3])
def test_set_language_rejects_other_values(bad):
    with pytest.raises(ValueError, match=r"'en', 'zh' or 'zh_CN'"):
        i18n.set_language(bad)
    assert i18n.get_language() == "en"


def test_a_bad_environment_variable_is_named(monkeypatch):
    monkeypatch.setenv(i18n.ENV_VAR, "klingon")
    with pytest.raises(ValueError, match="MINIMIND_LANG.*'klingon'.*'en', 'zh' or 'zh_CN'"):
        i18n.get_language()


# ----------------------------------------------------------------------------------- translate
def test_translate_fills_templates_and_translates_values():
    zh = "zh"
    assert i18n.translate("x of shape (4, 16)", zh) == "形状为 (4, 16) 的 x"
    # the value of a template is translated in turn, and a tuple's inner ", " does not cut it
    assert (i18n.translate("shape mismatch: expected (4, 16), got (4, 1) (on x of shape (4, 16))", zh)
            .startswith("形状不匹配：期望 (4, 16)，得到 (4, 1)"))
    assert i18n.translate(" (on x of shape (4, 16))", zh) == "（用例：形状为 (4, 16) 的 x）"
    # placeholders may come in another order in Chinese
    assert i18n.translate("a result with 3 rows for n_new=2", zh) == "一个对 n_new=2 只有 3 行的结果"
    # two values side by side ({1}{2}) are cut where both read as messages
    assert i18n.translate("n_experts=4, top_k=2, one expert unused", zh) == "n_experts=4，top_k=2，有一个专家没有被使用"
    assert i18n.translate("Exercise 11.3 dpo_loss (gradient)", zh) == "练习 11.3 dpo_loss（梯度）"
    # what matches nothing is returned as it is, line by line
    assert i18n.translate("RuntimeError: something torch said", zh) == "RuntimeError: something torch said"
    assert i18n.translate("the bias left out\nno causal mask", zh) == "漏掉了 bias\n没有因果掩码"


# ----------------------------------------------------------------------------------- core's own texts
def _fail_close(got, expected, **kwargs) -> str:
    with pytest.raises(ExerciseError) as info:
        check_close(got, expected, name="Exercise 1.1 rms_norm", **kwargs)
    return str(info.value)


def test_core_english_is_unchanged():
    message = _fail_close(torch.zeros(2), torch.zeros(3), case="x of shape (3,)", hint="keep the shape.",
                          mistakes={"the bias left out": torch.zeros(2)})
    assert message == ("[Exercise 1.1 rms_norm] this looks like the bias left out: shape mismatch: expected (3,), "
                       "got (2,) (on x of shape (3,))\n  hint: keep the shape.\n"
                       '  stuck? minimind_ref.checks.show_solution("1.1") prints a solution')


def test_core_labels_and_values_in_chinese():
    i18n.set_language("zh")
    message = _fail_close(torch.zeros(2), torch.zeros(3), case="x of shape (3,)", hint="the bias left out",
                          mistakes={"the bias left out": torch.zeros(2)})
    assert message == ("[练习 1.1 rms_norm] 这看起来像是“漏掉了 bias”：形状不匹配：期望 (3,)，得到 (2,)"
                       "（用例：形状为 (3,) 的 x）\n  提示：漏掉了 bias\n"
                       '  卡住了？运行 minimind_ref.checks.show_solution("1.1") 可以看到一种解法')


def test_show_solution_speaks_the_learners_language(capsys):
    from minimind_ref.checks import show_solution

    i18n.set_language("zh")
    show_solution("11.4")
    out = capsys.readouterr().out
    assert out == "练习 11.4 的一种写法：\n    return -math.log(math.exp(loss) - 1) / beta\n", out


def test_the_pass_line(capsys):
    passed("Exercise 1.1 rms_norm", "3 cases match minimind_ref.RMSNorm (fp32 and bf16)")
    passed("Exercise 1.4 count_rmsnorm")
    assert capsys.readouterr().out == ("✓ Exercise 1.1 rms_norm passed: 3 cases match minimind_ref.RMSNorm (fp32 and bf16)\n"
                                       "✓ Exercise 1.4 count_rmsnorm passed\n")
    i18n.set_language("zh")
    ch01.check_rms_norm(lambda x, w, eps=1e-5: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)))
    passed("Exercise 1.4 count_rmsnorm")
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"✓ 练习 1\.1 rms_norm 通过：\d+ 个用例与第 2 节的 RMSNorm 一致（fp32、bf16，以及在 fp16 中计算的 fp16）",
                        out[0]), out
    assert out[1] == "✓ 练习 1.4 count_rmsnorm 通过"


# ----------------------------------------------------------------------------------- one mistake per chapter
def _rotate_wrong_sign(x):
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], -x[..., :half]), dim=-1)


def _sdpa_unscaled(q, k, v, mask=None):
    return torch.softmax(q @ k.transpose(-2, -1) + (0 if mask is None else mask), dim=-1) @ v


def _cache_written_at_the_start(buffer, past_len, k_new, v_new):
    end = past_len + k_new.shape[1]
    buffer[0][:, :k_new.shape[1]] = k_new
    buffer[1][:, :v_new.shape[1]] = v_new
    return buffer[0][:, :end], buffer[1][:, :end]


def _route_smallest(x, weight, top_k, norm_topk_prob=True):
    scores = F.linear(x, weight).softmax(dim=-1)
    w, idx = torch.topk(scores, k=top_k, dim=-1, largest=False)
    if top_k > 1 and norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w


def _lora_unscaled(x, weight, A, B, scale=1.0):
    return F.linear(x, weight) + F.linear(F.linear(x, A), B)


def _margin_without_beta(loss, beta):
    return -math.log(math.expm1(loss))


def _factor_upside_down(num_groups, groups_with_spread, group_size):
    return math.sqrt(groups_with_spread * group_size / (num_groups * group_size - 1))


CHAPTERS: Dict[str, Tuple[Callable, Callable, str, str]] = {
    # chapter: (check, planted mistake, what the English message says, what the Chinese one says)
    "01": (ch01.check_rms_norm, lambda x, w, eps=1e-5: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps),
           "this looks like the gain (weight) left out", "漏掉了增益（weight）"),
    "02": (ch02.check_rotate_half, _rotate_wrong_sign, "this looks like a rotation the other way",
           "转向反了"),
    "03": (ch03.check_scaled_dot_product_attention, _sdpa_unscaled, "this looks like no scaling",
           "k 和 v (2, 3, 7, 16)，无掩码，head_dim 16，5 个查询对 7 个键"),
    "04": (ch04.check_silu, torch.sigmoid, "this looks like the sigmoid alone", "只有 sigmoid（没有乘以 x）"),
    "05": (ch05.check_loss_at_initialization, lambda vocab_size, hidden_size: math.log(vocab_size),
           "this looks like the logits taken as all equal", "把初始化时的 logits 当成全都相等"),
    "06": (ch06.check_update_cache, _cache_written_at_the_start,
           "this looks like the new positions written at the start of the buffer", "新位置写在了缓冲区的开头"),
    "07": (ch07.check_route, _route_smallest, "this looks like the k smallest scores instead of the k largest: "
           "different experts chosen for", "取了最小的 k 个分数"),
    "08": (ch08.check_merge_pair, ch08.MERGE_MISTAKES["merging only the first occurrence (every occurrence must be "
                                                       "replaced)"],
           "this looks like merging only the first occurrence", "只合并了第一次出现"),
    "09": (ch09.check_assistant_loss_mask, ch09._mask_truncated_dropped,
           "(on a reply cut off before its end marker: ids=", "（用例：一个在结束标记之前被截断的回答：ids="),
    "10": (ch10.check_lora_forward, _lora_unscaled, "this looks like the scale ignored", "忽略了 scale"),
    "11": (ch11.check_margin_at_loss, _margin_without_beta, "this looks like beta left out", "漏掉了 beta"),
    "12": (ch12.check_rescale_factor, _factor_upside_down, "this looks like the factor upside down", "因子上下颠倒了"),
}


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_a_planted_mistake_is_reported_in_chinese(chapter, monkeypatch):
    from minimind_ref.checks import delegation

    monkeypatch.setattr(delegation, "ENFORCED", False)  # chapter 09's planted mistake is built from sft's own mask
    check, wrong, english_fragment, chinese_fragment = CHAPTERS[chapter]
    english = check_fails(check, wrong, english_fragment, "\n  hint: ")
    i18n.set_language("en")
    assert check_fails(check, wrong) == english  # the explicit choice of English is the default
    monkeypatch.setenv(i18n.ENV_VAR, "zh")
    i18n.set_language(None)
    chinese = check_fails(check, wrong, chinese_fragment, "\n  提示：")
    assert chinese.startswith(f"[练习 {int(chapter)}."), chinese
    assert CJK.search(chinese.split("\n")[0]) and len(CJK.findall(chinese)) > 10, chinese
    assert numbers(chinese) == numbers(english), f"{english}\n{chinese}"
    assert not english_runs(chinese), f"English left in:\n{chinese}\n{english_runs(chinese)}"
    for label in ("hint:", "stuck?", "prints a solution", "this looks like", " (on "):
        assert label not in chinese, chinese
    assert english_runs(english)  # the test can see English when there is some
