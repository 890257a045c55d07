"""Writing files so that a crash cannot lose them, and fingerprinting weights so that a damaged
file cannot load quietly.

Every file ``minimind_ref`` writes (checkpoints, LoRA files, stage files, JSONL data, the
tokenizer, JSON and markdown reports) goes through ``atomic_write``:

1. the bytes go to a temporary file next to the target (``.NAME.<pid>.<random>.tmp``, same folder,
   so the rename below stays on one file system);
2. the temporary file is flushed and ``fsync``-ed: its bytes are on the disk;
3. ``os.replace`` renames it over the target in one step, and the folder is ``fsync``-ed.

The new file keeps the previous one's permission bits (a ``0600`` file stays ``0600``; a new
file gets the usual ``0666`` less the umask), and a symbolic link is written through: its target
is replaced, the link stays a link.

A process killed at any moment therefore leaves either the previous file or the new one, never a
mix (a hidden ``.NAME.<pid>.*.tmp`` may stay behind; the next write of ``NAME`` removes it once
its process is gone). A failed write (a full disk, a read-only
folder) removes the temporary file and raises ``OSError`` naming the target and saying that the
previous file is intact. Paths starting with ``~`` mean the home folder, as in a shell.

``weights_digest`` is the SHA-256 of a state dict's tensors (names, dtypes, shapes and bytes, in
sorted name order). ``save_checkpoint`` records it and every loader checks it, so flipped bytes,
a hand-edited tensor or a truncated copy are reported instead of loaded.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import uuid
from typing import IO, Any, Iterator, Mapping, Union

import torch

PathLike = Union[str, "os.PathLike[str]"]


def expand(path: PathLike) -> str:
    """``path`` as a string, with a leading ``~`` turned into the home folder (as a shell does)."""
    return os.path.expanduser(os.fspath(path))


class _RecordingWriter:
    """A file object that remembers the first ``OSError`` its ``write`` raised: ``torch.save``
    turns such an error into a ``RuntimeError`` about zip positions, which hides a full disk."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.error = handle, None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.handle.flush()

    def fileno(self) -> int:
        return self.handle.fileno()


def _write_error(path: str, err: OSError) -> OSError:
    reason = "the disk is full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else (err.strerror or str(err))
    message = (f"could not write {path}: {reason}. Nothing was replaced: the previous file at that path (if there "
               "was one) is intact. Free some space or choose another folder, then save again.")
    return type(err)(err.errno, message) if err.errno is not None else type(err)(message)


