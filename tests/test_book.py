"""The website: table of contents, configuration, the build itself, and a real browser on it.

The slow tests build the book from the outputs stored in the notebooks
(``MINIMIND_BOOK_EXECUTE=off``, warnings are errors) into ``_build/html`` and open the chapter 01
page in headless Chromium (``tools/browser.py``), saving a screenshot under
``_build/screenshots/``; then the Chinese edition (``tools/build_zh.py``) into ``_build/html/zh``
and its chapter 01 page in the browser. ``make test`` installs Chromium and fetches ``_vendor/`` first.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHAPTERS = ["01_normalization", "02_rope", "03_attention", "04_feedforward",
            "05_architecture", "06_kv_cache", "07_moe", "08_training",
            "09_sft", "10_lora", "11_dpo", "12_grpo"]
BROWSER_PAGE = "notebooks/01_normalization"
REQUIRED_EXCLUDES = ["_build", ".venv", ".colab-venv", ".current-venv", ".floors-venv", ".pytest_cache", "minimind_ref", "tests", "student", ".helpers", "node_modules",
                     "_vendor", "tools", "benchmarks", "README.md", "CONTRIBUTING.md", "requirements"]
CDN_HOSTS = ("cdn.jsdelivr.net", "cdnjs.cloudflare.com", "unpkg.com", "mathjax.org", "polyfill.io")


def load_yaml(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))


def repository() -> tuple:
    """(https://github.com/ORG/REPO, ORG/REPO, branch) from _config.yml: the one place for the URL."""
    config = load_yaml("_config.yml")
    url = str(config["repository"]["url"]).rstrip("/")
    url = url[:-4] if url.endswith(".git") else url
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)", url)
    assert match, f"_config.yml: repository.url must be https://github.com/ORG/REPO, got {url!r}"
    return url, match.group(1), str(config["repository"].get("branch") or "main")


def colab_prefix() -> str:
    """Where the site's Colab buttons point, derived from _config.yml (launch_buttons.colab_url and
    repository.url/branch), not typed here: a fork that changes the repository gets its own links."""
    config = load_yaml("_config.yml")
    _, org_repo, branch = repository()
    return f"{config['launch_buttons']['colab_url'].rstrip('/')}/github/{org_repo}/blob/{branch}/"


def toc_files() -> list:
    toc = load_yaml("_toc.yml")
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [entry["file"] for entry in part.get("chapters", [])]
    return files


# --- fast: the sources of the site --------------------------------------------------------------

def test_toc_order():
    toc = load_yaml("_toc.yml")
    assert toc["format"] == "jb-book" and toc["root"] == "book/welcome"
    parts = {part["caption"]: [entry["file"] for entry in part["chapters"]] for part in toc["parts"]}
    assert list(parts) == ["Start here", "Chapters", "Reference"]
    assert parts["Start here"] == ["book/how_to_use", "book/setup"]
    assert parts["Chapters"] == [f"notebooks/{name}" for name in CHAPTERS]
    assert parts["Reference"] == ["book/train_real", "book/minimind_ref", "book/minimind2_to_minimind3", "book/performance", "book/references"]


