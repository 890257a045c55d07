"""Write the Colab install cell of every chapter from the one repository setting in ``_config.yml``.

    python tools/sync_colab_cells.py            # rewrite the first code cell of notebooks/*.ipynb
    python tools/sync_colab_cells.py --check    # exit 1 and name the notebooks that disagree

The repository URL lives in one place, ``repository.url`` of ``_config.yml``. The site's Colab
buttons are built from it (``book/_ext/minimind_book.py``), and so is the first code cell of each
chapter, which installs the course package when the notebook runs in Colab and does nothing
anywhere else. A fork that publishes the book sets ``repository.url`` (and ``html.baseurl``) to
itself, runs this tool and ``make student``, and commits.

The cell installs ``minimind-ref[course]``: the package plus everything a chapter imports besides
torch and numpy (see ``[project.optional-dependencies]`` in pyproject.toml), with pip's default
strategy, which keeps every installed package that satisfies the requirements (none has an upper
bound), so nothing is downgraded and Colab's torch and transformers stay. Its comment lists the
requirements as pyproject.toml declares them (``requirements()``) and says so; ``tools/colab_like.py``
proves with a pip dry run in Colab's published runtime that the cell changes no package Colab
preloads, and ``tools/current_releases.py`` that it changes none of the newest releases. When pip
fails, the cell prints pip's last lines and says what to set, instead of a traceback.

The cell is tagged ``remove-cell`` (``TAG``): the website (English and Chinese) does not show it, since
it does nothing there; the notebooks, the student editions (English and Chinese) and so Colab keep it.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXTRA = "course"
#: The website hides the cell (Jupyter Book's tag); notebooks and student editions keep it.
TAG = "remove-cell"

TEMPLATE = '''\
# Colab only: install the course package and what the chapters import. Does nothing anywhere else.
{requirements_comment}
# Written by tools/sync_colab_cells.py from repository.url in the book's _config.yml (the website hides it).
import subprocess, sys
if "google.colab" in sys.modules:
    SOURCE = "git+{repo_url}.git"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"minimind-ref[{extra}] @ {{SOURCE}}"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        print("\\n".join(pip.stderr.strip().splitlines()[-5:]))
        raise SystemExit(f"Could not install the course package from {{SOURCE}} (pip's last lines are above). "
                         "Check the network; if you use a fork, set repository.url in _config.yml to the fork "
                         "and run `python tools/sync_colab_cells.py` there.")'''


def repository_url(config_path: Path = ROOT / "_config.yml") -> str:
    """``repository.url`` of the book's configuration, without a trailing slash or ``.git``."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    url = str(config.get("repository", {}).get("url", "")).strip().rstrip("/")
    if not url.startswith("https://"):
        raise ValueError(f"{config_path.name}: repository.url must be an https:// URL, got {url!r}.")
    return url[:-4] if url.endswith(".git") else url


def requirements(pyproject: Path = ROOT / "pyproject.toml", extra: str = EXTRA) -> List[str]:
    """What the cell asks pip for, as pyproject.toml declares it: the package's dependencies and the extra's."""
    import tomllib

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return [r.replace(" ", "") for r in list(project["dependencies"]) + list(project["optional-dependencies"][extra])]


def colab_cell(repo_url: Optional[str] = None, pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The exact source of the first code cell of every chapter."""
    text = (f"pip keeps what Colab has: it adds only what is missing or older than the course needs "
            f"({', '.join(requirements(pyproject))}), never downgrades a package, and leaves Colab's torch and "
            "transformers as they are (no chapter needs transformers). Colab's own releases satisfy every one of "
            "these, so in Colab it changes none of them.")
    comment = "\n".join(textwrap.wrap(text, width=100, initial_indent="# ", subsequent_indent="# "))
    return TEMPLATE.format(repo_url=repo_url or repository_url(), extra=EXTRA, requirements_comment=comment)


def first_code_cell(nb: nbformat.NotebookNode):
    return next(cell for cell in nb.cells if cell.cell_type == "code")


def is_current(cell: nbformat.NotebookNode, expected: str) -> bool:
    """The cell holds ``expected`` and carries ``TAG``."""
    return cell.source == expected and TAG in cell.get("metadata", {}).get("tags", [])


def stale(notebooks: Path = NOTEBOOKS, repo_url: Optional[str] = None) -> List[Path]:
    expected = colab_cell(repo_url)
    return [p for p in sorted(notebooks.glob("*.ipynb")) if not is_current(first_code_cell(nbformat.read(p, as_version=4)), expected)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report notebooks whose Colab cell is out of date")
    args = parser.parse_args(argv)
    paths = stale()
    if args.check:
        for p in paths:
            print(f"{p.relative_to(ROOT)}: the Colab cell differs from _config.yml's repository")
        return 1 if paths else 0
    expected = colab_cell()
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        cell = first_code_cell(nb)
        cell.source = expected
        tags = cell.metadata.setdefault("tags", [])
        if TAG not in tags:
            tags.append(TAG)
        nbformat.write(nb, p)
        print(f"wrote the Colab cell of {p.relative_to(ROOT)}")
    print(f"Colab cells: {len(list(NOTEBOOKS.glob('*.ipynb')))} notebooks point at {repository_url()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
