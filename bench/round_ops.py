"""The aten operators two rounds of a run call, for whichever gflbench the running Python imports.

    PYTHONPATH=/tmp/before python bench/round_ops.py --batched --out before.json
    python bench/round_ops.py --batched --out after.json --against before.json

A count that does not depend on the machine's load: on a shared 2-core machine the seconds per round
of one commit vary several-fold between runs (bench/paired_commits.py), while two commits whose
rounds call the same operators the same number of times do the same arithmetic. The rounds counted
are rounds 3 and 4 (a 4-round run's operators less a 2-round run's, set-up and the first rounds left
out), profiled with torch.profiler on the CPU, one thread. `--against` prints the operators whose
counts differ from another such file. Nothing is stored but `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gflbench.data import default_data_dir
from gflbench.experiments.runner import DataCache, resolve_device, run
from gflbench.experiments.spec import make_spec


def operator_counts(method: str, dataset: str, clients: int, rounds: int, batched: bool) -> dict[str, int]:
    """aten operator name -> calls in a `rounds`-round run (set-up included)."""
    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated(dataset, "metis", clients, 1234)
    spec = make_spec(method, dataset, "metis", clients, 0, {}, rounds)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run(spec, data, resolve_device("cpu"), **({"batched": True} if batched else {}))
    return {e.key: e.count for e in profiler.key_averages() if e.key.startswith("aten::")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the counts")
    parser.add_argument("--against", type=Path, help="another run's --out, to compare with")
    args = parser.parse_args()
    torch.set_num_threads(1)
    short, long = (operator_counts(args.method, args.dataset, args.clients, r, args.batched) for r in (2, 4))
    counts = {name: long[name] - short.get(name, 0) for name in sorted(long) if long[name] != short.get(name, 0)}
    args.out.write_text(json.dumps(counts, indent=1) + "\n")
    print(f"{sum(counts.values())} aten operator calls in rounds 3-4 ({len(counts)} operators)")
    if args.against is not None:
        other = json.loads(args.against.read_text())
        for name in sorted(set(other) | set(counts)):
            if other.get(name, 0) != counts.get(name, 0):
                print(f"{name}: {other.get(name, 0)} in {args.against.name}, {counts.get(name, 0)} here")


if __name__ == "__main__":
    main()
