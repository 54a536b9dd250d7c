#!/usr/bin/env bash
# GPU check: device tests, the round-time table and sweep throughput on CUDA, in under 8 minutes.
#
#   bash bench/gpu_check.sh                 # on the GPU machine; figures go to $OUT (or ./gpu_check_results)
#   DEVICE=cpu bash bench/gpu_check.sh      # smoke mode: tiny sizes, checks that every step still runs
#
# Steps (each under its own time limit, 615 s in all at worst, so one slow step cannot eat the others' budget):
#   1. tests: pytest on the device-agnostic test files with GFLBENCH_TEST_DEVICE set, which their
#      `device` fixture (tests/conftest.py) reads: runs, determinism per seed, backbones, methods.
#   2. parity: the same FedAvg and FedGMC runs on CPU and on the device must give the same test
#      values up to float rounding (|Δ| < 0.5 points after 5 rounds on Cora).
#   3. round-time table on the device (bench/round_time.py), merged into a CSV that can be copied
#      to bench/round_times.csv for `gflbench sweep --dry-run`.
#   3b. batched clients against the per-client path at 5 and 50 clients (bench/batched.py; 5 and 10 in smoke mode).
#   3c. seeds stacked in one process (--stack-seeds) against one run at a time (bench/stacked_seeds.py).
#   4. sweep throughput: local, fedavg and fedgmc on Cora, 17 seeds (51 runs), 4 workers, into a
#      temporary store; runs per minute.
# Figures go to $RESULTS (default $OUT/gpu_check.txt): one "name: value" line per figure, then the
# tables. The script exits 0 when every step passed, 1 otherwise; it stops no step's successors.
set -uo pipefail

cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-auto}
if [[ $DEVICE == auto ]]; then
    DEVICE=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
OUT_DIR=${OUT:-$PWD/gpu_check_results}
mkdir -p "$OUT_DIR"
RESULTS=${RESULTS:-$OUT_DIR/gpu_check.txt}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [[ $DEVICE == cuda* ]]; then
    DATASET=cora; CLIENTS=10; ROUNDS=20; SEEDS=17; WORKERS=4; PARITY_ROUNDS=5; SWEEP_ROUNDS=""; BATCH_COUNTS="5 50"
    TESTS="tests/test_runner.py tests/test_backbones.py tests/test_methods.py tests/test_stacking.py"
    METHODS=""  # the round-time table: every registered method
else  # smoke mode: every step at a size a busy CPU finishes in a minute or two
    DATASET=tiny; CLIENTS=5; ROUNDS=3; SEEDS=2; WORKERS=2; PARITY_ROUNDS=2; SWEEP_ROUNDS="--rounds 3"; BATCH_COUNTS="5 10"
    TESTS="tests/test_runner.py"
    METHODS="fedavg"
fi

status=0
note() { echo "$1: $2" | tee -a "$RESULTS"; }
step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log, record pass/fail and seconds
    local name=$1 limit=$2; shift 2
    local start end rc
    start=$(date +%s.%N)
    timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    note "$name.seconds" "$(python -c "print(f'{$end - $start:.1f}')")"
    if [[ $rc -eq 0 ]]; then note "$name.status" "pass"; else note "$name.status" "FAIL (exit $rc; 124 = over ${limit}s)"; status=1; fi
    return $rc
}

: > "$RESULTS"
note "device" "$DEVICE"
note "device_name" "$(python -c "import torch; print(torch.cuda.get_device_name() if '$DEVICE'.startswith('cuda') else 'cpu')")"
note "torch" "$(python -c 'import torch; print(torch.__version__, torch.version.cuda)')"
note "git_commit" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# 1. tests
# shellcheck disable=SC2086
GFLBENCH_TEST_DEVICE=$DEVICE step tests 90 python -m pytest -q -x $TESTS
note "tests.summary" "$(tail -n 1 "$WORK/tests.log")"

