"""Upstream's data files at full size: read them in their formats, tokenize once, train from a
memory-mapped token file.

Upstream MiniMind ships its datasets as JSON lines, one record per line (sizes from the READMEs'
file lists, ``c090b69:README_en.md:562-571`` and ``d65ef2c:README_en.md:494-501``):

* pretraining (``pretrain_hq.jsonl``, 1.6 GB, ``c090b69:README_en.md:565 "pretrain_hq.jsonl (1.6GB"``;
  ``pretrain_t2t_mini.jsonl``, 1.2 GB, ``d65ef2c:README_en.md:497 "pretrain_t2t_mini.jsonl (1.2GB"``):
  ``{"text": ...}``;
* SFT (``sft_mini_512.jsonl``, ``sft_t2t_mini.jsonl``, 1.6 GB, ``d65ef2c:README_en.md:500``) and RLAIF
  (``rlaif-mini.jsonl``, ``rlaif.jsonl``): ``{"conversations": [{"role": ..., "content": ...}, ...]}``;
* DPO (``dpo.jsonl``): ``{"chosen": [messages], "rejected": [messages]}``.

**Pretraining** (``TrainConfig(data="pretrain_hq.jsonl")``, or a ``.parquet`` file with a ``text``
column) goes through ``prepare_token_cache``: the file is cut into byte ranges at line starts, a pool
of worker processes parses and tokenizes the ranges in parallel (a progress bar counts the bytes),
each document framed ``[bos] text [eos]`` exactly as ``data.encode_documents`` frames it, and the
token stream is written once into a cache folder named by the SHA-256 of the file's bytes and of the
tokenizer (``tokenizer_digest``), with the format version: ``tokens.bin`` (``uint16`` when every id
fits, as with upstream's 6,400-token vocabulary, else ``uint32``), ``offsets.bin`` (where each
document starts, ``int64``) and ``meta.json`` (written last: a folder without it is incomplete and
rebuilt). Every file is written atomically (``files.atomic_write``). A later run with the same file
and tokenizer finds the folder and tokenizes nothing; a changed file or tokenizer gets a new folder.
``TokenWindows`` then serves the windows of ``seq_len`` tokens straight from ``numpy.memmap``: the
operating system pages in the rows a batch reads, so the memory a run needs does not grow with the
file (measured in ``tests/test_datafiles.py``: a generated 200 MB file trains with a bounded peak).

**Post-training** files are read by ``JsonlRecords``: one pass records where each line starts (8
bytes per record), and each record is read, parsed and checked (``check_record``) only when it is
used, so a file is never loaded whole; a malformed line is a ``ValueError`` naming the file and the
line number. ``sft.SFTDataset``, ``dpo.DPODataset`` and ``grpo.RLPromptDataset`` take it where they
take a list of records; the first two then keep their encoded examples in a ``RecordStore`` (an
unnamed temporary file) instead of Python lists. Measured on a generated SFT file of 100,000
conversations (21.6 MiB): ``SFTDataset(load_jsonl(path), ...)`` grew the process by 360 MiB,
``SFTDataset(JsonlRecords(path, "sft"), ...)`` by 7 MiB. They still encode every conversation in
this one process, on every run (about 1,800 conversations a second on this 2-core CPU, shared).

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
``prepare_token_cache`` took 51 s and wrote 41 MB, the flat file included. What the job needs is small: split a file at line starts, ``json.loads`` each line,
``tokenizers``' ``encode_batch``, write integers. That is this module (the standard library's
``json``, ``concurrent.futures`` with ``spawn`` processes, and ``numpy.memmap``, which is how
nanoGPT trains from its token files). Parquet is read with ``pyarrow``'s streaming reader, by
row groups, where ``pyarrow`` is installed (Colab has it; ``pip install 'minimind-ref[data]'``).
"""

from __future__ import annotations

import argparse
import array
import concurrent.futures
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .files import atomic_write, expand, read_json, write_json
from .tokenizer import BOS_ID, EOS_ID

FORMAT_VERSION = 1
KINDS = ("pretrain", "sft", "dpo", "rlaif")
ROLES = ("system", "user", "assistant", "tool")
CACHE_ENV = "MINIMIND_CACHE"
TEXT_FIELD = "text"
_BOM = b"\xef\xbb\xbf"

