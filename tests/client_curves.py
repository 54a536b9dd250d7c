"""The per-client curves every registered method gives in two rounds of Cora METIS-10 (seed 0, `paper`
protocol, per-client path, CPU, one thread): the fixture that holds the harness redesign (issue 30) to
"per-client numbers unchanged". `python tests/client_curves.py` rewrites tests/golden/client-curves-cora-metis10.json;
do that only for a change that is meant to move numbers, and say so in the commit. It also writes
tests/golden/client-curves-machine.json, the CPU the fixture was computed on (`machine()`): bit-identity is a
property of one machine's kernels, and tests/test_client_curves.py reads it to know where it holds.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from gflbench.core.method import all_methods
from gflbench.data import default_data_dir
from gflbench.experiments.runner import DataCache, resolve_device, run
from gflbench.experiments.spec import make_spec

FIXTURE = Path(__file__).resolve().parent / "golden" / "client-curves-cora-metis10.json"
MACHINE = FIXTURE.with_name("client-curves-machine.json")
ROUNDS = 2


def machine() -> dict[str, str]:
    """What decides which float kernels a CPU run takes: the CPU's model and instruction-set flags (which
    MKL and ATen dispatch on) and the capability torch chose. Two machines that agree here ran the same
    kernels in every case we have seen; a CI machine that did not agree gave other AdaFGL and FedSage+ curves."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    flags = " ".join(sorted(fields.get("flags\t\t", "").split()))
    return {
        "cpu": fields.get("model name\t", platform.processor()).strip(),
        "flags_sha256": hashlib.sha256(flags.encode()).hexdigest(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }


def client_curves(method: str) -> dict[str, Any]:
    """One method's two-round per-client validation and test curves, and the bytes it sent each round."""
    torch.set_num_threads(1)
    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated("cora", "metis", 10, 1234)
    record = run(make_spec(method, "cora", "metis", 10, 0, {}, ROUNDS), data, resolve_device("cpu"))
    return {
        "client_curves": record["client_curves"],
        "bytes_up": record["bytes_up"],
        "bytes_down": record["bytes_down"],
    }


def main() -> None:
    methods = sys.argv[1:] or sorted(all_methods())
    curves = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    for method in methods:
        curves[method] = client_curves(method)
        print(method, curves[method]["client_curves"]["test"][-1][:3], flush=True)
    FIXTURE.write_text(json.dumps(curves, indent=1, sort_keys=True) + "\n")
    MACHINE.write_text(json.dumps(machine(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
