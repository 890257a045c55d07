"""Run the benchmarks and write ``results/results.json`` + ``results/performance_table.md``.

    python -m benchmarks.run            # everything (about 10-15 minutes on a 2-core CPU)
    python -m benchmarks.run --quick    # shorter decode lengths, no notebook timing
    python -m benchmarks.run --only decode,norm
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from minimind_ref.utils import pick_device

from . import bench_decode, bench_hf, bench_moe, bench_norm, bench_notebooks, report
from .common import environment


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="decode,hf,moe,norm,efficiency,notebooks")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    todo = set(args.only.split(","))
    res: dict = {"environment": environment(device), "date": datetime.date.today().isoformat()}
    if "decode" in todo:
        lengths = [128, 512] if args.quick else [128, 512, 1024]
        res["decode"] = bench_decode.cached_vs_uncached(device, lengths)
        print("decode", res["decode"], flush=True)
    if "hf" in todo:
        res["hf"] = bench_hf.compare(device)
        print("hf", res["hf"], flush=True)
    if "moe" in todo:
        res["moe"] = bench_moe.moe_layer(device)
        print("moe", res["moe"], flush=True)
    if "norm" in todo:
        res["norm"] = bench_norm.norms(device)
        print("norm", res["norm"], flush=True)
    if "efficiency" in todo:
        res["efficiency"] = bench_decode.decode_efficiency(device)
        print("efficiency", res["efficiency"], flush=True)
    if "notebooks" in todo and not args.quick:
        res["notebooks"] = bench_notebooks.notebook_times()
        print("notebooks", res["notebooks"], flush=True)
    report.RESULTS.mkdir(parents=True, exist_ok=True)
    (report.RESULTS / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {report.RESULTS / 'results.json'} and {report.write(res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
