"""How long each chapter takes, measured, and the sentences of the pages that say so.

    python tools/time_notebooks.py               # time every chapter ("Restart & Run All"), then --write
    python tools/time_notebooks.py 05 08         # re-time some chapters (same machine as the others)
    python tools/time_notebooks.py --write       # rewrite the marked blocks of the pages from the table
    python tools/time_notebooks.py --check       # exit 1 if a page's block differs (tests/test_book.py)

Each chapter runs top to bottom in a fresh kernel of this Python (kernel start included), from a
temporary copy, with torch's default thread count, as a learner's "Restart & Run All" would. The
measurements go to ``book/notebook_timings.json`` together with the machine they ran on (CPU model,
core count, torch threads, torch and Python versions, date) and the load average before and after:
a timing taken while other work shares the cores is not a chapter's time, so the tool refuses to
record one when the load exceeds half the cores (``--allow-busy`` records it labelled as taken on a
busy machine).

The pages state timings only between markers this tool writes, so every figure they quote comes
from the table and names the machine:

* ``<!-- notebook-timings: summary -->`` ... ``<!-- /notebook-timings -->`` in README.md,
  book/welcome.md, book/how_to_use.md and book/setup.md: one sentence;
* ``<!-- notebook-timings: table -->`` ... ``<!-- /notebook-timings -->`` in book/setup.md: the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TABLE = ROOT / "book" / "notebook_timings.json"
PAGES = ["README.md", "book/welcome.md", "book/how_to_use.md", "book/setup.md"]
BLOCK = re.compile(r"(<!-- notebook-timings: (?P<kind>summary|table) -->)(?P<body>.*?)(<!-- /notebook-timings -->)", re.S)
CELL_TIMEOUT_S = 1800
BUSY_LOAD_PER_CORE = 0.5


def machine() -> Dict[str, object]:
    import torch

    from minimind_ref.utils import device_name

    return {"device": device_name("cpu"), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__.split("+")[0], "python": platform.python_version(),
            "date": dt.date.today().isoformat()}


def time_notebook(path: Path) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="minimind_timing_") as folder:
        shutil.copy2(path, Path(folder) / path.name)
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": folder}})
        start = time.perf_counter()
        client.execute()
        return time.perf_counter() - start


def measure(paths: Sequence[Path], allow_busy: bool) -> Dict[str, object]:
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    if load_before > BUSY_LOAD_PER_CORE * cores and not allow_busy:
        raise SystemExit(f"the machine is busy (load average {load_before:.1f} on {cores} cores): timings taken now "
                         "would not be the chapters' times. Run again when it is idle, or pass --allow-busy to "
                         "record them labelled as taken on a busy machine.")
    sys.path.insert(0, str(ROOT / "tools"))
    import tempdir_guard

    scratch = tempdir_guard.make_private_tempdir("minimind-timings")  # the kernels' TMPDIR, removed after
    previous = os.environ.get("TMPDIR")
    tempdir_guard.use_tempdir(scratch)
    rows = {}
    try:
        for path in paths:
            seconds = time_notebook(path)
            rows[path.stem] = round(seconds, 1)
            print(f"{path.name}: {seconds:.1f} s", flush=True)
        left = tempdir_guard.leftovers(scratch)
        if left:
            print("warning: " + tempdir_guard.leftover_message(left, "the timed chapters"), flush=True)
    finally:
        tempdir_guard.remove(scratch)
        os.environ.pop(tempdir_guard.ENV, None)
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous
        tempfile.tempdir = None
    load_after = os.getloadavg()[0]
    busy = max(load_before, load_after) > BUSY_LOAD_PER_CORE * cores
    return {"machine": machine(), "load_average": [round(load_before, 2), round(load_after, 2)], "busy": busy,
            "seconds": rows}


def chapter(stem: str) -> str:
    return stem.split("_", 1)[0]


def fmt(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def summary(table: Dict[str, object]) -> str:
    """One sentence with the range of the chapter times, the outliers named, and the machine."""
    seconds: Dict[str, float] = table["seconds"]
    m = table["machine"]
    median = statistics.median(seconds.values())
    long = {k: v for k, v in seconds.items() if v > 2 * median}
    usual = [v for k, v in seconds.items() if k not in long]
    low, high = min(usual), max(usual)
    span = f"{low:.0f}–{high:.0f} s" if high < 100 else f"{fmt(low)}–{fmt(high)}"
    text = f"each chapter ran from top to bottom in {span}" if len(usual) > 1 else (
        f"a chapter ran from top to bottom in {fmt(usual[0])}")
    if long:
        text += " (" + ", ".join(f"chapter {chapter(k)}: {fmt(v)}" for k, v in sorted(long.items())) + ")"
    busy = ", on a machine busy with other work" if table.get("busy") else ""
    cpu = m["device"].split(", ")[0].removeprefix("CPU ")
    return (f"Measured on a {m['cores']}-core machine ({cpu}; torch {m['torch']}, {m['torch_threads']} threads, "
            f"{m['date']}{busy}): {text}.")


def table_markdown(table: Dict[str, object]) -> str:
    m = table["machine"]
    lines = ["| chapter | seconds |", "| --- | ---: |"]
    lines += [f"| {stem} | {sec:.1f} |" for stem, sec in sorted(table["seconds"].items())]
    lines.append("")
    lines.append(f"Machine: {m['device']} ({m['cores']} cores), Python {m['python']}, torch {m['torch']}, "
                 f"{m['date']}; load average {table['load_average'][0]} before and {table['load_average'][1]} after"
                 f"{' (busy: other work shared the cores)' if table.get('busy') else ''}. "
                 "Written by `make timings` (tools/time_notebooks.py).")
    return "\n".join(lines)


def render(kind: str, table: Optional[Dict[str, object]]) -> str:
    if table is None:
        return "\n(Chapter timings have not been measured yet: run `make timings`.)\n"
    return "\n" + (summary(table) if kind == "summary" else table_markdown(table)) + "\n"


def load_table() -> Optional[Dict[str, object]]:
    return json.loads(TABLE.read_text(encoding="utf-8")) if TABLE.exists() else None


def rewrite(text: str, table: Optional[Dict[str, object]]) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("kind"), table) + m.group(4), text)


def stale_pages(table: Optional[Dict[str, object]] = None) -> List[str]:
    table = table if table is not None else load_table()
    out = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        if not BLOCK.search(text):
            out.append(f"{page}: no <!-- notebook-timings: summary --> block")
        elif rewrite(text, table) != text:
            out.append(f"{page}: its timing block differs from book/notebook_timings.json")
    return out


def write_pages(table: Optional[Dict[str, object]]) -> None:
    for page in PAGES:
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, table)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"wrote the timing block(s) of {page}")


def select(names: Sequence[str]) -> List[Path]:
    chapters = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return chapters
    chosen = [p for p in chapters if any(p.stem == Path(n).stem or p.stem.startswith(Path(n).stem + "_") for n in names)]
    if not chosen:
        raise SystemExit(f"no chapter matches {list(names)}")
    return chosen


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="chapters to time (default: all)")
    parser.add_argument("--write", action="store_true", help="only rewrite the pages from book/notebook_timings.json")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's timing block is out of date")
    parser.add_argument("--allow-busy", action="store_true", help="record timings although the machine is busy")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        print("\n".join(stale) if stale else "timing blocks are up to date")
        return 1 if stale else 0
    if not args.write:
        new = measure(select(args.notebooks), args.allow_busy)
        old = load_table()
        if args.notebooks and old is not None:
            if old["machine"]["device"] != new["machine"]["device"]:
                raise SystemExit("the table was measured on another machine: time every chapter (no arguments)")
            old["seconds"].update(new["seconds"])
            old["busy"] = old.get("busy", False) or new["busy"]
            old["load_average"] = new["load_average"]
            new = old
        TABLE.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {TABLE.relative_to(ROOT)}")
    write_pages(load_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
