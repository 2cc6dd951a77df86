#!/usr/bin/env bash
# The LLM calibration on a lent GPU machine: measured there, predicted here.
#
# On the device, in the repository's root, carrying .whl (calibrate/README, "The tiny LLM
# engine on a lent GPU"):   bash calibrate/on_gpu_llm.sh [SEED]
# It installs the carried wheels where the stack is missing, runs the engine's model tests
# on CUDA (paged against dense attention, chunked batching, preemption and prefix reuse),
# logs nvidia-smi every 250 ms, measures the default design with the engine on CUDA
# (`servesim calibrate llm --device cuda --measure-only`: the profile, the aging, the knee,
# the held-out levels; about 7 minutes with AGE_S=30) and packs the folder into $OUT in parts under 16 MB. Here:
# `cat` the parts `| tar xz`, then
# `servesim calibrate refit FOLDER` predicts every held-out phase and writes the report.
# LIMIT_S (default 500) stops the measurement early enough for the packing; ROUNDS
# (default 3) shortens it (2: about 5 minutes); AGE_S (default 30, the CPU's default 90)
# is the overload that ages the engine first, short to fit a call; TESTS=0 leaves the CUDA
# tests out.
set -u
SEED=${1:-0}
LIMIT_S=${LIMIT_S:-500}
ROUNDS=${ROUNDS:-3}
AGE_S=${AGE_S:-30}
TESTS=${TESTS:-1}
OUT=${OUT:-/tmp/on_gpu_out}
DIR=/tmp/gpu-llm
mkdir -p "$OUT" "$DIR"
if ! python3 -c "import simpy, fastapi, uvicorn" 2> /dev/null && [ -d .whl ]; then # the stack, carried
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$DIR/gpu.txt"
if [ "$TESTS" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/test_llm_engine.py -k "dense or preemption" -rs 2>&1 | tee "$DIR/tests-cuda.log"
    [ "${PIPESTATUS[0]}" = 0 ] || { cp "$DIR"/*.log "$OUT"/; exit 1; }
fi
nvidia-smi --query-gpu=timestamp,clocks.current.sm,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 250 > "$DIR/nvidia-smi.csv" 2> /dev/null &
SMI=$!
timeout "$LIMIT_S" python3 -m servesim calibrate llm --device cuda --measure-only --seed "$SEED" --rounds "$ROUNDS" --age-s "$AGE_S" --out "$DIR" 2>&1 | tee "$DIR/run.log"
kill "$SMI"
tar czf - -C "$(dirname "$DIR")" "$(basename "$DIR")" | split -b 15M - "$OUT/gpu-llm.tgz.part-"
ls -l "$OUT"
