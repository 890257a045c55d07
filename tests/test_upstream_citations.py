"""Every citation of upstream MiniMind in the course is one that ``tools/check_upstream_citations.py``
verified in upstream's git history, and the Chinese edition carries each through unchanged (issue 34).

No network and no clone of upstream: the text is compared with the record the checker wrote
(``tools/upstream_citations.json``). When this fails after an edit, run the checker with a clone of
upstream (its docstring says how) and commit the record it writes.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_upstream_citations as cuc  # noqa: E402

FOUND = cuc.scan(ROOT)
RECORD = cuc.load_record()


def test_every_citation_in_the_text_is_verified_in_the_record():
    problems = cuc.compare_with_record(FOUND, RECORD)
    assert not problems, ("the text and tools/upstream_citations.json disagree (run tools/check_upstream_citations.py "
                          "--upstream <clone of jingyaogong/minimind> and commit the record):\n" + "\n".join(problems[:40]))


def test_the_record_holds_only_verified_citations_and_names_the_checked_tree():
    assert RECORD["citations"], "the record is empty"
    assert {e["status"] for e in RECORD["citations"]} == {"verified"}
    assert RECORD["counts"] == {"verified": len(RECORD["citations"])}
    master = RECORD["upstream_branches"].get("refs/heads/master") or RECORD["upstream_branches"].get("refs/remotes/origin/master")
    assert master and re.fullmatch(r"[0-9a-f]{40}", master)
    for entry in RECORD["citations"]:
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit_sha"]) and entry["commit_sha"].startswith(entry["citation"][:7])


def test_the_book_cites_both_pinned_commits_with_lines():
    cited = Counter(o.commit for o in FOUND if o.kind == "citation" and o.file.startswith("book/"))
    assert cited["c090b69"] >= 10 and cited["d65ef2c"] >= 10, cited


# ----------------------------------------------------------------------------- the finder itself
def _find(text: str):
    return cuc.find_in_text(text, "x.md", lambda _offset: "top")


def test_the_finder_reads_the_citation_form():
    found = _find('See `c090b69:model/model_minimind.py:196 "past_key_value is None"` and '
                  '`d65ef2c:dataset/lm_dataset.py:65-66`, in a table `c090b69:model/tokenizer_config.json:42 "<\\|im_end\\|>"`.')
    assert [(o.commit, o.path, o.lines, o.fragment) for o in found] == [
        ("c090b69", "model/model_minimind.py", (196, 196), "past_key_value is None"),
        ("d65ef2c", "dataset/lm_dataset.py", (65, 66), None),
        ("c090b69", "model/tokenizer_config.json", (42, 42), "<|im_end|>")]


def test_the_finder_checks_commits_named_alone_and_their_dates():
    found = _find("c090b69 and d65ef2c alone need nothing; 3a5aba8 (2026-01-17) and 101d7df, dated 2026-03-24, do; "
                  "so does 1279a61. Not `c090b69_form` nor a digest 0123456789abcdef0123.")
    assert [(o.kind, o.text, o.date) for o in found] == [
        ("mention", "3a5aba8 2026-01-17", "2026-01-17"), ("mention", "101d7df 2026-03-24", "2026-03-24"),
        ("mention", "1279a61", None)]
    found = _find("c090b69 (2026-01-15) is pinned, but its date is checked too.")
    assert [o.text for o in found] == ["c090b69 2026-01-15"]


def test_a_changed_paragraph_or_a_new_citation_fails_the_comparison():
    text = "Intro.\n\nThe rule: `c090b69:model/model_minimind.py:196`.\n"
    found = _find(text)
    record = {"citations": [dict(o.to_json(), status="verified") for o in found]}
    assert cuc.compare_with_record(found, record) == []
    changed = _find(text.replace("The rule:", "The old rule:"))
    assert "older than the text" in cuc.compare_with_record(changed, record)[0]
    extra = _find(text + "\nAlso `d65ef2c:model/model_minimind.py:125`.\n")
    assert any("not in the record" in p for p in cuc.compare_with_record(extra, record))
    unverified = {"citations": [dict(o.to_json(), status="missing lines") for o in found]}
    assert "missing lines" in cuc.compare_with_record(found, unverified)[0]


# ----------------------------------------------------------------------------- the Chinese edition
SPAN = re.compile(r"`[0-9a-f]{7}:[^`]+`|https://github\.com/jingyaogong/minimind/(?:tree|blob|commit)/[0-9a-f]{7,40}[^\s)\]>]*")


def _catalogs():
    from minimind_ref.i18n import LOCALE_DIR

    return sorted((ROOT / "locales" / "zh_CN" / "LC_MESSAGES").glob("*.po")) + [LOCALE_DIR / "zh_CN" / "LC_MESSAGES" / "checks.po"]


@pytest.mark.parametrize("path", _catalogs(), ids=lambda p: p.name)
def test_the_chinese_catalogs_carry_every_citation_unchanged(path):
    bad = []
    for entry in polib.pofile(str(path)):
        if entry.obsolete or not entry.msgstr or "fuzzy" in entry.flags:
            continue
        english = Counter(SPAN.findall(entry.msgid))
        chinese = Counter(SPAN.findall(entry.msgstr))
        if english != chinese:
            bad.append(f"{entry.msgid[:70]!r}: {sorted(english - chinese)} missing, {sorted(chinese - english)} added")
    assert not bad, "\n".join(bad)


def test_the_span_pattern_sees_citations_in_a_catalog_entry():
    assert SPAN.findall('见 `c090b69:model/model_minimind.py:196 "past_key_value is None"` 与 '
                        '[minimind-3](https://github.com/jingyaogong/minimind/tree/d65ef2c00ebc6082f9df11541e1b191655eddb00)。') == [
        '`c090b69:model/model_minimind.py:196 "past_key_value is None"`',
        "https://github.com/jingyaogong/minimind/tree/d65ef2c00ebc6082f9df11541e1b191655eddb00"]


# ----------------------------------------------------------------------------- citations a reader can open (issue 45)
import link_citations  # noqa: E402

SHA = "c090b6900000000000000000000000000000beef"
COMMITS = {"c090b69": SHA}


def test_the_finder_reads_a_linked_citation_once_with_its_url():
    url = f"https://github.com/jingyaogong/minimind/blob/{SHA}/model/model_minimind.py#L196"
    found = _find(f'See [`c090b69:model/model_minimind.py:196 "past_key_value is None"`]({url}).')
    assert [(o.kind, o.text, o.extra.get("url")) for o in found] == [
        ("citation", 'c090b69:model/model_minimind.py:196 "past_key_value is None"', url)]


def test_a_link_that_disagrees_with_its_text_fails_the_comparison():
    good = f"https://github.com/jingyaogong/minimind/blob/{SHA}/model/model_minimind.py#L190-L196"
    text = f"The rule: [`c090b69:model/model_minimind.py:190-196`]({good}).\n"
    found = _find(text)
    record = {"citations": [dict(o.to_json(), status="verified", commit_sha=SHA) for o in found]}
    assert cuc.compare_with_record(found, record) == []
    for wrong in (good.replace("#L190-L196", "#L190-L197"), good.replace("model_minimind.py", "model_lora.py"),
                  good.replace(SHA, "d65ef2c" + SHA[7:])):
        bad = _find(text.replace(good, wrong))
        assert any("links to" in p for p in cuc.compare_with_record(bad, record)), wrong
        assert cuc.link_problem(bad[0], SHA), wrong
    assert cuc.link_problem(found[0], SHA) is None


def test_link_citations_links_every_span_once_and_leaves_code_and_comments():
    text = ("Prose `c090b69:model/model_minimind.py:196` and in a table | `c090b69:model/tokenizer_config.json:42 "
            "\"<\\|im_end\\|>\"` |\n<!-- `c090b69:a.py:1` -->\n```\n`c090b69:b.py:2`\n```\n")
    problems = []
    linked = link_citations.link_text(text, COMMITS, problems, "x.md")
    assert len(problems) == 2 and all("is not a link" in p for p in problems)
    assert (f"[`c090b69:model/model_minimind.py:196`](https://github.com/jingyaogong/minimind/blob/{SHA}/"
            "model/model_minimind.py#L196)") in linked
    assert f"/blob/{SHA}/model/tokenizer_config.json#L42)" in linked
    assert "<!-- `c090b69:a.py:1` -->" in linked and "```\n`c090b69:b.py:2`\n```" in linked
    again = []
    assert link_citations.link_text(linked, COMMITS, again, "x.md") == linked and again == []  # idempotent
    found = _find(linked)
    assert [o.kind for o in found] == ["citation"] * 4 and sum("url" in o.extra for o in found) == 2


def test_link_citations_corrects_a_link_that_disagrees():
    wrong = f"[`c090b69:x.py:5-9`](https://github.com/jingyaogong/minimind/blob/{SHA}/x.py#L5)"
    problems = []
    fixed = link_citations.link_text(wrong, COMMITS, problems, "x.md")
    assert fixed.endswith("/x.py#L5-L9)") and "links to" in problems[0]
    with pytest.raises(SystemExit, match="not in tools/upstream_citations.json"):
        link_citations.link_text("`abcdef1:x.py:1`", COMMITS)


class _Upstream:
    """A commit authored one day and committed the next, for `verify` without a clone."""

    def resolve(self, commit):
        return commit + "0" * 33

    def in_history(self, sha):
        return True

    def dates(self, sha):
        return "2026-03-24", "2026-03-25"


def test_a_date_after_a_commit_says_which_when_author_and_committer_differ():
    for text, status in [("101d7df, dated 2026-03-24 in git", "ambiguous date"),
                         ("101d7df (2026-03-25)", "ambiguous date"),
                         ("101d7df, authored 2026-03-24 and committed 2026-03-25 in git", "verified"),
                         ("101d7df, committed 2026-03-25", "verified"),
                         ("101d7df, authored 2026-03-25", "wrong date"),
                         ("101d7df, authored 2026-03-24 and committed 2026-03-26", "wrong date")]:
        (occ,) = _find(text)
        assert cuc.verify(occ, _Upstream()).status == status, (text, occ.detail)


def test_every_citation_a_reader_sees_is_a_link_to_its_text():
    """Issue 45: the pages, the chapters' markdown and the Chinese catalogs carry every citation as a link to
    upstream's file at that commit and lines (``tools/link_citations.py`` writes them; this reads, never writes)."""
    problems = link_citations.run(link_citations.source_files(), link_citations.known_commits(), write=False)
    assert not problems, ("citations a reader cannot open, or links that disagree with their text; run "
                          "tools/link_citations.py, then the checker:\n" + "\n".join(problems[:20]))
