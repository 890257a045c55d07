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
