#!/usr/bin/env bash
# The default calibration on a lent GPU machine, measured there and finished here.
#
# On the device, in the repository's root, carrying .whl (calibrate/README, "To run it
# again on a lent GPU"):   bash calibrate/on_gpu.sh [FRONTENDS] [SEED]
# It installs the carried wheels where the stack is missing, logs nvidia-smi every 250 ms,
# runs the calibration with `--frontends FRONTENDS` (default 8), measuring and fitting only
# (draws=0: the prediction intervals are simulated afterwards, on any machine), and packs
# the folder into $OUT in parts under 16 MB. Here: cat the parts | tar xz, then
# `servesim calibrate refit DIR`. ROUNDS (default 10) shortens a trial; LIMIT_S (default
# 470) stops the calibration early enough that the packing fits the device's time limit.
set -u
FRONTENDS=${1:-8}
SEED=${2:-0}
ROUNDS=${ROUNDS:-10}
LIMIT_S=${LIMIT_S:-470}
OUT=${OUT:-/tmp/on_gpu_out}
DIR=/tmp/gpu-run
mkdir -p "$OUT" "$DIR"
if ! python3 -c "import simpy, fastapi, uvicorn" 2> /dev/null && [ -d .whl ]; then  # the stack, carried
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
SMI=
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.current.sm,utilization.gpu,clocks_event_reasons.active \
        --format=csv -lms 250 > "$DIR/nvidia-smi.csv" 2> /dev/null &
    SMI=$!
fi
# a file, not stdin: the speed meters and the server's processes are spawned, and re-import it
cat > /tmp/on_gpu.py << 'EOF'
import sys
import time
from pathlib import Path

from calibrate.run import Design, calibrate_run

if __name__ == "__main__":
    out, frontends, seed, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    args = ["--resolution", "64", "--width", "48", "--max-batch-size", "8", "--max-queue-delay-ms", "2"]
    t0 = time.time()
    calibrate_run([*args, "--frontends", frontends], out, design=Design(rounds=rounds), seed=seed, draws=0)
    print("wall", round(time.time() - t0, 1))
EOF
timeout "$LIMIT_S" python3 /tmp/on_gpu.py "$DIR" "$FRONTENDS" "$SEED" "$ROUNDS" 2>&1 | tee "$DIR/run.log"
[ -n "$SMI" ] && kill "$SMI"
tar czf - -C "$(dirname "$DIR")" "$(basename "$DIR")" | split -b 15M - "$OUT/gpu-run.tgz.part-"
ls -l "$OUT"
