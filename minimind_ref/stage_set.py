"""The shipped stage files as one set: a manifest of their digests and lineage, checked at load.

The stage files (``base.pt``, ``sft.pt``, ``lora.pt``, ``dpo.pt``, ``grpo.pt``), the tokenizer they
share and the seed record belong together: ``lora``, ``dpo`` and ``grpo`` were trained from that
``sft``, which was trained from that ``base``, and the record measured those models. Each file is
written atomically (``files.atomic_write``), but a set is several files, so a process killed while
``stages rebuild`` ships a new set could leave a new ``sft.pt`` beside the old ``lora.pt``: files
that are each whole and together wrong. ``manifest.json`` beside them says which files make the
set:

* ``files``: per file name its SHA-256 (of the bytes), its size and its lineage (a stage file: its
  stage, parent stage and the parent file's digest, the seed and float path it was trained with; the
  tokenizer and the record: their role);
* ``pending``: while a new set is being written, the whole new set; None otherwise.

``write_set`` changes a set in three steps: the manifest with the new set as ``pending``, then each
file (atomically), then the manifest with the new set as ``files``. ``check_set`` (which
``stages.load_stage``, ``stages.stage_metadata`` and ``stage_report.load_seed_records`` call)
accepts the folder only when every file matches ``files`` (the old set, or a finished write) or
every file matches ``pending`` (a write killed after its last file, before its manifest): a kill at
any moment leaves a set that is loaded whole, or a mixed one that is refused, naming which files are
new and which old. A stage file without an entry, a file that differs from its entry (replaced or
edited by hand) and a listed file that is missing are refused too.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from .files import PathLike, expand, read_json
from .stage_registry import SEEDS_FILE, STAGE_INFO, TOKENIZER_FILE

MANIFEST_NAME = "manifest.json"
FORMAT = "minimind_ref stage set"
VERSION = 1
STAGE_FILES = tuple(stage.file for stage in STAGE_INFO.values())
#: every file a set may hold: the stage files, the tokenizer they share, the seed record
SET_FILES = STAGE_FILES + (TOKENIZER_FILE.name, SEEDS_FILE.name)
_RESTORE = ("run the command that wrote the set again, or restore the package's files (`git checkout "
            "minimind_ref/checkpoints` in a clone, or reinstall the package)")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_digest_cache: Dict[Tuple[str, int, int, int], str] = {}


def file_sha256(path: PathLike) -> str:
    """SHA-256 (hex) of a file's bytes (remembered per path, size, modification time and inode)."""
    path = os.path.realpath(expand(path))
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _digest_cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _digest_cache[key] = h.hexdigest()
    return _digest_cache[key]


def _check_entries(entries: Any, manifest: Path, what: str) -> Dict[str, Dict[str, Any]]:
    if not isinstance(entries, dict):
        raise ValueError(f"{manifest} is not a stage set manifest: its {what!r} must map file names to entries.")
    for name, entry in entries.items():
        if name not in SET_FILES:
            raise ValueError(f"{manifest}: {what!r} lists {name!r}, which is not a file of a stage set "
                             f"({', '.join(SET_FILES)}).")
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _HEX64.match(entry["sha256"])):
            raise ValueError(f"{manifest}: the entry of {name!r} in {what!r} has no valid sha256; {_RESTORE}.")
    return entries


def read_manifest(folder: PathLike) -> Optional[Dict[str, Any]]:
    """The manifest of the set in ``folder`` (None when there is none); a damaged one is a ``ValueError``."""
    path = Path(expand(folder)) / MANIFEST_NAME
    if not path.is_file():
        return None
    manifest = read_json(path, "stage set manifest")
    if not (isinstance(manifest, dict) and manifest.get("format") == FORMAT and manifest.get("version") == VERSION):
        raise ValueError(f"{path} is not a stage set manifest (format {FORMAT!r}, version {VERSION}); {_RESTORE}.")
    _check_entries(manifest.get("files"), path, "files")
    if manifest.get("pending") is not None:
        _check_entries(manifest["pending"], path, "pending")
    return manifest


