"""Re-save the shipped stage files (minimind_ref/checkpoints/*.pt) so they carry the SHA-256 digests
of their weights and of their config and metadata, without retraining: the weights, the config
and the recorded metadata stay as they are (bit for bit), only the digests are added (issue 30).

    .venv/bin/python tools/add_stage_digests.py          # re-save every stage that lacks a digest
    .venv/bin/python tools/add_stage_digests.py --check  # only report; exit 1 if one lacks it

Files written by ``python -m minimind_ref.stages rebuild`` already carry the digest; this tool is
for files made before it existed (run it again after merging stage files rebuilt elsewhere).
"""

from __future__ import annotations

import argparse
import sys

import torch

from minimind_ref.checkpoint import load_checkpoint
from minimind_ref.files import DIGEST_KEY, META_DIGEST_KEY, weights_digest
from minimind_ref.stages import available_stages, save_stage, stage_metadata, stage_path


def same(a, b) -> bool:
    """Deep equality of what torch.load returns (tensors compared by dtype and value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))  # NaN equals NaN here


def resave(name: str) -> str:
    path = stage_path(name)
    before = torch.load(path, map_location="cpu", weights_only=True)
    model = load_checkpoint(path, dtype=None)  # fp16 values, copied exactly into the model
    save_stage(model, name, dict(before["extra"]))
    after = torch.load(path, map_location="cpu", weights_only=True)
    old, new = before["state_dict"], after["state_dict"]
    if not same(old, new) or not same(after["config"], before["config"]):
        raise SystemExit(f"{path}: the re-saved weights or config differ from the original; restore it with git.")
    extra, previous = dict(after["extra"]), dict(before["extra"])
    previous.pop(DIGEST_KEY, None)
    if extra.pop(DIGEST_KEY) != after[DIGEST_KEY] or not same(extra, previous):
        raise SystemExit(f"{path}: the re-saved metadata differs from the original; restore it with git.")
    stage_metadata(name)  # verifies the new digest
    return f"{name}: weights bit-identical ({len(old)} tensors), digest {weights_digest(old)[:16]}..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report which stage files lack a digest")
    args = p.parse_args(argv)
    missing = []
    for name in available_stages():
        blob = torch.load(stage_path(name), map_location="cpu", weights_only=True)
        if (isinstance(blob.get(DIGEST_KEY), str) and isinstance(blob.get(META_DIGEST_KEY), str)
                and blob["extra"].get(DIGEST_KEY) == blob[DIGEST_KEY]):
            print(f"{name}: has its digest")
            continue
        missing.append(name)
        print(f"{name}: no digest" if args.check else resave(name))
    return 1 if args.check and missing else 0


if __name__ == "__main__":
    sys.exit(main())
