"""Execute notebooks in place so their stored outputs are fresh (what nbval compares against).

    python tools/execute_notebook.py notebooks/01_normalization.ipynb [more.ipynb ...]

Runs each notebook top to bottom in a kernel of *this* Python (the project's .venv), from the
notebook's own folder, and reports the wall time. Fails on the first error. The kernel gets the
environment as it is: each chapter's setup cell starts with ``%matplotlib inline``, so figures
land in the outputs whatever ``MPLBACKEND`` says (tests/test_notebooks.py checks both).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

KERNEL_TIMEOUT_S = 600


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=KERNEL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name in argv:
        path = Path(name)
        seconds = execute(path)
        print(f"executed {path} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
