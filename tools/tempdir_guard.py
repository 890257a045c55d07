"""Leave nothing behind: a private temporary folder for a test run, and the check of what is left in it.

Notebooks and tests that need scratch space outside pytest's ``tmp_path`` create it with Python's
``tempfile`` under a name that starts with ``minimind_`` (chapter 08: ``minimind_ch08_...``) and
remove it when they are done. A run points ``TMPDIR`` at a fresh private folder (every kernel and
subprocess it starts inherits it, and ``tempfile`` honours it), so what is left there afterwards
was left by that run and by nothing else on the machine. ``tests/conftest.py`` does this for
``pytest`` sessions and ``tools/colab_like.py`` for the Colab-like notebook run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import List, Optional

PREFIX = "minimind_"
ENV = "MINIMIND_PRIVATE_TMPDIR"  # set while a run's private folder is in force (child processes see it)


def make_private_tempdir(label: str, parent: Optional[str] = None) -> Path:
    """A new empty folder under the system's temporary folder, named after ``label``."""
    return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=parent))


def use_tempdir(folder: Path) -> None:
    """Point this process and everything it starts from now on at ``folder`` for temporary files."""
    os.environ["TMPDIR"] = str(folder)
    os.environ[ENV] = str(folder)
    tempfile.tempdir = str(folder)


def leftovers(folder: Path, prefix: str = PREFIX) -> List[str]:
    """Names of the top-level entries of ``folder`` that start with ``prefix``, sorted."""
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir() if entry.name.startswith(prefix))


def leftover_message(names: List[str], who: str) -> str:
    return (f"{who} left {len(names)} temporary entr{'y' if len(names) == 1 else 'ies'} behind: "
            + ", ".join(names) + ". A notebook or test must remove what it creates: use "
            "`tempfile.TemporaryDirectory(prefix=\"minimind_...\")` (removed when the kernel exits, even "
            "after a partial run) and call its .cleanup() in the chapter's last cell, or pytest's tmp_path.")


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