def test_every_toc_entry_exists():
    missing = [entry for entry in toc_files() if not any((ROOT / f"{entry}{ext}").is_file() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml lists pages that do not exist: {missing}"


def test_config():
    config = load_yaml("_config.yml")
    missing = [p for p in REQUIRED_EXCLUDES if p not in config["exclude_patterns"]]
    assert not missing, f"exclude_patterns lacks {missing}"
    sphinx = config["sphinx"]["config"]
    assert sphinx["html_static_path"] == ["_vendor"]
    assert sphinx["mathjax_path"] == "mathjax/tex-mml-chtml.js"
    assert list(sphinx["nb_ipywidgets_js"]) == ["requirejs/require.js", "html-manager/embed-amd.js"]
    assert config["execute"]["execute_notebooks"] in ("cache", "force")
    url, _, _ = repository()
    import sync_colab_cells

    assert sync_colab_cells.repository_url() == url, "tools/sync_colab_cells.py reads another repository URL"
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    # Every .js under a _static/ folder is auto-included by Jupyter Book: the vendored files must not be there.
    stray = [str(p.relative_to(ROOT)) for folder in ("_static", "book/_static", "notebooks/_static")
             for p in (ROOT / folder).glob("**/*.js")]
    assert not stray, f"JavaScript in a _static/ folder: {stray}"


# Pages that name the course's own repository or site (a clone command, a pip install, a Colab
# link). Other GitHub projects they cite (upstream MiniMind) are allowed by name.
REPOSITORY_PAGES = ["README.md", "book/welcome.md", "book/how_to_use.md", "book/setup.md", "CONTRIBUTING.md"]
CITED_REPOSITORIES = {"jingyaogong/minimind"}


def test_pages_name_the_configured_repository():
    """One place for the repository URL: every github.com/ORG/REPO or ORG.github.io/REPO address in
    the pages is the repository and site of _config.yml (repository.url, html.baseurl), so a fork
    that changes those two settings finds every line still naming the old ones here."""
    _, org_repo, _ = repository()
    baseurl = load_yaml("_config.yml")["html"]["baseurl"].rstrip("/")
    org, name = org_repo.split("/")
    if ".github.io" in baseurl:  # GitHub Pages (a custom domain is fine too)
        assert baseurl.lower() == f"https://{org}.github.io/{name}".lower(), (
            f"html.baseurl {baseurl} is the GitHub Pages site of another repository than {org_repo}")
    stale = []
    for page in REPOSITORY_PAGES:
        for number, line in enumerate((ROOT / page).read_text(encoding="utf-8").splitlines(), 1):
            for found in re.findall(r"(?:github\.com|colab\.research\.google\.com/github)/([\w.-]+/[\w-]+(?:\.[\w-]+)*)", line):
                found = found[:-4] if found.endswith(".git") else found
                if found != org_repo and found not in CITED_REPOSITORIES:
                    stale.append(f"{page}:{number}: github.com/{found}")
            for site in re.findall(r"https://[\w-]+\.github\.io/[\w-]+", line):
                if site.lower() != baseurl.lower():
                    stale.append(f"{page}:{number}: {site}")
    assert not stale, (f"these lines name another repository or site than _config.yml's repository.url "
                       f"(https://github.com/{org_repo}) and html.baseurl ({baseurl}):\n" + "\n".join(stale))


def test_timing_claims_come_from_the_measured_table():
    """README and the start pages quote chapter times only inside the blocks `make timings` writes
    from book/notebook_timings.json (which names the machine), never typed by hand."""
    import time_notebooks

    stale = time_notebooks.stale_pages()
    assert not stale, "run `python tools/time_notebooks.py --write`:\n" + "\n".join(stale)
    loose = []
    for page in time_notebooks.PAGES:
        text = time_notebooks.BLOCK.sub("", (ROOT / page).read_text(encoding="utf-8"))
        loose += [f"{page}: {m.group(0)!r}" for m in re.finditer(
            r"(about|in|under|within) (a|one|two|a few|\d+) (seconds?|minutes?|min)\b", text, re.I)]
    assert not loose, "timing claims outside the measured blocks:\n" + "\n".join(loose)


def test_timing_summary_names_the_machine_and_the_outliers():
    import time_notebooks

    table = {"machine": {"device": "CPU Intel(R) Xeon(R) Test, 2 threads", "cores": 2, "torch_threads": 2,
                         "torch": "2.13.0", "python": "3.11.7", "date": "2026-01-01"},
             "load_average": [0.1, 0.9], "busy": False,
             "seconds": {"01_a": 7.2, "02_b": 15.4, "03_c": 9.0, "08_training": 64.0}}
    assert time_notebooks.summary(table) == (
        "Measured on a 2-core machine (Intel(R) Xeon(R) Test; torch 2.13.0, 2 threads, 2026-01-01): each chapter "
        "ran from top to bottom in 7–15 s (chapter 08: 64 s).")
    assert "busy" in time_notebooks.summary(dict(table, busy=True))
    assert "| 08_training | 64.0 |" in time_notebooks.table_markdown(table)


def test_vendor_layout_matches_config():
    import vendor_assets

    assert vendor_assets.VENDOR == ROOT / "_vendor"
    assert set(vendor_assets.PACKAGES) == {"mathjax", "@jupyter-widgets/html-manager", "requirejs"}
    assert vendor_assets.PACKAGES["@jupyter-widgets/html-manager"][0] == "1.0.6"
    assert vendor_assets.PACKAGES["mathjax"][0].startswith("3.")


def test_reference_page_names_every_module():
    page = (ROOT / "book" / "minimind_ref.md").read_text(encoding="utf-8")
    modules = sorted(p.stem for p in (ROOT / "minimind_ref").glob("*.py") if p.stem != "__init__")
    missing = [m for m in modules if f"`minimind_ref.{m}`" not in page]
    assert not missing, f"book/minimind_ref.md does not describe {missing}"


def test_performance_page_is_in_the_book():
    text = (ROOT / "book" / "performance.md").read_text(encoding="utf-8")
    assert "make bench" in text and "book/performance" in toc_files()


def requirement_lines(text: str) -> list:
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_environment_yml_mirrors_dev_requirements():
    env = load_yaml("environment.yml")
    pip = next(dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict) and "pip" in dep)
    assert pip[0] == "torch==2.13.0", "torch==2.13.0 must come first"
    dev = requirement_lines((ROOT / "requirements" / "dev.txt").read_text(encoding="utf-8"))
    assert sorted(pip[1:]) == sorted(dev), "environment.yml's pip section differs from requirements/dev.txt"


# --- slow: build the site, then look at it ----------------------------------------------------

def _build_site() -> None:
    if not (ROOT / "_vendor" / "VERSIONS.txt").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "vendor_assets.py")], check=True, cwd=ROOT)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    env = dict(os.environ, MINIMIND_BOOK_EXECUTE="off")
    start = time.perf_counter()
    result = subprocess.run([str(jupyter_book), "build", ".", "-W", "-n", "--keep-going", "--all"],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    log = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "the book build failed (warnings are errors):\n" + "\n".join(warnings[:40]) + "\n" + log[-3000:]
    print(f"book built from stored outputs in {seconds:.1f} s")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "build_zh.py"), "--all"], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    log = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "the Chinese build failed (warnings are errors):\n" + "\n".join(warnings[:40]) + "\n" + log[-3000:]
    print(f"Chinese edition built in {time.perf_counter() - start:.1f} s")


