"""The Chinese edition (issue 22): catalogs from one source, their coverage, and the translated copies.

``tools/i18n.py`` splits the English notebooks and pages into messages and keeps the catalogs in
``locales/zh_CN``; ``tools/make_student.py`` and ``tools/build_zh.py`` make the Chinese student
editions and site from them. The site build and the browser look are in ``test_book.py``, the
Chinese editions under nbval in the Colab-like pass (``make test-colab``, ``--zh``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import polib
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import i18n  # noqa: E402
import make_student  # noqa: E402

LANG = "zh_CN"
#: Catalogs that must be complete (issue 22): chapters 01-08, the book pages and the site's strings.
COMPLETE = [f"{p.stem}" for p in i18n.chapters() if int(p.name[:2]) <= 8] + [i18n.domain_of(p) for p in i18n.pages()] + ["site"]
CJK = re.compile(r"[\u4e00-\u9fff]")


def all_markdown():
    for path in i18n.chapters():
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                yield f"{path.name} cell {index}", cell.source
    for path in i18n.pages():
        yield f"book/{path.name}", path.read_text(encoding="utf-8")


def test_split_gives_back_every_source_exactly():
    for where, text in all_markdown():
        chunks = i18n.split_markdown(text)
        assert "".join(c.text for c in chunks) == text, where
        assert i18n.translate_markdown(text, {}) == text, where


def test_code_math_blocks_and_comments_are_never_messages():
    text = ("# Title\n\nSome prose with `code` and $x^2$.\n\n```python\nx = 1\n\ny = 2\n```\n\n$$\na = b\n$$\n\n"
            "<!-- prose-numbers: not computed here -->\n- item one\n- item two\n  continued\n\n"
            "| chapter | seconds |\n| --- | --- |\n| 12_grpo | 62.1 |\n\n```{include} ../x.md\n```\n\nAfter the include.")
    # a row of names and numbers has nothing to translate: copied, so re-measuring it needs no translator
    assert i18n.messages(text) == ["Title", "Some prose with `code` and $x^2$.", "item one", "item two\n  continued",
                                   "| chapter | seconds |", "After the include."]
    table = {m: f"[{m}]" for m in i18n.messages(text)}
    out = i18n.translate_markdown(text, table)
    assert "```python\nx = 1\n\ny = 2\n```" in out and "$$\na = b\n$$" in out and "```{include} ../x.md\n```" in out
    assert "- [item one]\n- [item two\n  continued]" in out and "# [Title]" in out and "\n| 12_grpo | 62.1 |\n" in out


def test_validate_catches_a_changed_number_code_span_or_link():
    english = "The loss falls to 0.86 after `train(...)`, see [chapter 08](08_training.ipynb)."
    assert i18n.problems(english, "损失在 `train(...)` 之后降到 0.86，见[第 08 章](08_training.ipynb)。") == []
    assert any("numbers" in p for p in i18n.problems(english, "损失在 `train(...)` 之后降到 0.85，见[第 08 章](08_training.ipynb)。"))
    assert any("code" in p for p in i18n.problems(english, "损失在 train 之后降到 0.86，见[第 08 章](08_training.ipynb)。"))
    assert any("links" in p for p in i18n.problems(english, "损失在 `train(...)` 之后降到 0.86，见第 08 章。"))


def test_catalogs_hold_exactly_the_messages_of_the_english_sources():
    """`make i18n` is a no-op: no message missing from a catalog, none left over."""
    for domain, found in i18n.all_sources().items():
        path = i18n.catalog_path(LANG, domain)
        assert path.exists(), f"no catalog {path.relative_to(ROOT)}: run `make i18n`"
        ids = {e.msgid for e in polib.pofile(str(path)) if not e.obsolete}
        wanted = {m for m, _ in found}
        assert ids == wanted, (f"{path.relative_to(ROOT)} is out of date with the English text "
                               f"({len(wanted - ids)} new, {len(ids - wanted)} gone): run `make i18n` and translate")


def test_every_translation_keeps_code_math_links_and_numbers():
    errors = i18n.validate(LANG)
    assert not errors, "\n".join(errors[:30])


def test_coverage_is_complete_for_chapters_01_to_08_and_the_book_pages():
    rows = {row["domain"]: row for row in i18n.coverage(LANG)}
    print("\n" + "\n".join(f"{d:20} {r['translated']}/{r['messages']} ({r['percent']:.1f}%)" for d, r in rows.items()))
    incomplete = {d: rows[d] for d in COMPLETE if rows[d]["translated"] != rows[d]["messages"]}
    assert not incomplete, f"untranslated or fuzzy messages: {incomplete}"


def test_a_changed_english_message_keeps_its_translation_as_fuzzy(tmp_path, monkeypatch):
    page = tmp_path / "book" / "demo.md"
    page.parent.mkdir()
    page.write_text("# Demo\n\nThe model has 8 layers.\n", encoding="utf-8")
    monkeypatch.setattr(i18n, "LOCALES", tmp_path / "locales")
    monkeypatch.setattr(i18n, "all_sources", lambda: {"book-demo": i18n.source_messages(page)})
    i18n.extract(LANG)
    po = polib.pofile(str(i18n.catalog_path(LANG, "book-demo")))
    for entry in po:
        entry.msgstr = {"Demo": "演示", "The model has 8 layers.": "模型有 8 层。"}[entry.msgid]
    po.save()
    page.write_text("# Demo\n\nThe model has 16 layers.\n", encoding="utf-8")
    i18n.extract(LANG)
    entries = {e.msgid: e for e in polib.pofile(str(i18n.catalog_path(LANG, "book-demo")))}
    changed = entries["The model has 16 layers."]
    assert changed.fuzzy and changed.msgstr == "模型有 8 层。" and changed.previous_msgid == "The model has 8 layers."
    assert not entries["Demo"].fuzzy
    # a fuzzy translation is never used: the English shows until someone reviews it
    assert "The model has 16 layers." in i18n.translated_page(page)
    assert i18n.coverage(LANG)[0]["fuzzy"] == 1


def test_a_changed_notebook_message_is_found_by_its_cell(tmp_path, monkeypatch):
    """Notebook messages are located by file:cell; a changed paragraph takes the translation of the
    most similar vanished message of the same cell, not of another cell."""
    path = tmp_path / "99_demo.ipynb"

    def write(first: str, second: str) -> None:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell(first), nbformat.v4.new_markdown_cell(second)]
        nbformat.write(nb, path)

    monkeypatch.setattr(i18n, "LOCALES", tmp_path / "locales")
    monkeypatch.setattr(i18n, "all_sources", lambda: {"99_demo": i18n.source_messages(path)})
    write("Section 5 measures it.", "Section 5 logs it.")
    i18n.extract(LANG)
    po = polib.pofile(str(i18n.catalog_path(LANG, "99_demo")))
    assert [e.occurrences for e in po] == [[("99_demo.ipynb", "0")], [("99_demo.ipynb", "1")]]
    for entry, text in zip(po, ["第 5 节测量它。", "第 5 节记录它。"]):
        entry.msgstr = text
    po.save()
    write("Section 6 measures it.", "Section 5 logs it.")
    i18n.extract(LANG)
    entries = {e.msgid: e for e in polib.pofile(str(i18n.catalog_path(LANG, "99_demo")))}
    assert entries["Section 6 measures it."].fuzzy and entries["Section 6 measures it."].msgstr == "第 5 节测量它。"
    assert not entries["Section 5 logs it."].fuzzy


@pytest.mark.parametrize("path", [p for p in i18n.chapters() if int(p.name[:2]) <= 8], ids=lambda p: p.stem)
def test_translated_chapter_carries_the_english_code_and_outputs(path):
    english = nbformat.read(path, as_version=4)
    chinese = i18n.translated_notebook(path, LANG)
    assert [c.cell_type for c in chinese.cells] == [c.cell_type for c in english.cells]
    language_lines = 0
    for en, zh in zip(english.cells, chinese.cells):
        if en.cell_type == "markdown":
            if i18n.messages(en.source):
                assert CJK.search(zh.source), f"{path.name}: a markdown cell was not translated: {en.source[:80]!r}"
            continue
        if zh.source != en.source:
            assert zh.source.replace(i18n.LANGUAGE_LINE[LANG] + "\n", "", 1) == en.source
            language_lines += 1
        assert len(zh.outputs) == len(en.outputs)
        for a, b in zip(en.outputs, zh.outputs):
            if a.get("output_type") == "stream":
                for line_en, line_zh in zip(a["text"].split("\n"), b["text"].split("\n")):
                    assert line_en == line_zh or line_en.startswith("✓"), "only check lines are translated"
            else:
                assert a == b
    assert language_lines == 1, "the setup cell selects the Chinese check messages, once"


def test_chinese_student_editions_say_exercise_in_chinese():
    for path in i18n.chapters():
        if int(path.name[:2]) > 8:
            continue
        student = nbformat.read(ROOT / "student" / "zh" / path.name, as_version=4)
        english = nbformat.read(ROOT / "student" / path.name, as_version=4)
        stubs = [c.source for c in student.cells if c.cell_type == "code" and 'raise NotImplementedError("' in c.source]
        assert stubs and all('raise NotImplementedError("练习 ' in s for s in stubs), path.name
        assert len(stubs) == sum(1 for c in english.cells if c.cell_type == "code" and 'raise NotImplementedError("Exercise ' in c.source)
        assert i18n.LANGUAGE_LINE[LANG] in "".join(c.source for c in student.cells if c.cell_type == "code")
    assert make_student.TRANSLATIONS == {"zh": LANG}


def test_line_breaks_between_chinese_characters_are_joined_in_list_items_too():
    """Browsers show a line break as a space; Chinese has none. A list item's continuation lines are
    indented, and the break may sit next to an emphasis marker: all of these are joined."""
    assert i18n.join_cjk_lines("分组查询\n注意力") == "分组查询注意力"
    assert i18n.join_cjk_lines("- 多头注意力以及**分组查询\n  注意力**（GQA）；") == "- 多头注意力以及**分组查询注意力**（GQA）；"
    assert i18n.join_cjk_lines("以及\n  **分组查询注意力**") == "以及**分组查询注意力**"
    assert i18n.join_cjk_lines("点积）和概率的基础知识\n\t（把 softmax") == "点积）和概率的基础知识（把 softmax"
    # a break next to Latin text, code or a number stays (it renders as the space such text wants)
    for text in ("使用\n`rms_norm`", "MiniMind2\n模型", "模型\nMiniMind2", "第\n08 章", "一段。\n\n另一段"):
        assert i18n.join_cjk_lines(text) == text


def test_the_translated_pages_and_chapters_have_no_line_break_between_chinese_characters():
    """The case the bilingual review found in 15 list items of the book pages ("分组查询 注意力")."""
    pattern = re.compile(r"[\u4e00-\u9fff\u3000-\u303f\uff00-\uffef](\*\*|\*|_)?\n[ \t]*(\*\*|\*|_)?[\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]")
    found = []
    for path in i18n.pages():
        found += [f"book/{path.name}: {m.group(0)!r}" for m in pattern.finditer(i18n.translated_page(path, LANG))]
    for path in i18n.chapters():
        for index, cell in enumerate(i18n.translated_notebook(path, LANG).cells):
            if cell.cell_type == "markdown":
                found += [f"{path.name} cell {index}: {m.group(0)!r}" for m in pattern.finditer(cell.source)]
    assert not found, "\n".join(found)


# ----------------------------------------------------------------------------- wording (the bilingual review, issue 31)
#: The Chinese edition's glossary, as tests: wordings the review found and their replacements.
#: (chosen / rejected / refusal; BatchNorm-like "批次归一化"; calques; ambiguous "n 倍小"; the English
#: citation form; "query 头" in the check messages where the chapters say 查询头.)
RETIRED = {
    "被选中的回答": "优选回答", "被拒绝的回答": "劣选回答", "被选中回答": "优选回答", "被拒绝回答": "劣选回答",
    "拒绝回答": "拒答", "(?<!全)批次(?!优势)归一化": "全批次优势归一化", "平局": "(rewritten)", "押注": "(rewritten)",
    "往上推": "(rewritten)", "诚实地": "如实", "簿记": "(rewritten)", "(?<!完)整答案": "答案完全正确",
    "小 4 倍": "只有 … 的四分之一", "再大四倍": "再乘以四", " et al., ": "X 等，YYYY", "query 头": "查询头",
}


def all_catalog_entries():
    from minimind_ref.i18n import LOCALE_DIR

    paths = sorted((ROOT / "locales" / LANG / "LC_MESSAGES").glob("*.po")) + [LOCALE_DIR / LANG / "LC_MESSAGES" / "checks.po"]
    for path in paths:
        for entry in polib.pofile(str(path)):
            if not entry.obsolete and entry.msgstr:
                yield path.name, entry


def test_retired_wordings_are_gone_from_every_catalog():
    found = [f"{name}: {old!r} (use {new}) in {entry.msgstr[:80]!r}"
             for name, entry in all_catalog_entries() for old, new in RETIRED.items() if re.search(old, entry.msgstr)]
    assert not found, "\n".join(found)


def test_prompt_is_tishici_and_clip_is_caijian():
    """'prompt' is 提示词 and 提示 alone is the hint: a translation holds no more 提示 (not followed
    by 词 or 模) than its English has hints, before a colon or anywhere else; 'clip' and 'clamp' are
    裁剪 (截断 is truncation)."""
    bad = []
    for name, entry in all_catalog_entries():
        hints = len(re.findall(r"\bhint", entry.msgid, re.I))
        if len(re.findall(r"提示(?![词模])", entry.msgstr)) > hints:
            bad.append(f"{name}: 提示 without a hint in the English (a prompt is 提示词): {entry.msgstr[:80]!r}")
        if re.search(r"\b(clip|clipp|clamp)\w*", entry.msgid) and "截断" in entry.msgstr:
            bad.append(f"{name}: clip as 截断: {entry.msgstr[:80]!r}")
    assert not bad, "\n".join(bad)


#: English that means the addition problems the model solves (not DPO's summed log-probabilities).
ADDITION_PROBLEMS = re.compile(
    r"held-out sums|sums right|knows sums|lose the sums|fewer (held-out )?sums|\(sums,|(refusals|identity),? "
    r"(and )?sums|skills?: (held-out )?sums|09: sums|sums, (identity|stories|\"who)|sums and (reply|identity|the)")


def test_addition_problems_are_jiafati_and_sum_is_qiuhe():
    """The addition problems the model solves are 加法题 (加法); 求和 is the summation (DPO's summed
    log-probabilities, a sum over tokens), so 求和题 / 求和问题 / 留出求和 never appear."""
    bad = []
    for name, entry in all_catalog_entries():
        if ADDITION_PROBLEMS.search(" ".join(entry.msgid.split())) and "加法" not in entry.msgstr:
            bad.append(f"{name}: the sums the model answers are 加法题: {entry.msgstr[:90]!r}")
        for m in re.finditer(r"求和(题|问题)|留出的?求和|(拒答|身份|故事)[、和与]求和|求和[、和与](身份|故事|拒答)|"
                             r"会求和|答对的求和|保留的求和|求和正确|丢掉了求和|对求和已断言", entry.msgstr):
            bad.append(f"{name}: {m.group(0)!r} (addition problems are 加法题)")
    assert not bad, "\n".join(bad)


def test_preference_replies_are_youxuan_and_liexuan():
    """A pair's chosen and rejected replies are 优选回答 / 劣选回答 in every catalog (the checks'
    case labels too), never 被选中的 / 被拒绝的, and never left in English outside code and glosses."""
    bad = []
    for name, entry in all_catalog_entries():
        english = re.sub(r"`[^`]*`", "", " ".join(entry.msgid.split()))
        if re.search(r"\bchosen\b", english) and re.search(r"\brejected\b", english):
            if re.search("被选中的|被拒绝的", entry.msgstr) or not ("优选" in entry.msgstr and "劣选" in entry.msgstr):
                bad.append(f"{name}: chosen/rejected as 优选/劣选: {entry.msgstr[:90]!r}")
        prose = re.sub(r"`[^`]*`|\$[^$]*\$|\([^)]*\)|（[^）]*）|\{[^}]*\}", "", entry.msgstr)
        if re.search(r"\b(chosen|rejected)\b", prose):
            bad.append(f"{name}: chosen/rejected left in English: {entry.msgstr[:90]!r}")
    assert not bad, "\n".join(bad)


def test_one_direction_word_per_push():
    """"Push the chosen reply up and the rejected one down" says each direction once (not 压低…往下压)."""
    doubled = re.compile(r"压低[^，。；：]{0,12}往下压|往下压[^，。；：]{0,12}压低|抬高[^，。；：]{0,12}往上(抬|推)|"
                         r"往上(抬|推)[^，。；：]{0,12}抬高|降低[^，。；：]{0,12}往下降|提高[^，。；：]{0,12}往上提")
    bad = [f"{name}: {m.group(0)!r}" for name, entry in all_catalog_entries() for m in doubled.finditer(entry.msgstr)]
    assert not bad, "\n".join(bad)


def test_the_drill_line_has_one_name_and_it_is_not_lianxi():
    """练习 is the exercise (练习 N.M); the addition drills of chapters 08 to 12 are 算式 (a drill line
    is 一行算式 / 算式行), in every catalog."""
    bad = []
    for name, entry in all_catalog_entries():
        if re.search(r"\bdrill", entry.msgid):
            if "算式" not in entry.msgstr or re.search(r"练习(?! ?\d)", entry.msgstr):
                bad.append(f"{name}: a drill is 算式 (练习 is the exercise): {entry.msgstr[:90]!r}")
    assert not bad, "\n".join(bad)


def test_in_place_only_where_the_english_says_so():
    """就地 (in place) only translates "in place" / "in-place": a hint that asks for a new dict must
    not say 就地."""
    bad = [f"{name}: {entry.msgid[:60]!r} -> {entry.msgstr[:60]!r}" for name, entry in all_catalog_entries()
           if "就地" in entry.msgstr and not re.search(r"in[- ]place", entry.msgid, re.I)]
    assert not bad, "\n".join(bad)


def test_to_half_split_messages_read_as_chinese():
    """The to_half_split check (Exercise 2.5), failing in Chinese: its case names the head layout in a
    sentence (8 个查询头共享 4 个 KV 头, not a bare ratio) and its hint asks for a new dict."""
    import torch

    from minimind_ref import i18n as mi18n
    from minimind_ref.checks import ch02
    from minimind_ref.checks.core import ExerciseError

    def drops_a_key(weights, head_dim):
        return {k: v.clone() for k, v in weights.items() if k != "o_proj.weight"}

    mi18n.set_language("zh_CN")
    try:
        with pytest.raises(ExerciseError) as err:
            ch02.check_to_half_split(drops_a_key)
    finally:
        mi18n.set_language(None)
    message = str(err.value)
    assert "个查询头共享" in message and "新字典" in message and "就地" not in message, message
    assert " : " not in message and "query" not in message, message


def test_one_word_for_shipped():
    """'shipped' (a stage, a file, a config that comes with the package) is 随包提供 everywhere."""
    bad = [f"{name}: {entry.msgid[:60]!r} -> {entry.msgstr[:60]!r}" for name, entry in all_catalog_entries()
           if re.search(r"\bship(s|ped)?\b", entry.msgid) and not name.startswith("checks")
           and "随包提供" not in entry.msgstr and "本包提供" not in entry.msgstr and "随课程提供" not in entry.msgstr]
    assert not bad, "\n".join(bad)
    assert not [n for n, e in all_catalog_entries() if re.search("附带的|随课程附带|课程包自带", e.msgstr)]


def _bold_markers_ok(text: str) -> list:
    """CommonMark's rule for `**`: an opening marker before punctuation needs whitespace or punctuation
    in front of it, a closing one after punctuation needs whitespace or punctuation after it."""
    import unicodedata

    def punct(ch):
        return bool(ch) and (unicodedata.category(ch).startswith("P") or (ch.isascii() and not ch.isalnum() and not ch.isspace()))

    def space(ch):
        return ch == "" or ch.isspace()

    bad, pos = [], 0
    while True:
        a = text.find("**", pos)
        b = text.find("**", a + 2) if a >= 0 else -1
        if b < 0:
            return bad
        before, first, last, after = text[a - 1:a], text[a + 2], text[b - 1], text[b + 2:b + 3]
        if space(first) or (punct(first) and not (space(before) or punct(before))):
            bad.append(text[max(0, a - 8):b + 10])
        if space(last) or (punct(last) and not (space(after) or punct(after))):
            bad.append(text[max(0, a - 8):b + 10])
        pos = b + 2


def test_bold_in_chinese_renders_and_has_no_needless_spaces():
    """Bold text sits in Chinese without spaces around it (as in most chapters), except where
    CommonMark needs one for the marker to count (bold that starts or ends with punctuation)."""
    cjk = "\u4e00-\u9fff"
    needless = re.compile(rf"[{cjk}] \*\*[^*\s\W]|[^*\s\W]\*\* [{cjk}]")
    bad = []
    for name, entry in all_catalog_entries():
        if name.startswith("checks"):
            continue
        bad += [f"{name}: marker not recognised: {t!r}" for t in _bold_markers_ok(entry.msgstr)]
        bad += [f"{name}: needless space: {m.group(0)!r}" for m in needless.finditer(entry.msgstr)]
    assert not bad, "\n".join(bad[:40])


#: Words a stub message may keep in English: the names the exercise itself uses.
STUB_TERMS = {"token", "softmax", "top", "k", "p", "SwiGLU", "KV", "scatter", "add", "reshape", "cos", "sin",
              "alpha", "f", "P", "R", "scale", "B", "A", "x", "y", "inf", "dim", "mean", "sum", "z", "Parameter"}


def test_chinese_stub_messages_have_no_untranslated_english():
    """The stubs of student/zh say 练习 N.M：<Chinese> (the text of a '# BEGIN SOLUTION: ...' marker is a
    message of the chapter's catalog); identifiers (with _ or digits) and the exercise's own terms may
    stay as written, English prose may not."""
    stub = re.compile(r'raise NotImplementedError\("(?P<msg>[^"]*)"\)')
    bad, count = [], 0
    for path in sorted((ROOT / "student" / "zh").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for m in stub.finditer(cell.source if cell.cell_type == "code" else ""):
                count += 1
                message = m.group("msg")
                assert re.match(r"练习 \d+\.\d+(：|$)", message), message
                code_names = set(re.findall(r"[A-Za-z_]\w*", cell.source.replace(m.group(0), "")))
                words = [w for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", message)
                         if not re.search(r"[_0-9]", w) and w not in STUB_TERMS and w not in code_names]
                if words or not CJK.search(message.split("：", 1)[-1]):
                    bad.append(f"{path.name}: {message!r}: {words}")
    assert count >= 46 and not bad, "\n".join(bad)


def test_stub_texts_are_extracted_and_translated():
    """The markers' texts are messages of the chapter catalogs, located at their code cell."""
    messages = dict(i18n.source_messages(ROOT / "notebooks" / "01_normalization.ipynb"))
    marker = "rms_norm(x, weight, eps) -> a tensor shaped like x"
    assert marker in messages and messages[marker].startswith("01_normalization.ipynb:")
    table = i18n.load_table(LANG, "01_normalization")
    assert table[marker] == "rms_norm(x, weight, eps) -> 与 x 形状相同的张量"


# ----------------------------------------------------------------------------- the glossary, term by term (issue 45)
#: CONTRIBUTING's glossary as (term, English that means it, Chinese a translation must hold, Chinese it
#: must not hold there). Every catalog entry, the chapters', the pages' and the check messages' (checks.po),
#: whose English (code spans left out) holds the term is checked. The specialised tests above tell the
#: longer stories (addition problems, chosen/rejected, retired wordings looked for everywhere).
GLOSSARY = [
    ("chosen / rejected reply", r"\bchosen\b.*\brejected\b|\brejected\b.*\bchosen\b", r"优选[\s\S]*劣选|劣选[\s\S]*优选",
     r"被选中的|被拒绝的"),
    ("refusal", r"\brefusals?\b", r"拒答", r"拒绝回答"),
    ("prompt", r"\bprompts?\b", r"提示词", None),
    ("clip", r"\bclip(s|ped|ping)?\b", r"裁剪", r"截断"),
    ("query head", r"\bquery heads?\b", r"查询头", r"query 头"),
    ("GRPO's second normalisation", r"\bnormali[sz]es (them )?again\b|\bbatch normali[sz]ation\b", r"全批次优势归一化|再[^。]*归一化",
     r"(?<!全)批次(?!优势)归一化"),
    ("addition problems", ADDITION_PROBLEMS.pattern, r"加法", r"求和(题|问题)|留出的?求和|并非求和|错误求和"),
    ("drill / calculator line", r"\bdrill lines?\b|\bcalculator lines?\b", r"算式", r"练习(?! ?\d)|计算器行"),
    ("turn of a conversation", r"\b(assistant|system|user|tool) turns?\b|\bend of turn\b|\bends? (the|its) turn\b",
     r"轮", r"(?<!返)回合"),
    ("reply", r"\brepl(y|ies)\b", None, r"回复"),
    ("held-out", r"\bheld-out\b", r"留出", None),
    ("float path", r"\bfloat paths?\b", r"浮点路径", None),
    ("lineage", r"\blineages?\b", r"谱系", None),
    ("percentage points", r"\bpercentage points?\b", r"百分点", None),
    ("citation of a paper", r"\bet al\.,? \(?\d{4}", r"等，\d{4}|等（\d{4}", r"\bet al\.,? \(?\d{4}"),
]


@pytest.mark.parametrize("term, english, required, forbidden", GLOSSARY, ids=[g[0] for g in GLOSSARY])
def test_each_glossary_term_has_one_translation_in_every_catalog(term, english, required, forbidden):
    english_re = re.compile(english, re.I)
    bad = []
    for name, entry in all_catalog_entries():
        prose = re.sub(r"`[^`]*`|\"[^\"]*\"", "", " ".join(entry.msgid.split()))  # code and quoted labels
        if not english_re.search(prose):
            continue
        if required and not re.search(required, entry.msgstr):
            bad.append(f"{name}: {term!r} is {required!r}: {entry.msgid[:70]!r} -> {entry.msgstr[:70]!r}")
        if forbidden:
            bad += [f"{name}: {m.group(0)!r} ({term}: not {forbidden!r}) in {entry.msgstr[:80]!r}"
                    for m in re.finditer(forbidden, re.sub(r"`[^`]*`", "", entry.msgstr))]
    assert not bad, "\n".join(bad)


def test_the_glossary_table_and_contributing_name_the_same_terms():
    contributing = " ".join((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8").split())
    glossary = contributing[contributing.index("**Glossary**"):contributing.index("**Check messages.**")]
    for chinese in ("优选回答", "拒答", "提示词", "裁剪", "查询头", "全批次优势归一化", "加法题", "算式行", "轮次", "回答",
                    "留出", "浮点路径", "谱系", "百分点", "X 等，YYYY"):
        assert chinese in glossary, f"CONTRIBUTING's glossary does not name {chinese}"


# ----------------------------------------------------------------------------- check messages, rendered (issue 45)
def _chinese_failure(check, wrong):
    """The message a check prints in Chinese for a planted mistake."""
    from minimind_ref import i18n as mi18n
    from minimind_ref.checks.core import ExerciseError

    mi18n.set_language("zh_CN")
    try:
        with pytest.raises(ExerciseError) as err:
            check(wrong)
    finally:
        mi18n.set_language(None)
    return str(err.value)


def _translation(msgid_part: str) -> str:
    """The Chinese of the one check message whose English contains ``msgid_part``."""
    from minimind_ref.i18n import LOCALE_DIR

    found = [e for e in polib.pofile(str(LOCALE_DIR / LANG / "LC_MESSAGES" / "checks.po"))
             if msgid_part in e.msgid and not e.obsolete]
    assert len(found) == 1, f"{len(found)} check messages contain {msgid_part!r}"
    assert found[0].msgstr and not found[0].fuzzy, f"{found[0].msgid!r} has no reviewed translation"
    return found[0].msgstr


def _weights_unchanged(weights, head_dim):
    return {k: v.clone() for k, v in weights.items()}


def _qk_attention_without_cache():
    import torch

    from minimind_ref.attention import Attention
    from minimind_ref.checks import ch03

    class DropsTheCache(torch.nn.Module):
        """Right on a prefill; a cache's keys and values are left out (a layer of its own: the check switches
        minimind_ref.Attention's forward off while the learner's layer runs)."""

        def __init__(self, config):
            super().__init__()
            ref = Attention(config)
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj
            self.q_norm, self.k_norm = ref.q_norm, ref.k_norm
            self.n_heads, self.n_kv_heads, self.n_rep, self.head_dim = ref.n_heads, ref.n_kv_heads, ref.n_rep, ref.head_dim

        def forward(self, x, cos, sin, attention_mask=None, past_key_value=None):
            return ch03._qk_variant(self, x, cos, sin, attention_mask, None)

    return DropsTheCache


#: (check, planted mistake, the English of the message the mistake must print). Each case prints the
#: Chinese failure (run pytest with -s to read it) and asserts that the message's own translation is in it.
CHECK_MESSAGES = [
    ("ch02.check_to_half_split", _weights_unchanged, "the weights returned unchanged"),
    ("ch03.check_qk_norm_attention", _qk_attention_without_cache, "cache of 5 + 1 new token"),
]


@pytest.mark.parametrize("check, wrong, english", CHECK_MESSAGES, ids=[c[2] for c in CHECK_MESSAGES])
def test_each_named_check_message_is_printed_in_chinese(check, wrong, english):
    import importlib

    module, function = check.split(".")
    fn = getattr(importlib.import_module(f"minimind_ref.checks.{module}"), function)
    planted = wrong() if wrong is _qk_attention_without_cache else wrong
    message = _chinese_failure(fn, planted)
    print(f"\n{check}, {english!r}:\n{message}")
    assert _translation(english) in message, message
    assert english not in message, "the English message leaked into the Chinese failure"
