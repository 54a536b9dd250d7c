"""Seconds per round of every method on every paper dataset: the basis of the whole grid's cost.

    GFLBENCH_RAW_MIRROR=../shared/data GFLBENCH_DATA=data python bench/grid_cost.py --out bench/grid_cost.csv

`gflbench sweep --table all --dry-run` can only estimate a run from a stored run of its cell or a row of
bench/round_times.csv, which covers a few methods on a few datasets. This script times a few rounds of
each registered method on each of the paper's eleven datasets at METIS 10 clients (protocol `paper`,
seed 0, the dataset's local epochs and the method's paper preset), and every method on Cora at the
grid's other five settings (METIS 5/20, overlapping 10/30/50), whose ratios to Cora's METIS-10 round
carry the other datasets to those settings (`gflbench report`'s Grid cost section).

Datasets the raw mirror lacks (Amazon-Photo, ogbn-arxiv, Roman-empire, Amazon-ratings, Questions) are
timed on a generated stand-in of the size the paper's Table 3 gives (nodes, undirected edges, features,
classes): `tiny_graph`'s block graph, thinned to that edge count with its connecting ring kept. A stand-in
has the size of the real graph, not its degree distribution or its partition's balance, so its time is
an estimate of the same order, not a measurement of that dataset; the CSV's `graph` column says which.

What is timed: each round from the end of the previous one to the end of this one (configure, local
training, aggregation and the round's evaluation: what a sweep pays), in CPU seconds of this process
(one torch thread) and in wall seconds. The first round is a warm-up (the run's setup and one-off work
such as FedSage+'s generator) and is reported apart; `seconds_per_round` is the median CPU seconds of the
rounds after it. CPU seconds rather than wall seconds because this machine's two cores are shared with a
background sweep: wall time measures the contention, CPU time the work one sweep worker does per round.

Each cell has a CPU-time limit (the budget left divided by the cells left, within --min-limit and
--max-limit; cheap cells come first, so expensive ones get what the cheap ones left). A cell stopped by
its limit keeps what it reached, and its `status` says so: `measured` (at least two timed rounds),
`1 round` (the median of one), `warm-up only` (no timed round: the first round's time, setup included),
`lower bound` (not even the first round finished: the CPU seconds it had used, a lower bound on that
round). Rows are appended as they are made, and a rerun skips the cells already in the CSV (delete rows
to re-measure). A method that raises is printed and left out (a rerun tries it again).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from gflbench.core.method import all_methods
from gflbench.data import default_data_dir, is_available, tiny_graph
from gflbench.experiments.provenance import device_name
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec
from gflbench.paper.tables import HETEROPHILIC, HOMOPHILIC, SETTINGS

# The paper's Table 3: nodes, undirected edges, classes, features. Amazon-Photo's 238,162 counts each edge
# in both directions (as its Amazon-Computer row does: 491,722 = 2 x the 245,861 undirected edges loaded
# here), so its stand-in gets half; the heterophilous graphs' and ogbn-arxiv's counts are undirected.
TABLE3 = {
    "amazon-photo": (7_650, 119_081, 8, 745),
    "ogbn-arxiv": (169_343, 1_166_243, 40, 128),
    "roman-empire": (22_662, 32_927, 18, 300),
    "amazon-ratings": (24_492, 93_050, 5, 300),
    "questions": (48_921, 153_540, 2, 301),
}
# Cheapest first (nodes x features x local epochs, roughly), so that the budget reaches every small cell.
ORDER = ("cora", "citeseer", "minesweeper", "tolokers", "amazon-photo", "pubmed", "roman-empire", "amazon-ratings",
         "amazon-computer", "questions", "ogbn-arxiv")  # fmt: skip
BASE = ("metis", 10)  # the setting every dataset is timed at
FIRST = ("fedavg", "fedgmc")  # timed on every dataset before the other methods
RATIO_DATASET = "cora"  # timed at every setting of the grid
COLUMNS = ("method", "dataset", "scheme", "clients", "device", "seconds_per_round", "wall_seconds_per_round",
           "first_round_seconds", "rounds_timed", "status", "graph", "limit_s", "machine")  # fmt: skip


class CellLimit(Exception):
    """The cell's CPU-time limit passed (raised by the SIGPROF handler inside the run)."""