Log = Optional[Callable[[str], None]]


# ---------------------------------------------------------------------- formats and records
def data_format(path: str) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"text"``, from the file's name; a ``.json`` file is a
    ``ValueError`` (one JSON document is not one record per line; upstream's files are ``.jsonl``)."""
    name = os.fspath(path).lower()
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".json"):
        raise ValueError(f"{path} is a .json file; training data is JSON lines (one record per line, as upstream's "
                         "pretrain_hq.jsonl: {\"text\": ...}) in a file named .jsonl, a .parquet file with a 'text' "
                         "column, or plain text (.txt).")
    return "text"


def check_text_file(path: str) -> None:
    """A plain-text file that is really JSON lines (or a binary file) is a ``ValueError`` before
    anything trains on it: read as text, every ``{"text": "...`` would become training text, and
    a tokenizer trained on it learns the JSON syntax as tokens."""
    with open(expand(path), "rb") as f:
        head = f.read(1 << 16)
    if head.startswith(b"PAR1"):
        raise ValueError(f"{path} is a Parquet file, not text: name it .parquet to read its 'text' column.")
    if b"\0" in head:
        raise ValueError(f"{path} holds NUL bytes: a binary file, not text.")
    first = next((line.strip() for line in head.removeprefix(_BOM).splitlines() if line.strip()), b"")
    if first.startswith(b"{"):
        try:
            record = json.loads(first)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(record, dict):
            keys = ", ".join(repr(k) for k in list(record)[:5])
            raise ValueError(f"{path} looks like JSON lines (its first line is a JSON object with the keys {keys}), not "
                             "plain text: read as text, the training text would be the JSON syntax itself. Name the file "
                             ".jsonl to read its records (pretraining reads {\"text\": ...} lines, upstream's format).")


def _where(path: str, line: Optional[int]) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def _format_hint(record: Mapping[str, Any]) -> str:
    if "conversations" in record:
        return (" It holds 'conversations': upstream's SFT or RLAIF format (minimind_ref.sft / grpo read it, through "
                "JsonlRecords(path, 'sft' or 'rlaif')).")
    if "chosen" in record or "rejected" in record:
        return " It holds 'chosen'/'rejected': upstream's DPO format (minimind_ref.dpo reads it: JsonlRecords(path, 'dpo'))."
    return ""


def _check_messages(messages: Any, where: str, what: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: {what} must be a non-empty list of messages "
                         f"({{\"role\": ..., \"content\": ...}}), got {type(messages).__name__}.")
    for n, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"{where}: {what}[{n}] must be a message {{\"role\": ..., \"content\": ...}}, got "
                             f"{type(m).__name__}.")
        if m.get("role") not in ROLES:
            raise ValueError(f"{where}: {what}[{n}] has role {m.get('role')!r}; upstream's roles are {', '.join(ROLES)}.")
        if not isinstance(m.get("content", ""), str):
            raise ValueError(f"{where}: {what}[{n}]'s content must be a string, got {type(m.get('content')).__name__}.")


