#!/usr/bin/env bash
# GPU check: measures the benchmark on CUDA in under 8 minutes, or, with --smoke, runs every step on the CPU
# at tiny sizes in a minute or two (CI runs that, so the script cannot rot).
#
#   bash bench/gpu_check.sh [--mirror DIR]            # on the GPU machine; results in $OUT (or ./gpu_check_results)
#   bash bench/gpu_check.sh --smoke [--mirror DIR]    # on any CPU
#
# DIR is a folder of raw dataset files in PyG's layout (Cora/, minesweeper/), default $GFLBENCH_RAW_MIRROR,
# else shared/data in this checkout, else ../shared/data. The device machine has no internet: copy the two
# folders (720 KB) into this checkout's shared/data before the call, which travels with the working tree
# (docs/gpu.md). GFLBENCH_DATA is a fresh folder per check, so every file is copied and checked again.
#
# On a machine where gflbench is not installed (the device image has torch, PyG, pandas, typer, pytest), the
# script installs this checkout without dependencies, after the wheels of what the image lacks (pymetis, POT,
# ogb, optuna, scikit-posthocs) if a .whl folder holds them (docs/gpu.md, "Running the check").
#
# Steps, each in its own time limit (the limits add up to 450 s; a step that fails or overruns is reported
# and the next one runs), every measurement written as a CSV row the moment it exists:
#   1. tests      the device-agnostic tests with GFLBENCH_TEST_DEVICE=cuda (pytest without -x): passed / failed
#   2. parity     every method, Cora METIS-5, 3 rounds, dropout 0, on the CPU and on the device: |test difference|
#                 within PARITY_TOLERANCE points, or "draws on device" for the methods whose own sampling uses
#                 the device's generator (another stream than the CPU's; listed in docs/gpu.md), reported only
#   3. per-client seconds per round of every method, Cora METIS-10 (bench/round_time.py, its CSV row per method)
#   4. batched    the same for every batchable method with --batched
#   5. clients    FedAvg and FedGMC, batched, at 5, 10, 20 and 50 clients
#   6. minesweeper FedAvg and FedGMC per-client, METIS-10 (a heterophilic graph with dense features)
#   7. sweep      runs per hour at 1, 2, 4 and 8 workers (2 x workers runs of FedAvg, Cora METIS-10, 20 rounds),
#                 and the hours a 50-run sweep of such runs takes at each
# Then one summary table (summary.txt); all CSVs and logs stay in the results folder. Exit 0 when every
# step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
MIRROR=${GFLBENCH_RAW_MIRROR:-}
while [[ $# -gt 0 ]]; do
    case $1 in
        --smoke) SMOKE=1 ;;
        --mirror) MIRROR=$2; shift ;;
        *) echo "error: unknown argument $1; use --smoke and --mirror DIR" >&2; exit 2 ;;
    esac
    shift
done
if [[ -z $MIRROR ]]; then
    if [[ -d shared/data ]]; then MIRROR=$PWD/shared/data; else MIRROR=$(cd .. && pwd)/shared/data; fi
fi
if [[ ! -d $MIRROR/Cora ]]; then
    echo "error: no raw mirror with Cora/ at $MIRROR; give --mirror DIR (docs/gpu.md says how the files travel)" >&2
    exit 2
fi
export GFLBENCH_RAW_MIRROR=$MIRROR
RESULTS=${OUT:-$PWD/gpu_check_results}
mkdir -p "$RESULTS"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export GFLBENCH_DATA=$WORK/data OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
command -v "$PY" > /dev/null || PY=python
if ! "$PY" -c "import importlib.metadata as m; m.version('gflbench')" 2> /dev/null; then
    if [[ -d .whl ]]; then "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 2; fi
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
fi
GFLBENCH=("$PY" cli.py)

PARITY_TOLERANCE=1.0  # points of client-mean test accuracy after 3 rounds at dropout 0 (float summation order only)
if [[ $SMOKE == 1 ]]; then
    DEVICE=cpu; DATASET=tiny; CLIENTS=5; ROUNDS=3; CLIENT_COUNTS="5 10"; WORKER_COUNTS="1 2"; SWEEP_ROUNDS=3
    TESTS="tests/test_runner.py::test_record_reports_test_at_best_validation_round"
    METHODS="local,fedavg"; BATCHED_METHODS="fedavg"; PARITY_METHODS="fedavg fedgmc"; PARITY_DATASET=tiny
    # caps, generous for a busy CI runner (about two minutes in all on an idle 2-core machine)
    LIMIT_TESTS=180; LIMIT_PARITY=180; LIMIT_TIMES=180; LIMIT_BATCHED=180; LIMIT_CLIENTS=180; LIMIT_SWEEP=(180 180)