def stand_in(dataset: str) -> Data:
    """A generated graph of `dataset`'s Table 3 size: tiny_graph's block graph with its ring kept and the other
    edges thinned (uniformly, fixed seed) to the undirected edge count."""
    nodes, edges, classes, features = TABLE3[dataset]
    graph = tiny_graph(
        num_nodes=nodes, num_classes=classes, num_features=features, degree=max(1, math.ceil(edges / nodes) - 1)
    )
    pairs = graph.edge_index[:, graph.edge_index[0] < graph.edge_index[1]]
    ring = (pairs[1] - pairs[0] == 1) | ((pairs[0] == 0) & (pairs[1] == nodes - 1))
    others = (~ring).nonzero().view(-1)
    keep = others[
        torch.randperm(len(others), generator=torch.Generator().manual_seed(0))[: max(0, edges - int(ring.sum()))]
    ]
    graph.edge_index = to_undirected(torch.cat([pairs[:, ring], pairs[:, keep]], 1), num_nodes=nodes)
    return graph


class StandInCache(DataCache):
    """The runner's data cache, with generated stand-ins for the datasets the raw mirror lacks."""

    def graph(self, dataset: str) -> Data:
        if dataset in TABLE3 and not is_available(dataset, self.data_dir):
            self._graphs.setdefault(dataset, stand_in(dataset))
        return super().graph(dataset)

    def describe(self, dataset: str) -> str:
        graph = self.graph(dataset)
        kind = "stand-in" if dataset in TABLE3 and not is_available(dataset, self.data_dir) else "real"
        return f"{kind}: {graph.num_nodes} nodes, {graph.num_edges // 2} edges, {graph.num_features} features"


def time_cell(method: str, dataset: str, scheme: str, clients: int, cache: StandInCache, rounds: int, limit: float,
              device: torch.device) -> dict:  # fmt: skip
    """Run `rounds` + 1 rounds (the first a warm-up) until done or `limit` CPU seconds; the row for the CSV.
    On CUDA `seconds_per_round` is the wall time (the runner synchronises each round): CPU time is not the cost there."""
    data = cache.federated(dataset, scheme, clients, 1234)  # before the clock: partitions are not a round's cost
    spec = make_spec(method, dataset, scheme, clients, 0, {}, rounds=rounds + 1)
    cpu, wall = [time.process_time()], [time.perf_counter()]

    def on_round(_index: int, _val: float, _test: float) -> None:
        cpu.append(time.process_time())
        wall.append(time.perf_counter())

    def stop(_signum: int, _frame: object) -> None:
        raise CellLimit

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, limit)
    try:
        run(spec, data, device, on_round=on_round)
    except CellLimit:
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    wall_rounds = [b - a for a, b in itertools.pairwise(wall)]
    cpu_rounds = wall_rounds if device.type == "cuda" else [b - a for a, b in itertools.pairwise(cpu)]
    timed = len(cpu_rounds) - 1
    if timed >= 1:
        seconds, wall_seconds = statistics.median(cpu_rounds[1:]), statistics.median(wall_rounds[1:])
        status = "measured" if timed >= 2 else "1 round"
    elif cpu_rounds:
        seconds, wall_seconds, status = cpu_rounds[0], wall_rounds[0], "warm-up only"
    else:
        seconds, wall_seconds, status = time.process_time() - cpu[0], time.perf_counter() - wall[0], "lower bound"
    return {"method": method, "dataset": dataset, "scheme": scheme, "clients": clients, "device": device.type,
            "seconds_per_round": round(seconds, 4), "wall_seconds_per_round": round(wall_seconds, 4),
            "first_round_seconds": round(cpu_rounds[0], 4) if cpu_rounds else "", "rounds_timed": max(timed, 0),
            "status": status, "graph": cache.describe(dataset), "limit_s": round(limit, 1)}  # fmt: skip


