#!/usr/bin/env bash
# `make gpu-wheels`: what tools/gpu_check.sh carries to a GPU machine without network, into .gpu/
# (ignored by git; name it in the device tool's `carry`):
#   .gpu/wheels/      the jupyter kernel stack for CPython 3.12 on manylinux x86_64 (the GPU image's
#                     Python; its packages are listed in ../shared/TOOLCHAIN_NOTES.md "The GPU machine"),
#                     resolved with their dependencies, minus what that image already holds;
#   .gpu/tf4-wheels/  transformers 4.57.6, tokenizers 0.22.x, huggingface_hub 0.36.x (the second pass);
#   .gpu/upstream/    upstream d65ef2c's model/model_minimind.py (the training and decode comparison reads it
#                     at run time; it is never committed), from UPSTREAM_GIT (a clone of jingyaogong/minimind).
# About 35 MB in all; the device tool carries 64 MiB with the repository.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu}
PY=${PYTHON:-python3}
UPSTREAM_GIT=${UPSTREAM_GIT:-/work/.mirror/jingyaogong+minimind/repo}
PLATFORMS=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux1; do PLATFORMS+=(--platform "${p}_x86_64"); done
download() { "$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" "$@"; }

mkdir -p "$DEST/wheels" "$DEST/tf4-wheels" "$DEST/upstream"
download -d "$DEST/wheels" nbclient nbformat ipykernel ipywidgets pytest-timeout
# the GPU image holds these already (TOOLCHAIN_NOTES; the device tool's KINDS.md lists its packages)
for held in packaging psutil pygments python_dateutil six attrs typing_extensions jinja2 markupsafe tqdm \
            pyyaml pytest pluggy iniconfig; do
    rm -f "$DEST"/wheels/"$held"-*.whl "$DEST"/wheels/"${held//_/-}"-*.whl
done
download --no-deps -d "$DEST/tf4-wheels" "transformers==4.57.6" "tokenizers>=0.22,<0.23" "huggingface_hub>=0.36,<0.37"
if git -C "$UPSTREAM_GIT" rev-parse -q --verify d65ef2c^{commit} >/dev/null 2>&1; then
    git -C "$UPSTREAM_GIT" show d65ef2c:model/model_minimind.py > "$DEST/upstream/model_minimind_d65ef2c.py"
else
    echo "no upstream clone at UPSTREAM_GIT=$UPSTREAM_GIT: the upstream comparisons will be skipped" >&2
fi
du -sh "$DEST"/*