# 2. CPU / device parity
parity() {  # run by `timeout` through `bash -c`, hence exported with its variables below
    for dev in cpu "$DEVICE"; do
        gflbench run -m fedavg,fedgmc -d "$DATASET" --clients "$CLIENTS" --seeds 1 --rounds "$PARITY_ROUNDS" \
            --device "$dev" --store "$WORK/parity-$dev.sqlite" > /dev/null || return 1
    done
    python - "$WORK/parity-cpu.sqlite" "$WORK/parity-$DEVICE.sqlite" <<'EOF'
import sys
from gfl_bench.store import RunStore
cpu, dev = (RunStore(p).frame().set_index("method")["test"] for p in sys.argv[1:])
gap = (cpu - dev).abs()
print(gap.to_string())
sys.exit(0 if (gap < 0.005).all() else 1)
EOF
}
if [[ $DEVICE == cpu ]]; then
    note "parity.status" "skipped (no device to compare with the CPU)"
else
    export -f parity
    export DATASET CLIENTS DEVICE PARITY_ROUNDS WORK
    step parity 60 bash -c parity
    note "parity.gaps" "$(tail -n 2 "$WORK/parity.log" | tr '\n' ' ')"
fi

# 3. round-time table
# shellcheck disable=SC2086
step round_time 120 python bench/round_time.py --dataset "$DATASET" --clients "$CLIENTS" --rounds "$ROUNDS" \
    --device "$DEVICE" ${METHODS:+--methods $METHODS} --out "$OUT_DIR/round_times_$DEVICE.csv"

# 3b. batched clients against per-client on the device, 5 and 50 clients (the growth the speed goal bounds)
for count in $BATCH_COUNTS; do
    step "batched_$count" 60 python bench/batched.py --dataset "$DATASET" --clients "$count" --rounds 6 --repeats 2 \
        --methods fedavg,fedprox,gcfl,fedpub --device "$DEVICE"
done

# 3c. seeds stacked along a seed axis (one process, every client of every seed in one batched pass)
step stacked 45 python bench/stacked_seeds.py --dataset "$DATASET" --clients "$CLIENTS" --methods fedavg,fedgmc \
    --stack 1,4,16 --rounds 5 --device "$DEVICE"

# 4. sweep throughput
sweep_start=$(date +%s.%N)
# shellcheck disable=SC2086
step sweep 180 gflbench sweep -m local,fedavg,fedgmc -d "$DATASET" --clients "$CLIENTS" --seeds "$SEEDS" $SWEEP_ROUNDS \
    --workers "$WORKERS" --device "$DEVICE" --store "$WORK/sweep.sqlite"
sweep_end=$(date +%s.%N)
runs=$(python -c "
from gfl_bench.store import RunStore
f = RunStore('$WORK/sweep.sqlite').frame()
print(int((f['status'] == 'ok').sum()))" 2>/dev/null || echo 0)
note "sweep.runs_ok" "$runs"
note "sweep.runs_per_minute" "$(python -c "print(f'{$runs / (($sweep_end - $sweep_start) / 60):.1f}')")"

{
    echo
    echo "## round-time table ($DEVICE, $DATASET, $CLIENTS clients, $ROUNDS rounds)"
    cat "$WORK/round_time.log"
    echo
    echo "## batched clients against per-client ($DEVICE, $DATASET, ${BATCH_COUNTS// / and } clients)"
    for count in $BATCH_COUNTS; do cat "$WORK/batched_$count.log"; done
    echo
    echo "## seeds stacked in one process ($DEVICE, $DATASET, $CLIENTS clients)"
    cat "$WORK/stacked.log"
    echo
    echo "## logs of failed steps"
    for log in "$WORK"/*.log; do
        name=$(basename "$log" .log)
        if grep -q "^$name.status: FAIL" "$RESULTS"; then echo "### $name"; tail -n 30 "$log"; fi
    done
} >> "$RESULTS"
echo "figures in $RESULTS"
exit $status