def check_set(folder: PathLike) -> Dict[str, Dict[str, Any]]:
    """Check that the files in ``folder`` are one whole stage set (see the module docstring) and
    return its entries (file name -> sha256, size, lineage); ``{}`` for a folder that holds no stage
    file and no manifest. A ``ValueError`` names what is wrong: no manifest beside stage files, a
    mixed set (an interrupted write), a file that is not the one listed, a listed file missing, a
    stage file not listed."""
    folder = Path(expand(folder))
    manifest = read_manifest(folder)
    present = [name for name in STAGE_FILES if (folder / name).is_file()]
    if manifest is None:
        if present:
            raise ValueError(f"{folder} holds stage files ({', '.join(present)}) but no {MANIFEST_NAME}: nothing says "
                             f"they belong together (copied by hand, or written before the manifest existed); "
                             f"{_RESTORE}, or write them with stages.save_stage.")
        return {}
    current, pending = manifest["files"], manifest.get("pending")
    names = sorted(set(current) | set(pending or {}))
    actual = {name: file_sha256(folder / name) if (folder / name).is_file() else None for name in names}

    def matches(entries: Mapping[str, Any]) -> bool:
        return all(actual[name] == (entries[name]["sha256"] if name in entries else None) for name in names)

    if matches(current):
        chosen = current
    elif pending is not None and matches(pending):
        chosen = pending
    elif pending is not None:
        new = [n for n in names if n in pending and actual[n] == pending[n]["sha256"]
               and actual[n] != (current[n]["sha256"] if n in current else None)]
        other = [n for n in names if n not in new and actual[n] != (current[n]["sha256"] if n in current else None)]
        old = [n for n in names if n not in new and n not in other]
        raise ValueError(f"{folder}: the stage set is mixed, a write of a new set was interrupted: "
                         f"{', '.join(new) or 'no file'} from the new set, {', '.join(old) or 'no file'} from the old one"
                         + (f", {', '.join(other)} from neither" if other else "")
                         + f". The files belong together (each stage trained from its parent in the set, the record "
                         f"measured them), so none is loaded; {_RESTORE}.")
    else:
        name = next(n for n in names if actual[n] != (current[n]["sha256"] if n in current else None))
        if actual[name] is None:
            raise ValueError(f"{folder / name} is missing: the stage set's {MANIFEST_NAME} lists it; {_RESTORE}.")
        raise ValueError(f"{folder / name} is not the file the stage set's {MANIFEST_NAME} lists (sha-256 "
                         f"{actual[name][:12]}... instead of {current[name]['sha256'][:12]}...): replaced or edited "
                         f"since the set was written, so it may not belong with the others; {_RESTORE}.")
    stray = [name for name in present if name not in chosen]
    if stray:
        raise ValueError(f"{folder}: {', '.join(stray)} not in the stage set's {MANIFEST_NAME} (added by hand?); "
                         f"{_RESTORE}, or write it with stages.save_stage.")
    return dict(chosen)


def _write_manifest(folder: Path, files: Dict[str, Any], pending: Optional[Dict[str, Any]]) -> None:
    from . import files as _files  # through the module: tests watch every atomic write

    _files.write_json(folder / MANIFEST_NAME, {"format": FORMAT, "version": VERSION, "files": files,
                                               "pending": pending}, indent=1)


