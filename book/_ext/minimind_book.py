"""Sphinx glue for "MiniMind from Zero" (loaded through ``sphinx.local_extensions`` in _config.yml).

1. Colab opens the student edition. sphinx-book-theme builds a chapter's Colab link from the
   page's own path (``notebooks/NN_topic.ipynb``, the edition *with* solutions). After the theme
   has added its launch buttons, this rewrites the Colab entry of every ``notebooks/*`` page to
   ``student/NN_topic.ipynb`` (``minimind_student_dir``). A chapter without a student edition is
   a build warning, hence an error under ``-W``: run ``make student``.
2. Offline widgets. On pages with ipywidgets, inlines ``widgets_offline.js`` between RequireJS and
   the ipywidgets HTML manager (``nb_ipywidgets_js`` in _config.yml): it points the manager's font files at ``_static/html-manager`` and gives it the
   MathJax 2 ``MathJax.Hub.Queue`` it calls to typeset widget labels (the site runs MathJax 3).
3. Clean pages. Jupyter Book 1.0.4 registers sphinx-thebe's and sphinx-togglebutton's inline
   scripts twice (``const THEBE_JS_URL`` declared twice is a console error on every page); this
   drops exact duplicates from each page's scripts. It also sets pydata-sphinx-theme's
   ``default_mode`` (left empty, the theme logs "Got invalid theme mode" in the console).
4. Language switch. ``minimind_language_links`` (a list of ``[label, lang, root]``; ``root`` is the
   other site's root relative to this one's, ``zh/`` from the English site, ``../`` from the
   Chinese one) puts a link to the same page in the other language at the top of every page.
5. Execution switch. ``_config.yml`` executes notebooks (``make book``); the environment variable
   ``MINIMIND_BOOK_EXECUTE`` (``off``, ``auto``, ``cache``, ``force``, ``inline``) overrides that,
   so the test build renders the outputs committed in the notebooks (``off``) and stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ConfigError
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

EXECUTE_ENV = "MINIMIND_BOOK_EXECUTE"
EXECUTION_MODES = ("off", "auto", "cache", "force", "inline")
CHAPTER_DIR = "notebooks"
WIDGETS_JS = Path(__file__).with_name("widgets_offline.js")


def override_execution(app: Sphinx, config: Config) -> None:
    mode = os.environ.get(EXECUTE_ENV, "").strip()
    if not mode:
        return
    if mode not in EXECUTION_MODES:
        raise ConfigError(f"{EXECUTE_ENV}={mode!r}: expected one of {', '.join(EXECUTION_MODES)}")
    config.nb_execution_mode = mode
    LOGGER.info(f"[minimind_book] notebook execution mode from {EXECUTE_ENV}: {mode}")


def set_theme_default_mode(app: Sphinx, config: Config) -> None:
    config.html_context.setdefault("default_mode", "light")


def _script_key(js: Any) -> tuple:
    attributes = getattr(js, "attributes", {}) or {}
    # Inline scripts come as filename None or "" depending on the path that registered them.
    return (getattr(js, "filename", None) or "", getattr(js, "priority", None),
            tuple(sorted((str(k), str(v)) for k, v in attributes.items())))


def tidy_scripts(app: Sphinx, pagename: str, templatename: str, context: Dict[str, Any], doctree: Optional[Any]) -> None:
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen = set()
    unique = []
    for js in scripts:
        key = _script_key(js)
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique
    manager = [i for i, js in enumerate(scripts) if "html-manager/embed-amd.js" in str(getattr(js, "filename", None) or "")]
    if manager:
        # Appended last by add_js_file; move it right in front of the manager (same priority, and
        # Sphinx's sort by priority is stable, so it stays between RequireJS and the manager).
        app.add_js_file(None, body=WIDGETS_JS.read_text(encoding="utf-8"), priority=getattr(scripts[manager[0]], "priority", 500))
        scripts.insert(manager[0], scripts.pop())


def student_colab_url(colab_url: str, repo_url: str, branch: str, student_path: str) -> str:
    """``https://colab.research.google.com/github/ORG/REPO/blob/BRANCH/student/NN_topic.ipynb``."""
    org_repo = repo_url.rstrip("/").split("github.com/", 1)[-1]
    org_repo = org_repo[:-4] if org_repo.endswith(".git") else org_repo
    return f"{colab_url.rstrip('/')}/github/{org_repo}/blob/{branch}/{student_path}"


def point_colab_at_student(
    app: Sphinx, pagename: str, templatename: str, context: Dict[str, Any], doctree: Optional[Any]
) -> None:
    if not pagename.startswith(CHAPTER_DIR + "/"):
        return
    theme = app.config.html_theme_options
    colab_url = theme.get("launch_buttons", {}).get("colab_url", "")
    repo_url = theme.get("repository_url", "")
    if not colab_url or not repo_url:
        return
    name = pagename.split("/", 1)[1] + ".ipynb"
    student_path = f"{app.config.minimind_student_dir.strip('/')}/{name}"
    if not (Path(app.srcdir) / student_path).is_file():
        LOGGER.warning(
            f"[minimind_book] {pagename}: no student edition at {student_path} for the Colab button (run `make student`)",
            location=pagename,
        )
        return
    url = student_colab_url(colab_url, repo_url, theme.get("repository_branch") or "main", student_path)
    found = False
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        for button in group.get("buttons", []):
            if button.get("text") == "Colab":
                button["url"] = url
                button["tooltip"] = "Open the student edition in Colab"
                found = True
    if not found:
        LOGGER.warning(f"[minimind_book] {pagename}: sphinx-book-theme added no Colab button to rewrite", location=pagename)


def language_switch_html(pagename: str, links: Any) -> str:
    """The links to ``pagename`` in the other languages, relative to the page itself."""
    up = "../" * pagename.count("/")
    anchors = [f'<a href="{up}{root}{pagename}.html" hreflang="{lang}" lang="{lang}">{label}</a>'
               for label, lang, root in links]
    return f'<p class="minimind-language-switch">{" · ".join(anchors)}</p>\n' if anchors else ""


def add_language_switch(
    app: Sphinx, pagename: str, templatename: str, context: Dict[str, Any], doctree: Optional[Any]
) -> None:
    links = app.config.minimind_language_links
    if links and "body" in context:
        context["body"] = language_switch_html(pagename, links) + context["body"]


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_config_value("minimind_student_dir", "student", "html")
    app.add_config_value("minimind_language_links", [], "html")
    app.connect("html-page-context", add_language_switch)
    app.connect("config-inited", override_execution)
    app.connect("config-inited", set_theme_default_mode)
    # myst-nb adds a page's widget scripts at the default priority (500); run after it.
    app.connect("html-page-context", tidy_scripts, priority=900)
    # sphinx-book-theme adds the launch buttons at priority 501; run after it.
    app.connect("html-page-context", point_colab_at_student, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