def cells(methods: list[str]) -> list[tuple[str, str, str, int]]:
    """Every method on Cora at every setting of the grid, then every method on every other dataset at METIS 10:
    method by method (FedAvg and FedGMC first), each on every dataset from the cheapest, so that a budget that
    runs out leaves the expensive methods untimed on the large graphs rather than whole datasets untimed."""
    datasets = [d for d in ORDER if d in HOMOPHILIC + HETEROPHILIC and d != RATIO_DATASET]
    ratio = [(m, RATIO_DATASET, s, c) for s, c in ((BASE, *(x for x in SETTINGS if x != BASE))) for m in methods]
    first = [m for m in FIRST if m in methods] + [m for m in methods if m not in FIRST]
    return ratio + [(m, d, *BASE) for m in first for d in datasets]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/grid_cost.csv"))
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up round")
    parser.add_argument("--budget", type=float, default=2400.0, help="CPU seconds for this invocation, all cells")
    parser.add_argument("--min-limit", type=float, default=8.0, help="CPU seconds a cell gets at least")
    parser.add_argument("--max-limit", type=float, default=120.0, help="CPU seconds a cell gets at most")
    parser.add_argument("--methods", default="", help="comma-separated; default every registered method")
    parser.add_argument("--note", default=" shared with a 2-worker sweep", help="what else ran on the machine")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (a GPU's rows: seconds are wall seconds there)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    known = list(all_methods())
    methods = args.methods.split(",") if args.methods else known
    unknown = sorted(set(methods) - set(known))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}")
    done: set[tuple[str, str, str, int]] = set()
    cora: dict[str, float] = {}  # seconds per round on Cora at METIS 10, to time the cheaper methods first
    if args.out.is_file():
        with args.out.open() as handle:
            rows = [r for r in csv.DictReader(handle) if r["device"] == torch.device(args.device).type]
        done = {(r["method"], r["dataset"], r["scheme"], int(r["clients"])) for r in rows}
        cora = {
            r["method"]: float(r["seconds_per_round"])
            for r in rows
            if (r["dataset"], r["scheme"], int(r["clients"])) == (RATIO_DATASET, *BASE)
        }
    methods = sorted(methods, key=lambda m: cora.get(m, math.inf))
    todo = [cell for cell in cells(methods) if cell not in done]
    device = torch.device(args.device)
    machine = f"{device_name(device)}, {os.cpu_count()} cores{args.note}, 1 torch thread"
    root = default_data_dir()
    cache = StandInCache(root, root / "partitions")
    start = time.process_time()
    for index, (method, dataset, scheme, clients) in enumerate(todo):
        left = args.budget - (time.process_time() - start)
        if left < args.min_limit:
            print(f"budget spent: {len(todo) - index} cells not timed (rerun to continue)", file=sys.stderr)
            break
        limit = min(args.max_limit, max(args.min_limit, left / (len(todo) - index)))
        try:
            row = time_cell(method, dataset, scheme, clients, cache, args.rounds, limit, device)
        except Exception as error:
            print(
                f"{method} {dataset} {scheme}-{clients}: FAILED: {type(error).__name__}: {error}",
                file=sys.stderr,
                flush=True,
            )
            continue
        row["machine"] = machine
        new = not args.out.is_file()
        with args.out.open("a", newline="") as handle:  # at once: a later crash loses nothing
            writer = csv.DictWriter(handle, COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)
        print(f"{method} {dataset} {scheme}-{clients}: {row['seconds_per_round']} s/round ({row['status']}, "
              f"limit {limit:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