def write_set(folder: PathLike, sources: Mapping[str, PathLike], lineage: Mapping[str, Mapping[str, Any]]
              ) -> Dict[str, Dict[str, Any]]:
    """Replace the files ``sources`` (set file name -> a file to copy) of the set in ``folder`` as
    one change: the manifest with the new set as ``pending``, each file copied atomically, then the
    manifest with the new set as ``files`` (see the module docstring). ``lineage[name]``: what the
    manifest records about that file (a stage file: ``stage``, ``parent``, ``seed``,
    ``float_path``; ``parent_sha256`` when the parent file is not the one in this set); otherwise a
    stage's ``parent_sha256`` is filled in from its parent's entry in the set.
    Files of the set not in ``sources`` keep their entries. Returns the new set's entries."""
    from . import files as _files

    folder = Path(expand(folder))
    unknown = [name for name in sources if name not in SET_FILES]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a file of a stage set ({', '.join(SET_FILES)}).")
    os.makedirs(folder, exist_ok=True)
    try:
        manifest = read_manifest(folder)
    except ValueError:  # a damaged manifest: the files present are the old set, as they are
        manifest = None
    old = dict(manifest["files"]) if manifest is not None else {}
    if manifest is None:  # a folder from before manifests: its files are the old set, as they are
        for name in SET_FILES:
            if (folder / name).is_file() and name not in sources:
                old[name] = {"sha256": file_sha256(folder / name), "bytes": (folder / name).stat().st_size,
                             "lineage": "unknown (present before the manifest)"}
    new = dict(old)
    for name, source in sources.items():
        new[name] = {"sha256": file_sha256(source), "bytes": os.path.getsize(expand(source)), **dict(lineage.get(name, {}))}
    by_stage = {stage.name: stage.file for stage in STAGE_INFO.values()}
    for name, entry in new.items():
        parent = entry.get("parent")
        if name in sources and "parent_sha256" not in entry and parent in by_stage and by_stage[parent] in new:
            entry["parent_sha256"] = new[by_stage[parent]]["sha256"]
    _write_manifest(folder, old, new)
    for name, source in sources.items():
        with open(expand(source), "rb") as src, _files.atomic_write(folder / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    _write_manifest(folder, new, None)
    return new


def write_set_files(folder: PathLike, writers: Mapping[str, Any], lineage: Mapping[str, Mapping[str, Any]]
                    ) -> Dict[str, Dict[str, Any]]:
    """``write_set`` for files made by functions: ``writers[name](path)`` writes the file ``name`` to
    ``path`` (a temporary folder), then the set is changed as one."""
    with tempfile.TemporaryDirectory(prefix="minimind-stage-set-") as work:
        sources = {}
        for name, write in writers.items():
            sources[name] = os.path.join(work, name)
            write(sources[name])
        return write_set(folder, sources, lineage)


def stale_lineage(entries: Mapping[str, Mapping[str, Any]]) -> Dict[str, str]:
    """The stage files of a set whose recorded parent digest is not their parent's file in the set
    (a stage rebuilt alone: its children were trained from the one before): file name -> parent
    file name."""
    by_stage = {stage.name: stage.file for stage in STAGE_INFO.values()}
    out = {}
    for name, entry in entries.items():
        parent_file = by_stage.get(entry.get("parent"))
        if parent_file in entries and entry.get("parent_sha256") not in (None, entries[parent_file]["sha256"]):
            out[name] = parent_file
    return out


def adopt_set(folder: PathLike, lineage: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Write the manifest of the set files in ``folder`` as they are now (a set made before manifests
    existed; ``lineage[name]`` as in ``write_set``). It vouches for whatever is there: use it only on
    files known to belong together (the package's own, as committed)."""
    folder = Path(expand(folder))
    entries = {name: {"sha256": file_sha256(folder / name), "bytes": (folder / name).stat().st_size,
                      **dict(lineage.get(name, {}))} for name in SET_FILES if (folder / name).is_file()}
    by_stage = {stage.name: stage.file for stage in STAGE_INFO.values()}
    for entry in entries.values():
        if entry.get("parent") in by_stage and by_stage[entry["parent"]] in entries:
            entry["parent_sha256"] = entries[by_stage[entry["parent"]]]["sha256"]
    _write_manifest(folder, entries, None)
    return entries