@pytest.fixture(scope="module")
def site():
    """Build both sites once per test run. The tests that use it share an ``xdist_group``; should
    pytest-xdist still start them in two workers, a file lock makes the second wait and reuse the
    first one's build (``PYTEST_XDIST_TESTRUNUID`` is the same in every worker of a run)."""
    (ROOT / "_build").mkdir(exist_ok=True)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    marker = ROOT / "_build" / ".site-test-build"
    with open(ROOT / "_build" / ".site-test-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run_id and marker.exists() and marker.read_text() == run_id):
            marker.unlink(missing_ok=True)
            _build_site()
            if run_id:
                marker.write_text(run_id)
    return HTML


# The first line of every chapter's Colab install cell (tools/sync_colab_cells.py), which the pages hide.
COLAB_CELL_LINE = "Colab only: install the course package"

# The slow tests share one build of the site (a module fixture): under pytest-xdist they run in one
# worker (`--dist loadgroup`), never two builds into _build/html at once.
SITE = pytest.mark.xdist_group("site")


@pytest.mark.slow
@SITE
def test_site_has_every_page_and_no_cdn(site):
    for entry in toc_files():
        assert (site / f"{entry}.html").is_file(), f"no page for {entry}"
    assert (site / "_static" / "mathjax" / "tex-mml-chtml.js").is_file()
    assert (site / "_static" / "html-manager" / "embed-amd.js").is_file()
    assert (site / "_static" / "requirejs" / "require.js").is_file()
    for page in site.glob("**/*.html"):
        html = page.read_text(encoding="utf-8")
        loaded = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html)
        remote = [url for url in loaded if any(host in url for host in CDN_HOSTS)]
        assert not remote, f"{page.relative_to(site)} loads from a CDN: {remote}"


