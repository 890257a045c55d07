"""Run the benchmarks; write ``results/results.json``, ``results/performance_table.md`` and the
figures in ``results/figures/`` (what ``make bench`` does; the Performance page shows them).

    python -m benchmarks.run                  # everything (51 minutes on the 2-core AMD EPYC of the committed run)
    python -m benchmarks.run --quick          # shorter runs, to try the harness (not for the page)
    python -m benchmarks.run --only decode,moe --merge   # re-measure some sections, keep the others
    python -m benchmarks.run --only generations --merge  # MiniMind2 beside minimind-3 (benchmark 9)

With ``--merge`` the kept sections keep the environment and date of the run that measured them, and
each re-measured one records its own in ``separate_runs`` (the page names them).

Every timing is a median of at least five interleaved repetitions with its range (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from minimind_ref.utils import pick_device, single_thread

from . import bench_decode, bench_hf, bench_moe, bench_norm, bench_notebooks, report
from .common import environment

SECTIONS = ["decode", "hf", "fast", "compile", "threads", "moe", "norm", "efficiency", "posttrain", "notebooks",
            "generations"]


def note_run(res: dict, todo: set, this_run: dict) -> None:
    """Record the environment and date of this run in ``res``: at the top when it measures every
    section that stays, else (``--merge`` keeping sections of an earlier run) per re-measured
    section in ``separate_runs``, leaving the earlier run's environment and date to its sections."""
    kept = set(res) & set(SECTIONS) - todo
    if kept and "environment" in res:
        res.setdefault("separate_runs", {}).update({section: this_run for section in sorted(todo)})
    else:
        res.update(this_run)
        res.pop("separate_runs", None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--merge", action="store_true", help="keep the sections of results.json that are not re-measured")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    todo = set(args.only.split(","))
    unknown = todo - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    path = report.RESULTS / "results.json"
    res: dict = json.loads(path.read_text()) if args.merge and path.exists() else {}
    note_run(res, todo, {"environment": environment(device), "date": datetime.date.today().isoformat()})
    if "decode" in todo:
        lengths = [32, 64, 128] if args.quick else [32, 64, 128, 256, 512]
        res["decode"] = bench_decode.cached_vs_uncached(device, lengths)
        print("decode done", flush=True)
    if "hf" in todo:
        res["hf"] = bench_hf.compare(device, decode_tokens=16 if args.quick else 64)
        print("hf done", flush=True)
    if "fast" in todo:
        from . import bench_fast

        res["fast"] = bench_fast.fast_decode(device, new_tokens=32 if args.quick else 128)
        print("fast done", flush=True)
    if "compile" in todo:
        from . import bench_compile

        res["compile"] = bench_compile.compiled_generate(device, new_tokens=16 if args.quick else 32)
        print("compile done", flush=True)
    if "threads" in todo:
        from . import bench_threads

        res["threads"] = bench_threads.thread_settings(device)
        print("threads done", flush=True)
    if "moe" in todo:
        res["moe"] = bench_moe.moe_layer(device)
        print("moe done", flush=True)
    if "norm" in todo:
        res["norm"] = bench_norm.norms(device)
        print("norm done", flush=True)
    if "efficiency" in todo:
        res["efficiency"] = bench_decode.decode_efficiency(device)
        print("efficiency done", flush=True)
    if "posttrain" in todo:
        from . import bench_posttrain

        with single_thread():  # as the chapters train these tiny models
            res["posttrain"] = bench_posttrain.posttrain_steps(device, quick=args.quick)
        print("posttrain done", flush=True)
    if "notebooks" in todo:
        res["notebooks"] = bench_notebooks.notebook_times()
    if "generations" in todo:
        from . import bench_generations

        with single_thread():  # one thread: on a shared 2-core machine two threads mostly wait for each other
            res["generations"] = bench_generations.generations(device, quick=args.quick)
        res["generations"]["torch_threads"] = 1
        print("generations done", flush=True)
    report.RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")
    res = json.loads(path.read_text())  # render what the tests will read back (string keys, lists)
    from . import figures

    written = figures.write_all(res, report.FIGURES)
    print(f"wrote {path}, {report.write(res)} and {len(written)} figures in {report.FIGURES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
