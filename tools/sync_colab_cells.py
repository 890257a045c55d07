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
bound), so nothing is downgraded and Colab's torch and transformers stay; its comment says so, and
``tools/current_releases.py`` proves it with the newest releases. When pip fails, the cell prints
pip's last lines and says what to set, instead of a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXTRA = "course"

TEMPLATE = '''\
# Colab only: install the course package and what the chapters import. Does nothing anywhere else.
# pip keeps what Colab has: it adds only what is missing or older than the course needs (torch>=2.1,
# numpy, tokenizers>=0.15, tqdm, matplotlib, ipywidgets>=8), never downgrades a package, and leaves
# Colab's torch and transformers as they are (no chapter needs transformers).
# Written by tools/sync_colab_cells.py from repository.url in the book's _config.yml.
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


def colab_cell(repo_url: Optional[str] = None) -> str:
    """The exact source of the first code cell of every chapter."""
    return TEMPLATE.format(repo_url=repo_url or repository_url(), extra=EXTRA)


def first_code_cell(nb: nbformat.NotebookNode):
    return next(cell for cell in nb.cells if cell.cell_type == "code")


def stale(notebooks: Path = NOTEBOOKS, repo_url: Optional[str] = None) -> List[Path]:
    expected = colab_cell(repo_url)
    return [p for p in sorted(notebooks.glob("*.ipynb"))
            if first_code_cell(nbformat.read(p, as_version=4)).source != expected]


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
        first_code_cell(nb).source = expected
        nbformat.write(nb, p)
        print(f"wrote the Colab cell of {p.relative_to(ROOT)}")
    print(f"Colab cells: {len(list(NOTEBOOKS.glob('*.ipynb')))} notebooks point at {repository_url()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
