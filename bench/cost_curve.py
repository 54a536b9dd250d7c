"""Cost curve: seconds per round and peak memory as the graph grows, split into the round's phases.

    python bench/cost_curve.py --rounds 5 --rounds-for synthetic-arxiv-size=3

For each dataset (smallest first) and method, one process runs `--rounds` rounds at `--clients`
METIS clients and reports the median of each phase the runner times (configure, local training,
aggregation, evaluation), their sum (the round with evaluation), and the process's peak memory
(CPU: peak RSS of a process that ran only this cell, so data loading counts too; CUDA: torch's peak
allocation). The first round is left out of the medians (one-off work). Loading and partitioning
the dataset are reported apart ("load s"; partitions are cached on disk, so a second run is
quicker). A cell whose rounds outlive `--cell-timeout` (counted from the end of loading) is stopped; its
row then gives the mean time per round of the rounds it finished (evaluation included), from the
runner's per-round callback.

The last table divides each phase's time on every dataset by its time on the first, per method:
the phase whose ratio grows fastest is what to optimise for large graphs. `--out` merges the rows
into a round-times CSV (`bench/round_times.csv`) that `gflbench sweep --dry-run` falls back on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PHASES = ("configure", "fit", "aggregate", "evaluate")
RESULT_MARK = "COST-RESULT "
ROUND_MARK = "COST-ROUND "


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        _worker(args)
        return
    rounds_for = dict(item.split("=", 1) for item in args.rounds_for)
    cells = []
    for dataset in args.datasets.split(","):
        for method in args.methods.split(","):
            rounds = int(rounds_for.get(dataset, args.rounds))
            result = _spawn(args, method, dataset, rounds)
            print(f"{dataset:22s} {method:8s} {_short(result)}", file=sys.stderr, flush=True)
            cells.append((dataset, method, result))
    machine = _machine(args)
    print_tables(cells, machine, args)
    if args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from round_time import merge_round_times

        rows = [{"method": m, "dataset": d, "scheme": "metis", "clients": args.clients, "device": args.device.split(":")[0],
                 "seconds_per_round": round(r["round"], 5), "peak_mb": round(r["peak_mb"]), "machine": machine}
                for d, m, r in cells if "phases" in r]  # fmt: skip
        merge_round_times(args.out, rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="fedavg,fedpub,fedgmc")
    parser.add_argument("--datasets", default="cora,pubmed,amazon-computer,synthetic-arxiv-size")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rounds-for", action="append", default=[], metavar="DATASET=N", help="rounds for one dataset")
    parser.add_argument("--set", action="append", default=[], help="method.key=value override")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--cell-timeout", type=float, default=300, help="seconds a cell's rounds may take before it is stopped"
    )
    parser.add_argument("--load-timeout", type=float, default=900, help="seconds loading and partitioning may take")
    parser.add_argument("--out", type=Path, help="merge the rows into this CSV (bench/round_times.csv)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    return parser


def _machine(args: argparse.Namespace) -> str:
    from gflbench.experiments.provenance import device_name

    return f"{device_name(torch.device(args.device))}, {os.cpu_count()} cores, {args.threads} thread(s)"


# ---------------------------------------------------------------- one cell per process


def _spawn(args: argparse.Namespace, method: str, dataset: str, rounds: int) -> dict:
    """Run one cell in a fresh process; stop it after `--cell-timeout` and keep the rounds it finished."""
    command = [sys.executable, __file__, "--worker", "--method", method, "--dataset", dataset, "--rounds", str(rounds),
               "--clients", str(args.clients), "--device", args.device, "--threads", str(args.threads)]  # fmt: skip
    for item in args.set:
        command += ["--set", item]
    errors = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty worker cannot block on a full pipe
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + args.load_timeout  # until the data is loaded; then --cell-timeout for the rounds
    round_seconds: list[float] = []
    load_seconds = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            process.kill()
            process.wait()
            return {"stopped": args.cell_timeout, "rounds_done": round_seconds, "load": load_seconds, "rounds": rounds}
        if not selector.select(timeout=min(left, 5.0)):
            continue
        line = process.stdout.readline()
        if not line:  # the worker ended without a result
            process.wait()
            errors.seek(0)
            tail = errors.read().strip().splitlines()
            return {"error": tail[-1] if tail else f"exit code {process.returncode}"}
        if line.startswith(ROUND_MARK):
            kind, value = line[len(ROUND_MARK) :].split()
            if kind == "load":
                load_seconds = float(value)
                deadline = time.monotonic() + args.cell_timeout
            else:
                round_seconds.append(float(value))
        elif line.startswith(RESULT_MARK):
            process.wait()
            return json.loads(line[len(RESULT_MARK) :])


def _worker(args: argparse.Namespace) -> None:
    """Load, partition, run; print each round's wall time as it ends, then the phase medians."""
    from gflbench.data import default_data_dir
    from gflbench.experiments.runner import DataCache, resolve_device, run
    from gflbench.experiments.spec import make_spec, parse_overrides

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    tic = time.perf_counter()
    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated(args.dataset, "metis", args.clients, 1234)
    load = time.perf_counter() - tic
    print(f"{ROUND_MARK}load {load:.3f}", flush=True)
    overrides = parse_overrides(args.set, [args.method])[args.method]
    spec = make_spec(args.method, args.dataset, "metis", args.clients, 0, overrides, rounds=args.rounds)
    last = [time.perf_counter()]

    def on_round(_index: int, _val: float, _test: float) -> None:  # called after the round's evaluation
        now = time.perf_counter()
        print(f"{ROUND_MARK}round {now - last[0]:.4f}", flush=True)
        last[0] = now

    record = run(spec, data, device, on_round=on_round)
    skip = 1 if args.rounds > 1 else 0
    phases = {p: statistics.median(record["seconds_per_phase"][p][skip:]) for p in PHASES}
    with_evaluation = [s + e for s, e in zip(record["seconds_per_round"], record["seconds_per_phase"]["evaluate"])]
    peak = (
        record["peak_memory_bytes"]
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    result = {"phases": phases, "round": statistics.median(with_evaluation[skip:]), "first": with_evaluation[0],
              "peak_mb": peak / 2**20, "load": load, "nodes": sum(g.num_nodes for g in data.graphs), "rounds": args.rounds}  # fmt: skip
    print(RESULT_MARK + json.dumps(result), flush=True)


# ---------------------------------------------------------------- report


def _short(result: dict) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    if "stopped" in result:
        done = result["rounds_done"]
        mean = f"{statistics.fmean(done):.2f} s/round over {len(done)} round(s)" if done else "no round finished"
        return f"stopped after {result['stopped']:.0f} s: {mean}"
    return f"{result['round']:.4f} s/round, peak {result['peak_mb']:.0f} MB"


def print_tables(cells: list[tuple[str, str, dict]], machine: str, args: argparse.Namespace) -> None:
    """The per-cell table, then each phase's growth relative to the first dataset."""
    print(f"METIS {args.clients} clients, medians over rounds 2.. (first round apart), evaluation included in "
          f"'round'; {machine}; {args.device}; torch {torch.__version__}\n")  # fmt: skip
    print("| dataset | nodes | method | rounds | round s | configure s | local training s | aggregation s | evaluation s "
          "| first round s | load s | peak MB |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dataset, method, r in cells:
        if "phases" in r:
            p = r["phases"]
            figures = [f"{r['round']:.4f}", *(f"{p[name]:.4f}" for name in PHASES), f"{r['first']:.3f}", f"{r['load']:.1f}",
                       f"{r['peak_mb']:.0f}"]  # fmt: skip
            print(f"| {dataset} | {r['nodes']:,} | {method} | {r['rounds']} | " + " | ".join(figures) + " |")
        else:
            print(f"| {dataset} | | {method} | {r.get('rounds', '')} | {_short(r)} | | | | | | | |")
    print("\nGrowth over the first dataset (phase time ÷ its time on the first dataset):\n")
    print("| method | dataset | configure | local training | aggregation | evaluation | round |")
    print("|---|---|---:|---:|---:|---:|---:|")
    first: dict[str, dict] = {}
    for dataset, method, r in cells:
        if "phases" not in r:
            continue
        base = first.setdefault(method, r)
        ratios = [r["phases"][p] / base["phases"][p] if base["phases"][p] > 0 else float("nan") for p in PHASES]
        print(
            f"| {method} | {dataset} | "
            + " | ".join(f"{x:.1f}×" for x in ratios)
            + f" | {r['round'] / base['round']:.1f}× |"
        )


if __name__ == "__main__":
    main()