def _file_to_write(path: Any, what: str) -> str:
    """``path`` expanded, or a clear error: not a path (``TypeError``), empty (``ValueError``), a folder."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a file name (a str or a Path), got {type(path).__name__}.")
    if not os.fspath(path):
        raise ValueError(f"{what} must be a file name (a str or a Path), got {path!r}.")
    path = expand(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} {path} is a folder; give a file name (a path inside it, for instance).")
    return path


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "wb", encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; on a clean exit it replaces ``path`` (see the module
    docstring). ``mode`` is ``"wb"`` (binary) or ``"w"`` (text, ``encoding``). The folder is
    created if needed. A folder as ``path`` is an ``IsADirectoryError``."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write writes a whole new file: mode must be 'wb' or 'w', got {mode!r}.")
    path = _through_links(_file_to_write(path, "the path to write"))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    writer = None
    try:
        with open(tmp, "x" + mode[1:], **({} if "b" in mode else {"encoding": encoding})) as handle:
            _keep_mode(path, tmp)
            writer = _RecordingWriter(handle) if "b" in mode else handle
            yield writer
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        cause = getattr(writer, "error", None) if not isinstance(err, OSError) else err
        if isinstance(cause, OSError) and not isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise _write_error(path, cause) from err
        raise
    with contextlib.suppress(OSError, AttributeError):  # make the rename durable (POSIX only)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    remove_stale_temporaries(folder, os.path.basename(path))


def _through_links(path: str) -> str:
    """The file a write of ``path`` replaces: a symbolic link's target (followed to the end), so the
    link itself stays a link; ``path`` itself otherwise."""
    if not os.path.islink(path):
        return path
    target = os.path.realpath(path)
    if os.path.islink(target):
        raise OSError(errno.ELOOP, f"the path to write {path} is a symbolic link that leads back to itself (a loop); "
                                   "point it at a file, or remove it.")
    if os.path.isdir(target):
        raise IsADirectoryError(f"the path to write {path} is a link to the folder {target}; give a file name.")
    return target


def _keep_mode(path: str, tmp: str) -> None:
    """Give ``tmp`` the permission bits (and, where allowed, the owner) of the file it will replace."""
    try:
        st = os.stat(path)
    except OSError:
        return  # a new file: the usual mode (0666 less the umask)
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    if hasattr(os, "chown"):
        with contextlib.suppress(OSError):  # another owner: only root may give the file back to it
            tmp_st = os.stat(tmp)
            if (tmp_st.st_uid, tmp_st.st_gid) != (st.st_uid, st.st_gid):
                os.chown(tmp, st.st_uid, st.st_gid)


def remove_stale_temporaries(folder: str, name: str) -> None:
    """Remove ``.NAME.<pid>.*.tmp`` files left by killed writers (their process no longer exists)."""
    prefix = f".{name}."
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            if not (entry.startswith(prefix) and entry.endswith(".tmp")):
                continue
            pid = entry[len(prefix):].split(".")[0]
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # that process is alive (perhaps writing the same file): leave its file
            except ProcessLookupError:
                pass
            except OSError:
                continue  # alive but not ours (EPERM)
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, entry))


def check_writable(path: PathLike, what: str = "the output file") -> str:
    """Check, before a long run starts, that ``atomic_write(path)`` will be able to write ``path``;
    return it expanded. ``IsADirectoryError`` when ``path`` is a folder, ``NotADirectoryError`` when
    a file stands where a folder of it must be, ``PermissionError`` when its folder (or the nearest
    one that exists, where the missing ones will be created) cannot be written to. Nothing is
    created."""
    path = _file_to_write(path, what)
    folder = os.path.dirname(os.path.abspath(_through_links(path)))
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"{what} {path} cannot be written: {folder} is a file, not a folder.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {path} cannot be written: the folder {folder} is not writable. Choose another "
                              "place (nothing was run).")
    return path


def write_text(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)


def write_json(path: PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=indent)


def read_json(path: PathLike, what: str = "JSON file") -> Any:
    """``json.load`` of ``path`` (UTF-8, a BOM is skipped); a file that is not valid JSON (a
    truncated download, an edit gone wrong) is a ``ValueError`` naming it."""
    path = expand(path)
    try:
        with open(path, encoding="utf-8-sig") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a valid {what}: {err} (truncated, or edited by hand?).") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a valid {what}: it is not UTF-8 text ({err.reason} at byte {err.start}); "
                         "a binary file, or text saved in another encoding?") from None


def save_torch(obj: Any, path: PathLike) -> None:
    """``torch.save(obj, path)``, atomically."""
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)


# ---------------------------------------------------------------------- digests
DIGEST_KEY = "weights_sha256"
META_DIGEST_KEY = "meta_sha256"


def weights_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over every tensor of ``state_dict``: name, dtype, shape and raw bytes, in
    sorted name order. Equal for equal weights whatever the device or the dict's order; any
    changed bit, name, dtype or shape changes it."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"weights_digest hashes tensors; {name!r} is a {type(tensor).__name__}.")
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def meta_digest(value: Any) -> str:
    """SHA-256 (hex) of a checkpoint's config and metadata: nested dicts, lists, tuples, sets,
    numbers, strings and tensors, fed in a canonical order (dict keys sorted), with each value's
    type, so any changed number, key or tensor changes it."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    kind = type(value).__name__
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"<tensor {t.dtype} {tuple(t.shape)}>".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(f"<{kind} {len(value)}>".encode())
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
    elif isinstance(value, (set, frozenset)):
        h.update(f"<{kind} {len(value)}>".encode())
        for item in sorted(value, key=repr):
            _feed(h, item)
    elif isinstance(value, (list, tuple)):
        h.update(f"<{kind} {len(value)}>".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, float):
        h.update(f"<float {value.hex()}>".encode())
    else:  # None, bool, int, str, bytes, complex, torch.dtype, torch.device
        h.update(f"<{kind} {value!r}>".encode())
