"""Batched clients against the per-client path: seconds per round, evaluation included, same process.

    python bench/batched.py --dataset cora --clients 20 --rounds 11 --repeats 3 --methods fedavg,fedprox,gcfl,fedpub

For each method the two paths run alternately, `--repeats` times each, on the same partition and
seed, so that load from other processes falls on both alike. Per run it takes the median over the
rounds after the first of (round + evaluation) wall seconds; the table gives the median over the
repeats for each path, their ratio, and the ratio of the process CPU seconds of the whole runs
(`time.process_time`, which other processes disturb less than wall time). Nothing is stored.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from gflbench.data import default_data_dir
from gflbench.experiments.provenance import device_name
from gflbench.experiments.runner import DataCache, resolve_device, run
from gflbench.experiments.spec import make_spec


def round_seconds(record: dict) -> float:
    """Median over the rounds after the first of the round's wall time plus its evaluation."""
    totals = [s + e for s, e in zip(record["seconds_per_round"], record["seconds_per_phase"]["evaluate"])]
    return statistics.median(totals[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--local-epochs", type=int, default=None, help="default: the protocol's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default="fedavg,fedprox,gcfl,fedpub")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.rounds < 2 or args.repeats < 1:
        parser.error("--rounds must be at least 2 and --repeats at least 1")

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated(args.dataset, "metis", args.clients, 1234)
    table = Table("method", "per-client s / round", "batched s / round", "wall ratio", "CPU-time ratio", "batched ran",
                  title=f"{args.dataset}, metis, {args.clients} clients, {args.rounds - 1} timed rounds, "
                        f"{args.repeats} repeats per path (evaluation included)",
                  caption=f"{device_name(device)} ({device}), {torch.get_num_threads()} thread(s), {platform.node()}")  # fmt: skip
    for method in args.methods.split(","):
        spec = make_spec(
            method, args.dataset, "metis", args.clients, 0, rounds=args.rounds, local_epochs=args.local_epochs
        )
        wall: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, float] = {False: 0.0, True: 0.0}
        execution = ""
        for _ in range(args.repeats):
            for batched in (False, True):
                started = time.process_time()
                record = run(spec, data, device, batched=batched)
                cpu[batched] += time.process_time() - started
                wall[batched].append(round_seconds(record))
                execution = record["execution"] if batched else execution
        one_by_one, together = statistics.median(wall[False]), statistics.median(wall[True])
        table.add_row(method, f"{one_by_one:.4f}", f"{together:.4f}", f"{one_by_one / together:.2f}",
                      f"{cpu[False] / cpu[True]:.2f}", execution)  # fmt: skip
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
