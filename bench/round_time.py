"""Seconds per communication round of each method (paper Table 7's quantity), on one machine.

    python bench/round_time.py --dataset cora --clients 10 --rounds 20

Runs every chosen method for a few rounds on the same partition and prints the median and the
interquartile range of its per-round time (configure + local training + aggregation; evaluation
excluded, CUDA synchronised), the median of each phase (configure, local training, aggregation, and
the per-round evaluation the round time leaves out), each method's ratio to FedAvg's median, and the
run's peak memory (CUDA: what torch's allocator reserved at most in the run, `peak_reserved_bytes`,
which is what packing needs; CPU: the process's peak RSS, cumulative over the methods run before it,
so run one method per process for a clean CPU figure). The first `--warmup`
rounds (default 1) are left out of the median and shown on their own as "first round(s)": that is
where one-off work lands (FedSage+'s generator phase, CUDA warm-up). Methods whose behaviour changes
late (GCFL splits only after round 20) need `--rounds` beyond that. Nothing is stored; the figures
depend on the machine, which is printed.

`--out FILE` also merges one row per method into a CSV (method, dataset, scheme, clients, device,
median seconds per round with evaluation included, peak MB, machine, and on CUDA `context_mb`: the
device memory the process uses outside torch's allocator, its CUDA context, measured once before the
first run), replacing earlier rows of the same cell, device and machine. Each method's row is merged
as soon as it finishes, and a method that raises is reported (`FAILED` and its error) without stopping
the others, so one crash loses no row. `bench/round_times.csv`, written this way, is what `gflbench
sweep --dry-run` falls back on when the store holds no run of a cell (gfl_bench/paper/sweep.py `estimate`),
and its peak and context columns are what `--workers 0` packs by (`sweep.run_memory_mb`).
The script exits 1 when a method failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from gflbench.core.method import all_methods
from gflbench.data import default_data_dir
from gflbench.errors import UserError
from gflbench.experiments.provenance import device_name
from gflbench.experiments.runner import DataCache, resolve_device, run
from gflbench.experiments.spec import make_spec, parse_overrides
from gflbench.paper.tables import method_order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--partition", default="metis")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=1, help="leading rounds reported apart, not in the median")
    parser.add_argument("--methods", default="", help="comma-separated; default every registered method")
    parser.add_argument("--set", action="append", default=[], help="method.key=value override")
    parser.add_argument("--local-epochs", type=int, default=None, help="default: the protocol's")
    parser.add_argument("--out", type=Path, help="merge one row per method into this CSV (bench/round_times.csv)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--batched", action="store_true", help="train batchable methods' clients together (gfl_bench/core/batched.py)"
    )
    parser.add_argument("--sparse-features", action="store_true", help="first layer from a CSR copy of the features")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    methods = method_order(args.methods.split(",") if args.methods else list(all_methods()))
    try:
        overrides = parse_overrides(args.set, methods)
    except UserError as error:
        parser.error(str(error))
    if not 0 <= args.warmup < args.rounds:
        parser.error("--warmup must be at least 0 and below --rounds")
    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated(args.dataset, args.partition, args.clients, 1234)
    context = cuda_context_mb(device)
    label = f"{device_name(device)}, {os.cpu_count()} cores, {torch.get_num_threads()} thread(s)"

    rows: dict[str, list[str]] = {}
    medians: dict[str, float] = {}
    failed: dict[str, str] = {}
    for method in methods:
        spec = make_spec(method, args.dataset, args.partition, args.clients, 0, overrides[method], rounds=args.rounds,
                         local_epochs=args.local_epochs)  # fmt: skip
        try:
            record = run(spec, data, device, batched=args.batched, sparse_features=args.sparse_features)
        except Exception as error:
            failed[method] = f"{type(error).__name__}: {error}"
            print(f"{method}: FAILED: {failed[method]}", file=sys.stderr, flush=True)
            continue
        all_seconds = record["seconds_per_round"]
        seconds = all_seconds[args.warmup :]
        q1, median, q3 = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else (seconds[0],) * 3
        medians[method] = median
        peak = record.get("peak_reserved_bytes", record["peak_memory_bytes"])  # CUDA: the allocator's reserve
        phases = [statistics.median(record["seconds_per_phase"][p][args.warmup :])
                  for p in ("configure", "fit", "aggregate", "evaluate")]  # fmt: skip
        rows[method] = [f"{spec.params.backbone}, {record['execution']}", f"{median:.4f}", f"{q1:.4f}–{q3:.4f}", *(f"{p:.4f}" for p in phases),
                        f"{sum(all_seconds[: args.warmup]):.3f}", f"{peak / 2**20:.0f}"]  # fmt: skip
        with_evaluation = [s + e for s, e in zip(all_seconds, record["seconds_per_phase"]["evaluate"])][args.warmup :]
        row = {"method": method, "dataset": args.dataset, "scheme": args.partition, "clients": args.clients,
               "device": device.type, "seconds_per_round": round(statistics.median(with_evaluation), 5),
               "peak_mb": round(peak / 2**20), "machine": label}  # fmt: skip
        if context is not None:
            row["context_mb"] = round(context)
        print(f"{method}: {median:.4f} s / round ({record['execution']})", file=sys.stderr, flush=True)
        if args.out:
            merge_round_times(args.out, [row])  # at once: a later crash loses nothing

    machine = f"{device_name(device)} ({device}), {torch.get_num_threads()} CPU thread(s), {platform.node()}"
    table = Table("method", "backbone", "s / round (median)", "IQR", "configure", "local training", "aggregation",
                  "evaluation", "× FedAvg", f"first {args.warmup} round(s), s", "peak MB",
                  title=f"{args.dataset}, {args.partition}, {args.clients} clients, {args.rounds - args.warmup} timed rounds",
                  caption=machine)  # fmt: skip
    base = medians.get("fedavg", float("nan"))
    for method, row in rows.items():
        table.add_row(method, *row[:7], f"{medians[method] / base:.2f}", *row[7:])
    for method, error in failed.items():
        table.add_row(method, "FAILED", error[:120])
    Console(width=200).print(table)
    if failed:
        sys.exit(1)


def cuda_context_mb(device: torch.device) -> float | None:
    """Device memory this process uses outside torch's allocator (its CUDA context, cuBLAS/cuSPARSE
    handles once loaded), measured before the first run; None off CUDA. Counts other processes' memory
    too, so measure on an otherwise idle GPU."""
    if device.type != "cuda":
        return None
    torch.ones(1, device=device).sum().item()  # create the context
    free, total = torch.cuda.mem_get_info(device)
    return (total - free - torch.cuda.memory_reserved(device)) / 2**20


def merge_round_times(path: Path, rows: list[dict]) -> None:
    """Add `rows` to the CSV at `path`, replacing rows of the same cell, device and machine (a re-measurement)."""
    key = ["method", "dataset", "scheme", "clients", "device", "machine"]
    new = pd.DataFrame(rows)
    if path.is_file():
        old = pd.read_csv(path)
        stale = old.set_index(key).index.isin(new.set_index(key).index)
        new = pd.concat([old[~stale], new], ignore_index=True)
    new.sort_values(key).to_csv(path, index=False)


if __name__ == "__main__":
    main()
