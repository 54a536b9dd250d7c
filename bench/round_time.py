"""Seconds per communication round of each method (paper Table 7's quantity), on one machine.

    python bench/round_time.py --dataset cora --clients 10 --rounds 20

Runs every chosen method for a few rounds on the same partition and prints the median and the
interquartile range of its per-round time (configure + local training + aggregation; evaluation
excluded, CUDA synchronised), and each method's ratio to FedAvg's median. The first round is
dropped as warm-up. Nothing is stored; the figures depend on the machine, which is printed.
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch
from rich.console import Console
from rich.table import Table

from gfl_bench.datasets import default_data_dir
from gfl_bench.method import all_methods
from gfl_bench.provenance import device_name
from gfl_bench.runner import DataCache, resolve_device, run
from gfl_bench.spec import make_spec
from gfl_bench.tables import method_order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--partition", default="metis")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--methods", default="", help="comma-separated; default every registered method")
    parser.add_argument("--set", action="append", default=[], help="method.key=value override")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    methods = method_order(args.methods.split(",") if args.methods else list(all_methods()))
    overrides: dict[str, dict[str, str]] = {m: {} for m in methods}
    for item in args.set:
        target, _, value = item.partition("=")
        name, _, key = target.rpartition(".")
        overrides[name][key] = value
    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated(args.dataset, args.partition, args.clients, 1234)

    medians: dict[str, tuple[float, float, float]] = {}
    for method in methods:
        spec = make_spec(method, args.dataset, args.partition, args.clients, 0, overrides[method], rounds=args.rounds)
        seconds = run(spec, data, device)["seconds_per_round"][1:]
        q1, median, q3 = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else (seconds[0],) * 3
        medians[method] = (median, q1, q3)

    machine = f"{device_name(device)} ({device}), {torch.get_num_threads()} CPU thread(s), {platform.node()}"
    table = Table("method", "s / round (median)", "IQR", "× FedAvg",
                  title=f"{args.dataset}, {args.partition}, {args.clients} clients, {args.rounds - 1} timed rounds",
                  caption=machine)  # fmt: skip
    base = medians.get("fedavg", (float("nan"),))[0]
    for method, (median, q1, q3) in medians.items():
        table.add_row(method, f"{median:.4f}", f"{q1:.4f}–{q3:.4f}", f"{median / base:.2f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