else
    DEVICE=cuda; DATASET=cora; CLIENTS=10; ROUNDS=6; CLIENT_COUNTS="5 10 20 50"; WORKER_COUNTS="1 2 4 8"; SWEEP_ROUNDS=20
    TESTS="tests/test_runner.py tests/test_backbones.py tests/test_methods.py tests/test_stacking.py tests/test_fedsage.py tests/test_fedssa.py"
    METHODS=""; BATCHED_METHODS=""; PARITY_METHODS=""; PARITY_DATASET=cora
    # 80 + 65 + 70 + 35 + 4 x 15 + 15 + (25 + 30 + 30 + 40) = 450 s
    LIMIT_TESTS=80; LIMIT_PARITY=65; LIMIT_TIMES=70; LIMIT_BATCHED=35; LIMIT_CLIENTS=15; LIMIT_MINE=15
    LIMIT_SWEEP=(25 30 30 40)
fi
[[ -z $METHODS ]] && METHODS=$($PY -c "from gflbench.core.method import all_methods; print(','.join(sorted(all_methods())))")
[[ -z $BATCHED_METHODS ]] && BATCHED_METHODS=$($PY -c "
from gflbench.core.method import all_methods; print(','.join(sorted(m for m, c in all_methods().items() if c.batchable)))")
[[ -z $PARITY_METHODS ]] && PARITY_METHODS=${METHODS//,/ }

status=0
: > "$RESULTS/steps.csv"
echo "step,status,seconds" > "$RESULTS/steps.csv"
step() {  # step NAME LIMIT COMMAND...: run it in its limit, log it, record status and seconds
    local name=$1 limit=$2; shift 2
    local start=$SECONDS rc
    timeout "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    rc=$?
    local outcome=pass
    if [[ $rc -ne 0 ]]; then outcome="FAIL exit $rc$([[ $rc -eq 124 ]] && echo " (over ${limit} s)")"; status=1; fi
    echo "$name,$outcome,$((SECONDS - start))" >> "$RESULTS/steps.csv"
    echo "$name: $outcome in $((SECONDS - start)) s"
}

echo "device $DEVICE, dataset $DATASET, mirror $MIRROR, results $RESULTS"
$PY - <<EOF | tee "$RESULTS/machine.txt"
import os, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name() if "$DEVICE" == "cuda" and torch.cuda.is_available() else "cpu", "cores", os.cpu_count())
EOF

# 1. tests, never -x: every failure is counted, and later files still run
# shellcheck disable=SC2086
GFLBENCH_TEST_DEVICE=$DEVICE step tests $LIMIT_TESTS $PY -m pytest -v -p no:cacheprovider $TESTS

# 2. parity at dropout 0, one method at a time, a row per method as it finishes
step parity $LIMIT_PARITY $PY - "$RESULTS/parity.csv" "$DEVICE" "$PARITY_DATASET" "$PARITY_TOLERANCE" $PARITY_METHODS <<'EOF'
"""Each method on the CPU and on the device, dropout 0 (and UniFilter's filter dropout 0): the same initial
model (built on the CPU, moved), no dropout draws, so the test values differ by float summation order only,
unless the method samples from the device's generator (DRAWS_ON_DEVICE, read from the code: FedSage+'s
NeighGen noise and hidden nodes, FedSSA's reparameterisation, FedIIH's negative samples and noise; every
other method's own sampling uses CPU generators): those are reported, not judged."""
import csv, dataclasses, sys, torch
from gflbench.data import default_data_dir
from gflbench.core.method import method_class
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec
out, device, dataset, tolerance, methods = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5:]
DRAWS_ON_DEVICE = {"fedsage+", "fedssa", "fediih"}
torch.set_num_threads(4)
root = default_data_dir()
data = DataCache(root, root / "partitions").federated(dataset, "metis", 5, 1234)
failed = 0
with open(out, "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["method", "cpu_test", "device_test", "abs_diff_points", "verdict"])
    for method in methods:
        try:
            fields = {f.name for f in dataclasses.fields(method_class(method).Params)}
            off = {name: "0" for name in ("dropout", "filter_dropout", "gen_dropout") if name in fields}
            spec = make_spec(method, dataset, "metis", 5, 0, off, rounds=3)
            cpu = run(spec, data, torch.device("cpu"))["test"] * 100
            dev = run(spec, data, torch.device(device))["test"] * 100
            diff = abs(cpu - dev)
            verdict = "draws on device" if method in DRAWS_ON_DEVICE and device != "cpu" else (
                "pass" if diff <= tolerance else "FAIL")
            row = [method, f"{cpu:.2f}", f"{dev:.2f}", f"{diff:.3f}", verdict]
        except Exception as error:  # noqa: BLE001 - a crash is this method's row; the others still run
            row = [method, "", "", "", f"FAILED: {type(error).__name__}: {error}"[:200]]
        failed += row[-1] != "pass" and row[-1] != "draws on device"
        writer.writerow(row)
        handle.flush()
        print(*row, flush=True)
sys.exit(1 if failed else 0)
EOF

# 3-6. seconds per round (bench/round_time.py writes its CSV row per method as each finishes)
step per_client $LIMIT_TIMES $PY bench/round_time.py --dataset "$DATASET" --clients "$CLIENTS" --rounds "$ROUNDS" \
    --device "$DEVICE" --methods "$METHODS" --out "$RESULTS/per_client.csv"
step batched $LIMIT_BATCHED $PY bench/round_time.py --dataset "$DATASET" --clients "$CLIENTS" --rounds "$ROUNDS" \
    --device "$DEVICE" --methods "$BATCHED_METHODS" --batched --out "$RESULTS/batched.csv"
for count in $CLIENT_COUNTS; do
    step "clients_$count" $LIMIT_CLIENTS $PY bench/round_time.py --dataset "$DATASET" --clients "$count" --rounds 4 \
        --device "$DEVICE" --methods fedavg,fedgmc --batched --out "$RESULTS/clients.csv"
done
if [[ $SMOKE == 0 && -d $MIRROR/minesweeper ]]; then
    step minesweeper $LIMIT_MINE $PY bench/round_time.py --dataset minesweeper --clients 10 --rounds 4 \
        --device "$DEVICE" --methods fedavg,fedgmc --out "$RESULTS/minesweeper.csv"
fi

# 7. sweep throughput: 2 x W runs at W workers, each into its own store
echo "workers,runs,seconds,runs_per_hour,hours_for_50_runs" > "$RESULTS/sweep.csv"
index=0
for workers in $WORKER_COUNTS; do
    start=$SECONDS
    step "sweep_$workers" "${LIMIT_SWEEP[$index]}" "${GFLBENCH[@]}" sweep -m fedavg -d "$DATASET" --clients "$CLIENTS" --seeds $((2 * workers)) \
        --rounds "$SWEEP_ROUNDS" --workers "$workers" --device "$DEVICE" --store "$WORK/sweep_$workers.sqlite"
    seconds=$((SECONDS - start)); index=$((index + 1))
    runs=$($PY -c "
from gflbench.experiments.store import RunStore
print(int((RunStore('$WORK/sweep_$workers.sqlite').frame()['status'] == 'ok').sum()))" 2>/dev/null || echo 0)
    $PY -c "
runs, seconds = $runs, max($seconds, 1)
per_hour = runs / seconds * 3600
print(f'$workers,{runs},{seconds},{per_hour:.0f},{50 / per_hour if per_hour else float(\"nan\"):.3f}')" >> "$RESULTS/sweep.csv"
done

# the summary: one table
$PY - "$RESULTS" "$DEVICE" "$DATASET" "$CLIENTS" "$SWEEP_ROUNDS" <<'EOF' | tee "$RESULTS/summary.txt"
import re, sys
from pathlib import Path
import pandas as pd
results, device, dataset, clients, rounds = Path(sys.argv[1]), *sys.argv[2:]
def read(name):
    path = results / name
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()
print("machine:", (results / "machine.txt").read_text().strip())
log = (results / "tests.log").read_text() if (results / "tests.log").is_file() else ""
count = lambda word: len(re.findall(rf"::\S+ {word}", log))
print(f"CUDA tests ({device}): {count('PASSED')} passed, {count('FAILED')} failed, {count('ERROR')} errors, {count('SKIPPED')} skipped")
steps = read("steps.csv")
print("steps:", ", ".join(f"{r.step} {r.status} {r.seconds}s" for r in steps.itertuples()))
per_client, batched, parity = read("per_client.csv"), read("batched.csv"), read("parity.csv")
table = pd.DataFrame({"method": sorted(set(per_client.get("method", [])) | set(parity.get("method", [])))})
if len(per_client):
    table = table.merge(per_client[["method", "seconds_per_round", "peak_mb"]].rename(
        columns={"seconds_per_round": "per-client s/round", "peak_mb": "peak MB"}), on="method", how="left")
if len(batched):
    table = table.merge(batched[["method", "seconds_per_round"]].rename(columns={"seconds_per_round": "batched s/round"}),
                        on="method", how="left")
if len(parity):
    table = table.merge(parity[["method", "abs_diff_points", "verdict"]].rename(
        columns={"abs_diff_points": "parity |diff| pts", "verdict": "parity"}), on="method", how="left")
print(table.to_string(index=False, na_rep="-"))
by_count = read("clients.csv")
if len(by_count):
    print("\nbatched s/round by client count:")
    print(by_count.pivot_table(index="method", columns="clients", values="seconds_per_round").to_string())
mine = read("minesweeper.csv")
if len(mine):
    print("\nminesweeper METIS-10, per-client s/round:", ", ".join(f"{r.method} {r.seconds_per_round}" for r in mine.itertuples()))
if "context_mb" in per_client:
    print(f"\nCUDA context: {per_client['context_mb'].max():.0f} MB per process")
sweep = read("sweep.csv")
if len(sweep):
    print(f"\nsweep (fedavg, {dataset} METIS-{clients}, {rounds} rounds per run, 2 x workers runs):")
    print(sweep.to_string(index=False))
EOF
[[ $? -eq 0 ]] || status=1
echo "results in $RESULTS"
exit $status
