"""Pretraining at full size: tokenize a data file once, in parallel, into a cache; train from a
memory-mapped token file.

``prepare_token_cache`` takes a pretraining file (``datafiles``: a ``.jsonl`` of ``{"text": ...}``
lines, as upstream's ``pretrain_hq.jsonl``, or a ``.parquet`` file with a ``text`` column), cuts it
into byte ranges at line starts (row groups for Parquet), and a pool of worker processes parses and
tokenizes the ranges in parallel (a progress bar counts the bytes), each document framed
``[bos] text [eos]`` exactly as ``data.encode_documents`` frames it. The token stream is written
once into a cache folder named by the SHA-256 of the file's bytes and of the tokenizer
(``tokenizer_digest``), with the format version: ``tokens.bin`` (``uint16`` when every id fits, as
with upstream's 6,400-token vocabulary, else ``uint32``), ``offsets.bin`` (where each document
starts, ``int64``) and ``meta.json`` (written last: a folder without it is incomplete and rebuilt).
Every file is written atomically (``files.atomic_write``). A later run with the same file and
tokenizer finds the folder and tokenizes nothing; a changed file or tokenizer gets a new folder.
``TokenWindows`` then serves the windows of ``seq_len`` tokens straight from ``numpy.memmap``: the
operating system pages in the rows a batch reads, so the memory a run needs does not grow with the
file (``tests/test_datafiles.py`` trains on a generated 200 MB file with a bounded peak).

**Why not Hugging Face ``datasets``** (upstream's ``load_dataset('json', ...)``,
``c090b69:dataset/lm_dataset.py:12``)? It would work, but for this job it costs more than it gives:
``load_dataset('json')`` first converts the whole file into its own Arrow cache (a second copy of
the data on disk), ``map`` writes a third (token lists, 32 or 64 bits an id, with offsets), and the
course would still write the flat token file the packing needs; its cache is keyed by a hash of the
pickled function, which changes with library versions; and it brings pyarrow, pandas, fsspec,
multiprocess and a huggingface_hub constraint into an environment that must keep Colab's packages
as they are. Measured once each on this project's 2-core CPU (shared with other jobs), on a 47 MB
file of 250,000 generated documents, 2 processes: ``datasets`` 4.0.0 (Colab's) took 61 s
(``load_dataset`` 1.7 s, ``map`` 59 s) and left 200 MB in its cache, before any flat token file;
``prepare_token_cache`` took 51 s and wrote 41 MB, the flat file included. What the job needs is
small: split a file at line starts, ``json.loads`` each line, ``tokenizers``' ``encode_batch``,
write integers. That is this module: the standard library's ``json`` and ``concurrent.futures``
(``fork`` processes on Linux, ``spawn`` elsewhere), and ``numpy.memmap``, which is how nanoGPT
trains from its token files.

``python -m minimind_ref.token_cache FILE --tokenizer tokenizer.json`` fills the cache before a run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .datafiles import (TEXT_FIELD, checked_text, data_format, line_content, line_number, lines_between, parquet_file,
                        parse_line)
from .files import atomic_write, expand, read_json, write_json
from .tokenizer import BOS_ID, EOS_ID

FORMAT_VERSION = 1
CACHE_ENV = "MINIMIND_CACHE"

Log = Optional[Callable[[str], None]]


# ---------------------------------------------------------------------- digests
def tokenizer_digest(tokenizer: Any) -> str:
    """SHA-256 of a ``tokenizers.Tokenizer``'s JSON (vocabulary, merges, pre-tokenizer, special
    tokens): equal for the same tokenizer however it was loaded; any change of it changes the digest."""
    to_str = getattr(tokenizer, "to_str", None)
    if to_str is None:
        raise TypeError(f"tokenizing a data file needs a tokenizers.Tokenizer (it is copied into worker processes "
                        f"through its JSON), got {type(tokenizer).__name__}; load one with "
                        "minimind_ref.tokenizer.load_tokenizer('tokenizer.json').")
    return hashlib.sha256(to_str().encode("utf-8")).hexdigest()


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str, cache_root: Optional[str] = None) -> str:
    """SHA-256 of a file's bytes. With ``cache_root`` the digest is remembered in
    ``file_digests.json`` there, keyed by the file's path, size, modification time (ns) and inode,
    so a run on an unchanged file does not read it again; any change of those re-reads it."""
    path = os.path.abspath(expand(path))
    st = os.stat(path)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    memo_path = os.path.join(cache_root, "file_digests.json") if cache_root else None
    memo: Dict[str, Any] = {}
    if memo_path and os.path.exists(memo_path):
        with contextlib.suppress(ValueError, OSError):
            memo = read_json(memo_path)
            entry = memo.get(path) if isinstance(memo, dict) else None
            if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
                return entry["sha256"]
    digest = _sha256_file(path)
    if memo_path:
        memo = memo if isinstance(memo, dict) else {}
        memo[path] = {"stamp": stamp, "sha256": digest}
        with contextlib.suppress(OSError):
            write_json(memo_path, memo, indent=None)
    return digest


def default_cache_root() -> str:
    """``$MINIMIND_CACHE``, else ``$XDG_CACHE_HOME/minimind_ref``, else ``~/.cache/minimind_ref``."""
    if os.environ.get(CACHE_ENV):
        return expand(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minimind_ref")


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id of a ``vocab_size`` vocabulary fits (at most 65,536), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ---------------------------------------------------------------------- tokenizing in worker processes
_WORKER: Dict[str, Any] = {}


def _worker_tokenizer(tokenizer_json: str, digest: str) -> Any:
    if _WORKER.get("digest") != digest:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tokenizer_json)
        tok.encode_special_tokens = True  # a literal "<|im_end|>" in a text stays text (encode_documents' rule)
        _WORKER.update(digest=digest, tokenizer=tok)
    return _WORKER["tokenizer"]


def _quiet_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: the pool is the parallelism


@contextlib.contextmanager
def _no_tokenizer_threads_while_forking() -> Iterator[None]:
    """``TOKENIZERS_PARALLELISM=false`` while the workers start: a process forked after ``tokenizers``
    used its thread pool would otherwise print a warning (the workers encode single-threaded anyway).
    Python 3.12+ also warns that forking a process with threads (torch's) "may lead to deadlocks": a
    worker here takes no lock another thread could hold (no torch, no new thread; malloc and the import
    lock are reset at the fork), so that warning is silenced too."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _pool_context() -> Any:
    """``fork`` on Linux: a worker runs only the standard library, numpy and ``tokenizers`` (no torch
    kernel), and forking re-imports nothing, so a script without ``if __name__ == "__main__"`` works;
    ``spawn`` elsewhere (the default of macOS and Windows, whose scripts need that guard)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") and "fork" in methods else "spawn")


@dataclass
class _Task:
    path: str
    fmt: str
    start: int  # jsonl: byte offset of a line start; parquet: first row group
    end: int  # jsonl: byte offset (exclusive); parquet: last row group (exclusive)
    out: str  # where the chunk's tokens go
    tokenizer_json: str
    tokenizer_digest: str
    dtype: str
    bos: int
    eos: int
    first_row: int = 0  # parquet: the 0-based index of the chunk's first row


def _encode_chunk(task: _Task) -> Dict[str, Any]:
    """Tokenize one chunk into ``task.out``; returns its document lengths (framed), or the first error
    as ``{"error": message, "offset": byte offset of the line}``."""
    tok = _worker_tokenizer(task.tokenizer_json, task.tokenizer_digest)
    dtype = np.dtype(task.dtype)
    limit = np.iinfo(dtype).max
    lengths: List[int] = []
    batch: List[str] = []
    held = 0  # characters in ``batch``: encodings cost about 100 bytes a token, so batches stay small

    def flush(out: Any) -> None:
        flat: List[int] = []
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            flat.append(task.bos)
            flat.extend(enc.ids)
            flat.append(task.eos)
            lengths.append(len(enc.ids) + 2)
        ids = np.asarray(flat, dtype=np.int64)
        if ids.size and int(ids.max()) > limit:
            raise ValueError(f"token id {int(ids.max())} does not fit {dtype.name}.")
        out.write(ids.astype(dtype).tobytes())
        batch.clear()

    def add(text: str, out: Any) -> None:
        nonlocal held
        batch.append(text)
        held += len(text)
        if held >= 1 << 18 or len(batch) >= 1024:
            flush(out)
            held = 0

    with open(task.out, "wb") as out:
        if task.fmt == "jsonl":
            with open(task.path, "rb") as f:
                for pos, raw in lines_between(f, task.start, task.end):
                    content = line_content(pos, raw)
                    if not content:
                        continue
                    try:
                        text = parse_line(content, "pretrain", task.path, lambda: 0)[TEXT_FIELD]
                    except ValueError as err:  # the line's number is counted by the parent
                        return {"error": str(err), "offset": pos}
                    add(text, out)
        else:
            pf = parquet_file(task.path)
            row = task.first_row
            for group in range(task.start, task.end):
                for text in pf.read_row_group(group, columns=[TEXT_FIELD]).column(0).to_pylist():
                    row += 1
                    try:
                        add(checked_text(text, task.path, row), out)
                    except ValueError as err:
                        return {"error": str(err), "offset": None}
        flush(out)
    return {"lengths": np.asarray(lengths, dtype=np.int64), "bytes": task.end - task.start}


def _jsonl_ranges(path: str, chunk_bytes: int) -> List[Tuple[int, int]]:
    """Byte ranges ``[start, end)`` of about ``chunk_bytes``, each starting at a line start."""
    size = os.path.getsize(path)
    ranges, start = [], 0
    with open(path, "rb") as f:
        while start < size:
            end = min(size, start + chunk_bytes)
            if end < size:
                f.seek(end)
                f.readline()  # move to the next line start
                end = f.tell()
            ranges.append((start, end))
            start = end
    return ranges


MAX_DEFAULT_WORKERS = 16  # each worker holds a tokenizer and a batch of encodings (about 170 MB measured)


def _default_workers() -> int:
    """One process per CPU this process may use, at most ``MAX_DEFAULT_WORKERS``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


# ---------------------------------------------------------------------- the cache
@dataclass
class TokenCache:
    """A tokenized data file: ``tokens`` (every document framed ``[bos] ... [eos]``, one after the
    other, a read-only ``numpy.memmap``), ``offsets`` (``offsets[d]`` is where document ``d`` starts,
    ``offsets[-1] == len(tokens)``) and ``meta`` (what made it, and how long it took)."""

    folder: str
    meta: Dict[str, Any]
    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def key(self) -> str:
        return self.meta["key"]

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    def stream(self, first_doc: int = 0, end_doc: Optional[int] = None) -> np.ndarray:
        """The tokens of documents ``[first_doc, end_doc)`` (a view of the memory map, nothing read)."""
        end_doc = self.n_docs if end_doc is None else end_doc
        return self.tokens[int(self.offsets[first_doc]) : int(self.offsets[end_doc])]

    @classmethod
    def open(cls, folder: str) -> Optional["TokenCache"]:
        """The cache in ``folder``, or None when it is missing, incomplete or of another format version."""
        meta_path = os.path.join(folder, "meta.json")
        if not os.path.exists(meta_path):
            return None
        try:
            meta = read_json(meta_path, "token cache record")
            dtype = np.dtype(meta["dtype"])
            n_tokens, n_docs = int(meta["n_tokens"]), int(meta["n_docs"])
            if meta.get("version") != FORMAT_VERSION:
                return None
            tokens_path, offsets_path = os.path.join(folder, "tokens.bin"), os.path.join(folder, "offsets.bin")
            if os.path.getsize(tokens_path) != n_tokens * dtype.itemsize or os.path.getsize(offsets_path) != (n_docs + 1) * 8:
                return None
        except (ValueError, KeyError, TypeError, OSError):
            return None
        tokens = np.memmap(tokens_path, dtype=dtype, mode="r", shape=(n_tokens,)) if n_tokens else np.zeros(0, dtype)
        offsets = np.memmap(offsets_path, dtype=np.int64, mode="r", shape=(n_docs + 1,))
        return cls(folder, meta, tokens, offsets)


def cache_key(file_sha256: str, tokenizer_sha256: str, fmt: str, bos: int = BOS_ID, eos: int = EOS_ID) -> str:
    """The name of a cache folder: a digest of everything the tokens depend on."""
    parts = {"version": FORMAT_VERSION, "file": file_sha256, "tokenizer": tokenizer_sha256, "format": fmt,
             "field": TEXT_FIELD, "bos": bos, "eos": eos, "plain_text": True}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def prepare_token_cache(path: str, tokenizer: Any, cache_dir: Optional[str] = None, workers: int = 0,
                        progress: bool = True, log: Log = None, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
                        chunk_bytes: Optional[int] = None) -> TokenCache:
    """Tokenize a pretraining file (``.jsonl``: ``{"text": ...}`` lines; ``.parquet``: a ``text``
    column) once, or find it tokenized; returns its ``TokenCache``.

    ``cache_dir``: the cache's root folder (default ``default_cache_root()/tokens``); ``workers``:
    processes (0: one per CPU this process may use, at most 16); ``progress``: a tqdm bar over the file's bytes;
    ``log``: where the one-line summary goes (None: nowhere). A malformed record is a ``ValueError``
    naming the file and the line (or row), and no cache is written."""
    fmt = data_format(path)
    if fmt == "text":
        raise ValueError(f"{path}: prepare_token_cache reads .jsonl or .parquet files (text files are read by "
                         "data.read_text_documents).")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be a whole number >= 0 (0: one per CPU), got {workers!r}.")
    path = os.path.abspath(expand(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no data file {path}.")
    root = expand(cache_dir) if cache_dir else os.path.join(default_cache_root(), "tokens")
    os.makedirs(root, exist_ok=True)
    tok_digest = tokenizer_digest(tokenizer)
    key = cache_key(file_digest(path, root), tok_digest, fmt, bos_id, eos_id)
    folder = os.path.join(root, key)
    found = TokenCache.open(folder)
    if found is not None:
        if log:
            log(f"token cache: {os.path.basename(path)} was tokenized before ({found.n_docs:,} documents, "
                f"{len(found.tokens):,} tokens): {folder}")
        return found

    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(max(vocab, bos_id + 1, eos_id + 1))
    workers = workers or _default_workers()
    size = os.path.getsize(path)
    scratch = tempfile.mkdtemp(prefix=".minimind_chunks_", dir=root)
    tic = time.perf_counter()
    try:
        common = dict(tokenizer_json=tokenizer.to_str(), tokenizer_digest=tok_digest, dtype=dtype.name, bos=bos_id,
                      eos=eos_id)
        if fmt == "jsonl":
            chunk = chunk_bytes or int(min(64 << 20, max(1 << 20, size // (workers * 8) + 1)))
            tasks = [_Task(path, fmt, s, e, os.path.join(scratch, f"{i:06d}.bin"), **common)
                     for i, (s, e) in enumerate(_jsonl_ranges(path, chunk))]
        else:
            pf = parquet_file(path)
            rows = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
            tasks = [_Task(path, fmt, g, g + 1, os.path.join(scratch, f"{g:06d}.bin"), first_row=sum(rows[:g]), **common)
                     for g in range(pf.num_row_groups)]
        results = _run_tasks(tasks, workers, progress, size if fmt == "jsonl" else len(tasks), fmt)
        for task, result in zip(tasks, results):
            if "error" in result:
                message = result["error"]
                if result.get("offset") is not None:  # the worker could not know the line's number
                    message = message.replace(f"{path}:0", f"{path}:{line_number(path, result['offset'])}", 1)
                raise ValueError(message)
        lengths = np.concatenate([r["lengths"] for r in results]) if results else np.zeros(0, np.int64)
        if not len(lengths):
            raise ValueError(f"{path} holds no document (no non-blank line or row): nothing to train on.")
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        os.makedirs(folder, exist_ok=True)
        with atomic_write(os.path.join(folder, "tokens.bin")) as out:
            for task in tasks:
                with open(task.out, "rb") as part:
                    shutil.copyfileobj(part, out, 1 << 22)
                os.remove(task.out)
        with atomic_write(os.path.join(folder, "offsets.bin")) as out:
            out.write(offsets.tobytes())
        seconds = time.perf_counter() - tic
        n_tokens = int(offsets[-1])
        meta = {"version": FORMAT_VERSION, "key": key, "source": path, "format": fmt, "file_bytes": size,
                "tokenizer_sha256": tok_digest, "vocab_size": vocab, "dtype": dtype.name, "bos": bos_id, "eos": eos_id,
                "n_docs": int(len(lengths)), "n_tokens": n_tokens, "workers": min(workers, len(tasks)),
                "seconds": round(seconds, 3), "docs_per_s": round(len(lengths) / max(seconds, 1e-9), 1),
                "tokens_per_s": round(n_tokens / max(seconds, 1e-9), 1)}
        write_json(os.path.join(folder, "meta.json"), meta)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cache = TokenCache.open(folder)
    assert cache is not None, f"the token cache just written in {folder} does not open"
    if log:
        log(f"tokenized {os.path.basename(path)}: {cache.n_docs:,} documents, {len(cache.tokens):,} tokens in "
            f"{meta['seconds']:.1f} s ({meta['docs_per_s']:,.0f} docs/s, {meta['tokens_per_s']:,.0f} tokens/s, "
            f"{meta['workers']} processes) -> {folder}")
    return cache


def _run_tasks(tasks: List[_Task], workers: int, progress: bool, total: int, fmt: str) -> List[Dict[str, Any]]:
    """Every task's result, in order: in this process when one worker (or one task) is enough, else in
    a pool of processes (``_pool_context``)."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="tokenize", unit="B" if fmt == "jsonl" else "row group", unit_scale=fmt == "jsonl",
                   dynamic_ncols=True)
    results: List[Optional[Dict[str, Any]]] = [None] * len(tasks)
    try:
        if workers <= 1 or len(tasks) <= 1:
            for i, task in enumerate(tasks):
                results[i] = _encode_chunk(task)
                if bar is not None:
                    bar.update(results[i].get("bytes", 0) if fmt == "jsonl" else 1)
                if "error" in results[i]:
                    return [r or {"lengths": np.zeros(0, np.int64)} for r in results]
        else:
            with concurrent.futures.ProcessPoolExecutor(min(workers, len(tasks)), mp_context=_pool_context(),
                                                        initializer=_quiet_worker) as pool:
                with _no_tokenizer_threads_while_forking():
                    futures = {pool.submit(_encode_chunk, task): i for i, task in enumerate(tasks)}
                for future in concurrent.futures.as_completed(futures):
                    i = futures[future]
                    results[i] = future.result()
                    if bar is not None:
                        bar.update(results[i].get("bytes", 0) if fmt == "jsonl" else 1)
                    if "error" in results[i]:
                        for other in futures:
                            other.cancel()
                        break
    finally:
        if bar is not None:
            bar.close()
    return [r if r is not None else {"lengths": np.zeros(0, np.int64)} for r in results]


# ---------------------------------------------------------------------- windows for training
class TokenWindows(torch.utils.data.Dataset):
    """``data.PackedDataset``'s windows, read from a memory-mapped token stream: window ``i`` is
    tokens ``[i * seq_len, (i + 1) * seq_len)`` of ``stream`` (the last partial window dropped,
    nothing padded), ``(input_ids, labels)`` with ``labels == input_ids``. ``batch(indices)``
    reads only those rows and returns ``torch.long`` tensors ``[len(indices), seq_len]``."""

    def __init__(self, stream: np.ndarray, seq_len: int, name: str = "", what: str = "the data") -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2, got {seq_len!r}.")
        n = len(stream) // seq_len
        if n == 0:
            raise ValueError(f"{what} holds {len(stream)} tokens, fewer than one window of seq_len={seq_len}.")
        self.seq_len, self.name = seq_len, name
        self.rows = stream[: n * seq_len].reshape(n, seq_len)

    def __len__(self) -> int:
        return self.rows.shape[0]

    def _read(self, indices: Any) -> torch.Tensor:
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices, dtype=np.int64)
        return torch.from_numpy(self.rows[idx].astype(np.int64))

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x = self._read([int(i)])[0]
        return x, x

    def batch(self, indices: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        x = self._read(indices)
        return x, x

    def fingerprint(self) -> str:
        """A digest of the windows' source (the cache key and the documents' range) and ``seq_len``:
        a resumed run checks it against its checkpoint's without reading the data."""
        return hashlib.sha256(f"{self.name}|{self.seq_len}|{len(self)}".encode()).hexdigest()[:16]


def validation_documents(n_docs: int, n_val_docs: int) -> int:
    """How many of a file's last documents are held out for validation: ``n_val_docs``, at most a
    twentieth of the file (at least one)."""
    if n_docs < 2:
        raise ValueError(f"the data file holds {n_docs} document(s); training and validation need at least 2.")
    return max(1, min(n_val_docs, n_docs // 20))


def split_windows(cache: TokenCache, seq_len: int, n_val_docs: int) -> Tuple[TokenWindows, TokenWindows]:
    """``(train, val)`` windows of a cached file: its last ``validation_documents(...)`` documents
    are the validation stream, the others the training stream."""
    n_val = validation_documents(cache.n_docs, n_val_docs)
    cut = cache.n_docs - n_val
    train = TokenWindows(cache.stream(0, cut), seq_len, f"{cache.key}|0:{cut}",
                         f"the training part of {cache.meta['source']} (documents 0-{cut - 1})")
    val = TokenWindows(cache.stream(cut, cache.n_docs), seq_len, f"{cache.key}|{cut}:{cache.n_docs}",
                       f"the validation part of {cache.meta['source']} (its last {n_val} documents; raise n_val_docs)")
    return train, val


# ---------------------------------------------------------------------- command line
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.token_cache",
                                description="Tokenize a pretraining file (.jsonl / .parquet) into the token cache "
                                            "before training (a distributed run then finds it ready).")
    p.add_argument("data", help="a .jsonl file of {\"text\": ...} lines, or a .parquet file with a text column")
    p.add_argument("--tokenizer", required=True, help="the tokenizer.json the run will use (e.g. upstream's model/tokenizer.json)")
    p.add_argument("--cache", default=None, help=f"the cache's root folder (default ${CACHE_ENV} or ~/.cache/minimind_ref)/tokens")
    p.add_argument("--workers", type=int, default=0, help="processes (0: one per CPU)")
    args = p.parse_args(argv)
    from .tokenizer import load_tokenizer

    try:
        cache = prepare_token_cache(args.data, load_tokenizer(args.tokenizer), args.cache, args.workers, progress=True,
                                    log=print)
    except (ValueError, FileNotFoundError, ImportError) as err:
        p.error(str(err))
    print(json.dumps({k: cache.meta[k] for k in ("n_docs", "n_tokens", "dtype", "seconds", "docs_per_s", "tokens_per_s",
                                                  "workers")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
