#!/usr/bin/env bash
# The prepared device check (`make gpu-check`): on a GPU machine with no network, in under 8 minutes,
#   1. install from wheels carried beside the repository what the Python there lacks (the jupyter
#      kernel stack the chapter tests need; `make gpu-wheels` downloads them here into .gpu/);
#   2. the GPU benchmarks (benchmarks/gpu_check.py: bandwidth, the decode ladder, a training step);
#   3. the GPU suite (tests/test_gpu.py, `-m gpu`) with -v, a per-test timeout and --durations=0,
#      with the transformers and tokenizers installed there;
#   4. again, with transformers 4.57.6 / tokenizers 0.22 / huggingface_hub 0.36 first on the path
#      (.gpu/tf4-wheels), for the tests that touch them, while the time budget allows;
#   5. one log (gpu_check.log) and one JSON record (gpu_record.json) in the output folder (beside the
#      parts it is made of: bench.json, passes.json, junit-*.xml, chapters.jsonl): Python,
#      torch, transformers and GPU, per-test results and timings, each chapter's CUDA time beside its
#      CPU time, the benchmarks, and the list of what was not measured.
# Without CUDA it is a dry run: the GPU tests skip, the benchmarks run tiny models on the CPU, and
# the record says so ("dry_run": true).
#
#   tools/gpu_check.sh [OUTPUT_DIR]     # default: $OUT (the device tool's) or _build/gpu_check
# Environment: PYTHON (default python3), CARRY (the wheels folder, default .gpu), BUDGET (seconds for
# the whole check, default 450), TEST_TIMEOUT (seconds per test, default 180), WORKERS (default 6).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
OUT_DIR=$(mkdir -p "${1:-${OUT:-$ROOT/_build/gpu_check}}" && cd "${1:-${OUT:-$ROOT/_build/gpu_check}}" && pwd)
CARRY=${CARRY:-$ROOT/.gpu}
BUDGET=${BUDGET:-450}
TEST_TIMEOUT=${TEST_TIMEOUT:-180}
WORKERS=${WORKERS:-6}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/minimind_gpu_check.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
echo "== gpu_check: $(date -u +%FT%TZ), output in $OUT_DIR, budget ${BUDGET}s, per-test timeout ${TEST_TIMEOUT}s"

# --- 1. what this Python lacks, from the carried wheels (absolute paths: the notebook kernels start elsewhere)
install_missing() {  # install_missing WHEEL_DIR TARGET: every wheel whose distribution is not installed
    local wheels=$1 target=$2
    [ -d "$wheels" ] || { echo "   no wheel folder $wheels"; return 0; }
    mapfile -t missing < <("$PY" - "$wheels" <<'EOF'
import importlib.metadata as md, pathlib, re, sys
for whl in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
    try:
        md.version(name)
    except md.PackageNotFoundError:
        print(whl)
EOF
)
    if [ ${#missing[@]} -eq 0 ]; then echo "   nothing to install from $wheels"; return 0; fi
    echo "   installing ${#missing[@]} wheels into $target: ${missing[*]##*/}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "${missing[@]}"
}
echo "== 1. packages"
install_missing "$CARRY/wheels" "$SCRATCH/site" || echo "   wheel install FAILED"
export PYTHONPATH="$SCRATCH/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYDEVD_DISABLE_FILE_VALIDATION=1 MPLBACKEND=Agg
"$PY" - <<'EOF'
import importlib
for name in ("torch", "transformers", "tokenizers", "nbclient", "nbformat", "ipykernel", "ipywidgets", "pytest",
             "xdist", "pytest_timeout"):
    try:
        m = importlib.import_module(name)
        print(f"   {name} {getattr(m, '__version__', '')}")
    except Exception as err:
        print(f"   {name}: MISSING ({type(err).__name__}: {err})")
import torch
print("   CUDA:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (dry run)")
EOF
UPSTREAM=$(ls "$CARRY"/upstream/model_minimind_d65ef2c.py 2>/dev/null || true)

# --- 2. the benchmarks (the record is written after every measurement: a timeout keeps what was measured)
echo "== 2. benchmarks ($(left)s left)"
timeout -k 15 $(( $(left) / 2 )) "$PY" -m benchmarks.gpu_check bench --out "$OUT_DIR" ${UPSTREAM:+--upstream "$UPSTREAM"}
echo "   bench exit status $?"

# --- 3./4. the GPU suite, once per transformers major
PASSES="$OUT_DIR/passes.json"
echo "[" > "$PASSES"
run_pass() {  # run_pass NAME SECONDS [pytest selection args...]
    local name=$1 seconds=$2; shift 2
    local junit="junit-$name.xml" status
    if [ "$seconds" -lt 30 ]; then
        echo "   pass $name: not run, ${seconds}s left of the budget"
        printf '{"name": "%s", "status": "not run", "reason": "%ss left of the %ss budget", "junit": "%s"},\n' \
            "$name" "$seconds" "$BUDGET" "$junit" >> "$PASSES"
        return
    fi
    local tf
    tf=$("$PY" -c "import transformers, tokenizers; print(transformers.__version__, tokenizers.__version__)" 2>&1 | tail -1)
    echo "   pass $name (transformers, tokenizers: $tf), ${seconds}s"
    MINIMIND_GPU_PASS=$name MINIMIND_GPU_CHAPTER_LOG="$OUT_DIR/chapters.jsonl" \
    timeout -s INT -k 40 "$seconds" "$PY" -m pytest tests/test_gpu.py -m gpu -v -rs --durations=0 \
        -n "$WORKERS" --timeout "$TEST_TIMEOUT" -o addopts="-p no:cacheprovider" --junitxml "$OUT_DIR/$junit" "$@"
    status=$?
    printf '{"name": "%s", "status": %s, "versions": "%s", "workers": %s, "timeout_s": %s, "junit": "%s"},\n' \
        "$name" "$status" "$tf" "$WORKERS" "$TEST_TIMEOUT" "$junit" >> "$PASSES"
}
echo "== 3. GPU suite, the installed transformers ($(left)s left)"
run_pass installed $(( $(left) * 3 / 4 - 40 ))
echo "== 4. GPU suite, transformers 4.57.6 ($(left)s left)"
if [ -d "$CARRY/tf4-wheels" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SCRATCH/tf4" "$CARRY"/tf4-wheels/*.whl
    # the tests that read transformers or tokenizers: the chapters that name them, and training
    selection=$("$PY" - <<'EOF'
import pathlib
names = [p.stem for p in sorted(pathlib.Path("notebooks").glob("*.ipynb"))
         if any(w in p.read_text(encoding="utf-8") for w in ("transformers", "tokenizer"))]
print(" or ".join(names + ["training"]))
EOF
)
    PYTHONPATH="$SCRATCH/tf4:$PYTHONPATH" run_pass transformers4 $(( $(left) - 60 )) -k "$selection"
else
    echo "   no $CARRY/tf4-wheels (make gpu-wheels): pass not run"
    printf '{"name": "transformers4", "status": "not run", "reason": "no tf4-wheels carried", "junit": "junit-transformers4.xml"},\n' >> "$PASSES"
fi
sed -i '$ s/,$//' "$PASSES"
echo "]" >> "$PASSES"

# --- 5. the record
echo "== 5. record ($(left)s left)"
"$PY" -m benchmarks.gpu_check summarize --out "$OUT_DIR"
echo "== gpu_check done in $(( $(date +%s) - START ))s: $OUT_DIR/gpu_record.json, $OUT_DIR/gpu_check.log"
