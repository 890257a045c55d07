"""Upstream's data files: read them in their formats, record by record, and check every record.

Upstream MiniMind ships its datasets as JSON lines, one record per line (sizes from the READMEs'
file lists, ``c090b69:README_en.md:562-571`` and ``d65ef2c:README_en.md:494-501``):

* pretraining (``pretrain_hq.jsonl``, 1.6 GB, ``c090b69:README_en.md:565 "pretrain_hq.jsonl (1.6GB"``;
  ``pretrain_t2t_mini.jsonl``, 1.2 GB, ``d65ef2c:README_en.md:497 "pretrain_t2t_mini.jsonl (1.2GB"``):
  ``{"text": ...}``;
* SFT (``sft_mini_512.jsonl``, ``sft_t2t_mini.jsonl``, 1.6 GB, ``d65ef2c:README_en.md:500``) and RLAIF
  (``rlaif-mini.jsonl``, ``rlaif.jsonl``): ``{"conversations": [{"role": ..., "content": ...}, ...]}``;
* DPO (``dpo.jsonl``): ``{"chosen": [messages], "rejected": [messages]}``.

``data_format`` tells them from plain text by name (``.jsonl``, ``.parquet``; a ``.json`` file is
refused), ``check_text_file`` refuses a "text" file that is really JSON lines, and ``check_record``
checks one record against its kind: a malformed line is a ``ValueError`` naming the file and the
line number (and, for a record of another kind, which kind it is). Pretraining texts are streamed
by ``iter_texts`` (``.parquet``: the ``text`` column, read by row groups with ``pyarrow`` where it
is installed: Colab has it, ``pip install 'minimind-ref[data]'``) and tokenized once into
``token_cache``'s memory-mapped files.

**Post-training** files are read by ``JsonlRecords``: one pass records where each line starts (8
bytes per record), and each record is read, parsed and checked only when it is used, so a file is
never loaded whole. ``sft.SFTDataset``, ``dpo.DPODataset`` and ``grpo.RLPromptDataset`` take it
where they take a list of records; the first two then keep their encoded examples in a
``RecordStore`` (an unnamed temporary file) instead of Python lists. Measured on a generated SFT
file of 100,000 conversations (21.6 MiB): ``SFTDataset(load_jsonl(path), ...)`` grew the process by
360 MiB, ``SFTDataset(JsonlRecords(path, "sft"), ...)`` by 7 MiB. They still encode every
conversation in this one process, on every run (about 1,800 conversations a second on this 2-core
CPU, shared with other jobs).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .files import expand

KINDS = ("pretrain", "sft", "dpo", "rlaif")
ROLES = ("system", "user", "assistant", "tool")
TEXT_FIELD = "text"
_BOM = b"\xef\xbb\xbf"


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


def parse_line(raw: bytes, kind: Optional[str], path: str, line: Callable[[], int]) -> Dict[str, Any]:
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


def line_number(path: str, offset: int) -> int:
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


def lines_between(f: Any, start: int, end: Optional[int]) -> Iterator[Tuple[int, bytes]]:
    """``(offset, line)`` of every line that starts in ``[start, end)`` (``start`` is a line start)."""
    f.seek(start)
    pos = start
    while end is None or pos < end:
        raw = f.readline()
        if not raw:
            return
        yield pos, raw
        pos += len(raw)


def numbered_lines(path: str) -> Iterator[Tuple[int, int, bytes]]:
    """``(line number, offset, content)`` of every non-blank line of a file, streamed."""
    with open(path, "rb") as f:
        for number, (pos, raw) in enumerate(lines_between(f, 0, None), 1):
            content = line_content(pos, raw)
            if content:
                yield number, pos, content


def line_content(pos: int, raw: bytes) -> bytes:
    """A line's bytes without the surrounding whitespace (and without a byte-order mark at the file's start)."""
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
            for pos, raw in lines_between(f, 0, None):
                if line_content(pos, raw):
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
        return parse_line(line_content(pos, f.readline()), self.kind, self.path, lambda: line_number(self.path, pos))

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for number, _, content in numbered_lines(self.path):
            yield parse_line(content, self.kind, self.path, lambda: number)

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
        for number, _, content in numbered_lines(path):
            yield parse_line(content, "pretrain", path, lambda: number)[TEXT_FIELD]
    elif fmt == "parquet":
        pf = parquet_file(path)
        row = 0
        for group in range(pf.num_row_groups):
            for text in pf.read_row_group(group, columns=[TEXT_FIELD]).column(0).to_pylist():
                row += 1
                yield checked_text(text, path, row)
    else:
        raise ValueError(f"{path}: iter_texts reads .jsonl or .parquet files; read text files with "
                         "data.read_text_documents.")


def count_documents(path: str) -> int:
    """How many documents a ``.jsonl`` (non-blank lines) or ``.parquet`` (rows) file holds, without
    parsing them."""
    fmt = data_format(path)
    path = expand(path)
    if fmt == "parquet":
        return int(parquet_file(path).metadata.num_rows)
    count = 0
    with open(path, "rb") as f:
        for pos, raw in lines_between(f, 0, None):
            count += bool(line_content(pos, raw))
    return count


# ---------------------------------------------------------------------- parquet
def parquet_file(path: str) -> Any:
    """``pyarrow.parquet.ParquetFile`` of a pretraining file, checked to have a ``text`` column."""
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


def checked_text(text: Any, path: str, row: int) -> str:
    """A Parquet row's ``text``, which must be a string (row ``row``, 1-based, named otherwise)."""
    if not isinstance(text, str):
        raise ValueError(f"{path}: row {row}'s 'text' must be a string, got {type(text).__name__}.")
    return text