@pytest.mark.slow
@SITE
def test_colab_buttons_open_the_student_edition(site):
    chapters = [name for name in CHAPTERS if (site / "notebooks" / f"{name}.html").exists()]
    assert chapters == CHAPTERS
    prefix = colab_prefix()
    for name in chapters:
        html = (site / "notebooks" / f"{name}.html").read_text(encoding="utf-8")
        links = set(re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', html))
        assert links == {f"{prefix}student/{name}.ipynb"}, (
            f"{name}: Colab links {links}, expected the student edition under {prefix} (from _config.yml)")
        assert (ROOT / "student" / f"{name}.ipynb").is_file()
        # solutions are folded behind a click on the page
        assert "tag_hide-input" in html
        # the Colab install cell (tag remove-cell) does nothing on a page: the page does not show it
        assert COLAB_CELL_LINE not in html, f"{name}: the page shows the Colab install cell"


@pytest.mark.slow
@SITE
def test_chinese_site_has_every_page_and_links_both_ways(site):
    for entry in toc_files():
        english = (site / f"{entry}.html").read_text(encoding="utf-8")
        chinese_page = site / "zh" / f"{entry}.html"
        assert chinese_page.is_file(), f"no Chinese page for {entry}"
        chinese = chinese_page.read_text(encoding="utf-8")
        assert '<html lang="zh-CN"' in chinese, f"zh/{entry}.html does not declare lang zh-CN"
        up = "../" * entry.count("/")
        assert f'href="{up}zh/{entry}.html"' in english, f"{entry}.html has no link to its Chinese page"
        assert f'href="{up}../{entry}.html"' in chinese, f"zh/{entry}.html has no link back to the English page"
        assert re.search(r"[\u4e00-\u9fff]", chinese), f"zh/{entry}.html has no Chinese text"


@pytest.mark.slow
@SITE
def test_chinese_colab_buttons_open_the_chinese_student_edition(site):
    prefix = colab_prefix()
    for name in CHAPTERS:
        html = (site / "zh" / "notebooks" / f"{name}.html").read_text(encoding="utf-8")
        links = set(re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', html))
        assert links == {f"{prefix}student/zh/{name}.ipynb"}, f"zh/{name}: Colab links {links}"
        assert (ROOT / "student" / "zh" / f"{name}.ipynb").is_file()
        assert COLAB_CELL_LINE not in html, f"zh/{name}: the page shows the Colab install cell"


@pytest.mark.slow
@SITE
def test_chinese_page_in_a_real_browser(site):
    import browser

    fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout
    assert fonts.strip(), "no font with Chinese glyphs (the page would show empty boxes): `make test` installs fonts-wqy-zenhei"
    shot = SCREENSHOTS / "zh_01_normalization.png"
    report = browser.inspect_page(site, f"zh/{BROWSER_PAGE}.html", screenshot=shot)
    assert report["lang"] == "zh-CN", report
    assert report["mathjax_version"].startswith("3.") and report["mjx_containers"] > 0 and report["raw_tex_left"] == 0, report
    assert report["images"] > 0 and not report["broken_images"], report["broken_images"]
    assert report["colab_links"] and all(link == f"{colab_prefix()}student/zh/01_normalization.ipynb"
                                         for link in report["colab_links"]), report["colab_links"]
    assert report["language_links"] and report["language_link_status"] == [200] * len(report["language_links"]), report
    assert report["language_links"][0].endswith(f"/{BROWSER_PAGE}.html"), report["language_links"]
    assert not report["console_errors"], "console errors:\n" + "\n".join(report["console_errors"])
    assert not report["external_requests"], report["external_requests"]
    assert shot.is_file() and shot.stat().st_size > 10_000


@pytest.mark.slow
@SITE
def test_chapter_page_in_a_real_browser(site):
    import browser

    assert Path(browser.CHROMIUM).exists(), "no /usr/bin/chromium: `make test` installs it (apt-get install -y chromium)"
    shot = SCREENSHOTS / f"{BROWSER_PAGE.split('/')[-1]}.png"
    start = time.perf_counter()
    report = browser.inspect_page(site, f"{BROWSER_PAGE}.html", screenshot=shot)
    print(f"browser check of {BROWSER_PAGE} in {time.perf_counter() - start:.1f} s; screenshots: {report.get('screenshots')}")
    assert report["mathjax_version"].startswith("3."), report
    assert report["mjx_containers"] > 0, f"MathJax typeset nothing: {report}"
    assert report["raw_tex_left"] == 0, f"math left untypeset: {report}"
    assert report["images"] > 0 and not report["broken_images"], f"images that did not load: {report['broken_images']}"
    if report["widget_views"]:
        assert report["rendered_widgets"] > 0 and report["widget_controls"] > 0, f"widgets did not render: {report}"
    else:  # no saved widget state: the static figure next to the widget is the fallback
        assert report["images"] > 0
    assert report["colab_links"] and all(link == f"{colab_prefix()}student/01_normalization.ipynb"
                                         for link in report["colab_links"]), report["colab_links"]
    assert report["folded_inputs"] > 0, "exercise solutions are not folded"
    assert report["language_link_status"] == [200], f"the link to the Chinese page does not load: {report}"
    assert not report["console_errors"], "console errors:\n" + "\n".join(report["console_errors"])
    assert not report["external_requests"], f"the page requested resources off this machine: {report['external_requests']}"
    assert shot.is_file() and shot.stat().st_size > 10_000
