#!/usr/bin/env bash
# Every GPU figure of benchmarks/README.md in one command, in steps of under 10 minutes each (issue 25):
#   bash benchmarks/on_gpu.sh OUT_DIR [step ...]       steps: decode (default: all of them, in this order)
# Needs a CUDA GPU with torch and transformers; math-verify's wheels in .whl/ if it is not installed (README).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash benchmarks/on_gpu.sh OUT_DIR [step ...]}"; shift
mkdir -p "$out"
if ! python3 -c "import math_verify" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(decode spiral)
for step in "${steps[@]}"; do
    case "$step" in
    decode)  # CUDA checks; search- and aggregation-shaped rows (fast engine); the HF row 2 at 512; row 1 MFU
        timeout 420 python3 benchmarks/decode.py --gpu --new-tokens 512,4096 --hf-baseline 512 --mfu \
            --json "$out/decode.json" 2>&1 | tee "$out/decode.log" ;;
    spiral)  # row 4: one SPIRAL step (search, aggregation, training), fast engine, 1,024 new tokens
        timeout 170 python3 benchmarks/bench.py --only spiral --engine fast --skip-grpo --max-new-tokens 1024 \
            --json "$out/spiral.json" 2>&1 | tee "$out/spiral.log" ;;
    *) echo "on_gpu.sh: unknown step $step" >&2; exit 2 ;;
    esac
done