def check_record(record: Any, kind: str, path: str = "<record>", line: Optional[int] = None) -> Dict[str, Any]:
    """``record`` (one parsed line) if it has the shape of upstream's ``kind`` of data, else a
    ``ValueError`` naming ``path:line`` and what is wrong:

    * ``"pretrain"``: ``{"text": str}``;
    * ``"sft"``: ``{"conversations": [messages]}``, each ``{"role": system|user|assistant|tool,
      "content": str, ...}`` (other keys, such as ``tools``, ``tool_calls``, ``reasoning_content``, are kept);
    * ``"dpo"``: ``{"chosen": [messages], "rejected": [messages]}``;
    * ``"rlaif"``: ``{"conversations": [...prompt turns, {"role": "assistant", ...}]}`` (upstream
      leaves the last reply empty: the policy writes it)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    where = _where(path, line)
    if not isinstance(record, dict):
        raise ValueError(f"{where} is a JSON {type(record).__name__}, not an object: JSON lines hold one record "
                         "({...}) per line.")
    if kind == "pretrain":
        if TEXT_FIELD not in record:
            keys = ", ".join(repr(k) for k in list(record)[:5]) or "none"
            raise ValueError(f"{where} has no 'text' (its keys: {keys}); pretraining reads upstream's "
                             "{\"text\": ...} lines." + _format_hint(record))
        if not isinstance(record[TEXT_FIELD], str):
            raise ValueError(f"{where}: 'text' must be a string, got {type(record[TEXT_FIELD]).__name__}.")
    elif kind in ("sft", "rlaif"):
        if "conversations" not in record:
            raise ValueError(f"{where} has no 'conversations' (its keys: {', '.join(map(repr, list(record)[:5]))}); "
                             f"upstream's {kind.upper()} format is {{\"conversations\": [{{\"role\": ..., \"content\": "
                             "...}, ...]}." + (_format_hint(record) if "conversations" not in record and "text" not in
                                              record else (" It holds 'text': pretraining data." if "text" in record
                                                           else "")))
        _check_messages(record["conversations"], where, "conversations")
        if kind == "rlaif" and record["conversations"][-1].get("role") != "assistant":
            raise ValueError(f"{where}: the last turn of an RLAIF record is the assistant's (its content the reference "
                             f"answer, or empty), got role {record['conversations'][-1].get('role')!r}.")
    else:
        for side in ("chosen", "rejected"):
            if side not in record:
                raise ValueError(f"{where} has no '{side}'; upstream's DPO format is {{\"chosen\": [messages], "
                                 "\"rejected\": [messages]}." + _format_hint({k: 0 for k in record if k != side}))
            _check_messages(record[side], where, side)
    return record


def _parse_line(raw: bytes, kind: Optional[str], path: str, line: Callable[[], int]) -> Dict[str, Any]:
    """One line's record, checked against ``kind`` (None: any JSON object). ``line()`` gives the
    line's number, asked for only when the line is malformed (counting lines costs a read)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}:{line()} is not UTF-8 text ({err.reason} at byte {err.start} of the line); JSON lines "
                         "are UTF-8: re-save the file as UTF-8.") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{line()} is not valid JSON ({err}); a truncated download or an edit gone wrong?") from None
    if kind is None:
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{line()} is a JSON {type(record).__name__}, not an object: JSON lines hold one "
                             "record ({...}) per line.")
        return record
    try:
        return check_record(record, kind, path, 0)
    except ValueError as err:
        raise ValueError(str(err).replace(f"{path}:0", f"{path}:{line()}", 1)) from None


