#!/usr/bin/env bash
# Soak test of the no-loss promise: kill -9 a `sweep --workers 2` on `tiny` at KILLS random moments
# (default 50; CI does 5), resuming in between, then check the store (tests/test_faults.py).
# Usage: bench/soak_kill.sh [KILLS]
set -euo pipefail
cd "$(dirname "$0")/.."
GFLBENCH_SOAK_KILLS="${1:-50}" python -m pytest -q tests/test_faults.py -k sigkill