def _line_number(path: str, offset: int) -> int:
    """The 1-based number of the line that starts at byte ``offset``."""
    count, done = 0, 0
    with open(path, "rb") as f:
        while done < offset:
            block = f.read(min(1 << 22, offset - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count + 1


def _lines(f: Any, start: int, end: Optional[int]) -> Iterator[Tuple[int, bytes]]:
    """``(offset, line)`` of every line that starts in ``[start, end)`` (``start`` is a line start)."""
    f.seek(start)
    pos = start
    while end is None or pos < end:
        raw = f.readline()
        if not raw:
            return
        yield pos, raw
        pos += len(raw)


def _numbered(path: str) -> Iterator[Tuple[int, int, bytes]]:
    """``(line number, offset, content)`` of every non-blank line of a file, streamed."""
    with open(path, "rb") as f:
        for number, (pos, raw) in enumerate(_lines(f, 0, None), 1):
            content = _content(pos, raw)
            if content:
                yield number, pos, content


def _content(pos: int, raw: bytes) -> bytes:
    return (raw[len(_BOM):] if pos == 0 and raw.startswith(_BOM) else raw).strip()


class JsonlRecords(Sequence):
    """The records of a JSON-lines file, read one at a time: a ``Sequence`` of dicts that never
    holds the file in memory.

    Building it reads the file once, keeping only where each non-blank line starts (an ``int64``
    per record). ``records[i]`` seeks to line ``i``, parses it and checks it against ``kind``
    (``check_record``; None: any JSON object); iterating streams the file in order. A malformed
    line is a ``ValueError`` naming the file and its line number, raised when that record is read
    (``validate()`` reads them all once, streaming). Pass it wherever a list of records is taken
    (``sft.SFTDataset``, ``dpo.DPODataset``, ``grpo.RLPromptDataset``)."""

    def __init__(self, path: str, kind: Optional[str] = None) -> None:
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}.")
        self.path, self.kind = expand(path), kind
        if data_format(self.path) != "jsonl":
            raise ValueError(f"{path}: JsonlRecords reads JSON lines (a .jsonl file), one record per line.")
        starts = array.array("q")
        with open(self.path, "rb") as f:
            for pos, raw in _lines(f, 0, None):
                if _content(pos, raw):
                    starts.append(pos)
        self.starts = np.frombuffer(starts, dtype=np.int64) if starts else np.zeros(0, np.int64)
        self._file: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.starts)

    def _handle(self) -> Any:
        if self._file is None or self._pid != os.getpid():  # a forked worker opens its own
            self._file, self._pid = open(self.path, "rb"), os.getpid()
        return self._file

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= int(i) < n:
            raise IndexError(f"record index {i!r} out of range for {n} records of {self.path}.")
        pos = int(self.starts[int(i)])
        f = self._handle()
        f.seek(pos)
        return _parse_line(_content(pos, f.readline()), self.kind, self.path, lambda: _line_number(self.path, pos))

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for number, _, content in _numbered(self.path):
            yield _parse_line(content, self.kind, self.path, lambda: number)

    def close(self) -> None:
        """Close the file handle ``records[i]`` keeps open (reopened when needed)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def validate(self) -> "JsonlRecords":
        """Read and check every record once (streaming); returns ``self``."""
        for _ in self:
            pass
        return self

    def __getstate__(self) -> Dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": -1}

    def __repr__(self) -> str:
        return f"JsonlRecords({self.path!r}, kind={self.kind!r}, {len(self)} records)"


class RecordStore:
    """A list of encoded examples (each a tuple of ``fields`` integer sequences, e.g. ``(ids, labels)``)
    kept in an unnamed temporary file instead of in memory: Python lists cost about 36 bytes a token,
    this 4 (``int32``) on disk and nothing in memory but 8 + 4 * ``fields`` bytes an example.

    It answers what ``sft.SFTDataset`` and ``dpo.DPODataset`` ask of their list of examples
    (``append``, ``extend``, ``len``, indexing, iteration), and gives the same tuples of lists back,
    so a dataset built over it is the same dataset (the same fingerprint). The file has no name (it
    disappears with the store, even after a crash); ``example_list`` picks it for records read from
    a file (``JsonlRecords``)."""

    def __init__(self, fields: int) -> None:
        if isinstance(fields, bool) or not isinstance(fields, int) or fields < 1:
            raise ValueError(f"fields must be a whole number >= 1, got {fields!r}.")
        self.fields = fields
        self._file = tempfile.TemporaryFile(prefix="minimind_store_")
        self._starts = array.array("q")  # byte offset of each example
        self._lengths = array.array("l")  # fields lengths per example
        self._size = 0  # bytes written or buffered
        self._buffer = bytearray()

    def append(self, item: Sequence[Sequence[int]]) -> None:
        if len(item) != self.fields:
            raise ValueError(f"a RecordStore of {self.fields} fields got an example of {len(item)}.")
        self._starts.append(self._size)
        for seq in item:
            raw = np.asarray(seq, dtype=np.int32).tobytes()
            self._lengths.append(len(raw) // 4)
            self._buffer += raw
            self._size += len(raw)
        if len(self._buffer) >= 1 << 20:
            self._flush()

    def extend(self, items: Any) -> None:
        for item in items:
            self.append(item)

    def _flush(self) -> None:
        if self._buffer:
            self._file.seek(0, os.SEEK_END)
            self._file.write(self._buffer)
            self._file.flush()
            self._buffer = bytearray()

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: Any) -> Tuple[List[int], ...]:
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= int(i) < n:
            raise IndexError(f"example index {i!r} out of range for {n} examples.")
        i = int(i) % n
        self._flush()
        lengths = self._lengths[i * self.fields : (i + 1) * self.fields]
        raw = os.pread(self._file.fileno(), 4 * sum(lengths), self._starts[i])
        values = np.frombuffer(raw, dtype=np.int32)
        out, at = [], 0
        for length in lengths:
            out.append(values[at : at + length].tolist())
            at += length
        return tuple(out)

    def __iter__(self) -> Iterator[Tuple[List[int], ...]]:
        for i in range(len(self)):
            yield self[i]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()


def example_list(records: Any, fields: int) -> Any:
    """Where a dataset keeps its encoded examples: a ``RecordStore`` (on disk) for records read from
    a file (``JsonlRecords``), a plain list otherwise."""
    return RecordStore(fields) if isinstance(records, JsonlRecords) else []


def iter_texts(path: str) -> Iterator[str]:
    """The ``text`` of every record of a pretraining file (``.jsonl`` or ``.parquet``), streamed
    and checked."""
    fmt = data_format(path)
    path = expand(path)
    if fmt == "jsonl":
        for number, _, content in _numbered(path):
            yield _parse_line(content, "pretrain", path, lambda: number)[TEXT_FIELD]
    elif fmt == "parquet":
        pf = _parquet_file(path)
        row = 0
        for group in range(pf.num_row_groups):
            for text in pf.read_row_group(group, columns=[TEXT_FIELD]).column(0).to_pylist():
                row += 1
                yield _checked_parquet_text(text, path, row)
    else:
        raise ValueError(f"{path}: iter_texts reads .jsonl or .parquet files; read text files with "
                         "data.read_text_documents.")


def count_documents(path: str) -> int:
    """How many documents a ``.jsonl`` (non-blank lines) or ``.parquet`` (rows) file holds, without
    parsing them."""
    fmt = data_format(path)
    path = expand(path)
    if fmt == "parquet":
        return int(_parquet_file(path).metadata.num_rows)
    count = 0
    with open(path, "rb") as f:
        for pos, raw in _lines(f, 0, None):
            count += bool(_content(pos, raw))
    return count


# ---------------------------------------------------------------------- parquet
def _parquet_file(path: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow: pip install 'minimind-ref[data]' (or pip install pyarrow; "
                          "Colab has it). JSON lines (.jsonl) need nothing more.") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises its own ArrowInvalid
        raise ValueError(f"{path} is not a readable Parquet file ({err}).") from None
    names = pf.schema_arrow.names
    if TEXT_FIELD not in names:
        raise ValueError(f"{path} has no 'text' column (its columns: {', '.join(names[:8])}); pretraining reads a "
                         "'text' column, as upstream's {\"text\": ...} lines.")
    return pf


def _checked_parquet_text(text: Any, path: str, row: int) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{path}: row {row}'s 'text' must be a string, got {type(text).__name__}.")
    return text


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
    used its thread pool would otherwise print a warning (the workers encode single-threaded anyway)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
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
                for pos, raw in _lines(f, task.start, task.end):
                    content = _content(pos, raw)
                    if not content:
                        continue
                    try:
                        text = _parse_line(content, "pretrain", task.path, lambda: 0)[TEXT_FIELD]
                    except ValueError as err:  # the line's number is counted by the parent
                        return {"error": str(err), "offset": pos}
                    add(text, out)
        else:
            pf = _parquet_file(task.path)
            row = task.first_row
            for group in range(task.start, task.end):
                for text in pf.read_row_group(group, columns=[TEXT_FIELD]).column(0).to_pylist():
                    row += 1
                    try:
                        add(_checked_parquet_text(text, task.path, row), out)
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
            pf = _parquet_file(path)
            rows = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
            tasks = [_Task(path, fmt, g, g + 1, os.path.join(scratch, f"{g:06d}.bin"), first_row=sum(rows[:g]), **common)
                     for g in range(pf.num_row_groups)]
        results = _run_tasks(tasks, workers, progress, size if fmt == "jsonl" else len(tasks), fmt)
        for task, result in zip(tasks, results):
            if "error" in result:
                message = result["error"]
                if result.get("offset") is not None:  # the worker could not know the line's number
                    message = message.replace(f"{path}:0", f"{path}:{_line_number(path, result['offset'])}", 1)
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
    p = argparse.ArgumentParser(prog="python -m minimind_ref.datafiles",
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
