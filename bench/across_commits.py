"""Seconds per round of whichever gflbench the running Python imports: for comparisons across commits.

    git worktree add /tmp/old <commit> && python3 -m venv /tmp/oldvenv \
        && /tmp/oldvenv/bin/pip install torch==2.13.0 && /tmp/oldvenv/bin/pip install -e /tmp/old
    for i in 1 2 3; do
        /tmp/oldvenv/bin/python bench/across_commits.py --method fedavg --clients 20 --label old
        .venv/bin/python bench/across_commits.py --method fedavg --clients 20 --batched --label now
    done

The comparison bench/batched.py cannot make: it alternates both paths inside one process of one
commit, while a goal stated against "today's per-client path" needs the path of an older commit,
which must run from its own installation (its method registry and modules differ). This script uses
only runner calls that already existed before the batched path (`DataCache.federated`, `make_spec`,
`run` with `on_round`; checked on 7fd8ae2^), so the old side runs it unchanged; interleave the processes as above so that
both see the same load. A round is timed as in bench/peer_openfgl.py: from the end of one round's
evaluation to the end of the next, in CPU time (`time.process_time`, steadier on a shared machine)
and wall time (bench/timing.py `RoundClock`); the median is over rounds 4 onwards (the first rounds carry
set-up and warm-up). Nothing is stored.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics

from timing import RoundClock

# An older tree's names first: where one is on PYTHONPATH (bench/paired_commits.py), it must win over the
# `gflbench` namespace, which an editable install of the current tree makes importable everywhere.
OLDER = importlib.util.find_spec("gfl_bench") is not None
default_data_dir = importlib.import_module("gfl_bench.datasets" if OLDER else "gflbench.data").default_data_dir
_runner = importlib.import_module("gfl_bench.runner" if OLDER else "gflbench.experiments.runner")
DataCache, resolve_device, run = _runner.DataCache, _runner.resolve_device, _runner.run
make_spec = importlib.import_module("gfl_bench.spec" if OLDER else "gflbench.experiments.spec").make_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=13)
    parser.add_argument("--local-epochs", type=int, default=None, help="default: the protocol's")
    parser.add_argument("--batched", action="store_true", help="train the clients together (commits that have it)")
    parser.add_argument("--label", default="", help="printed first, to tell the commits apart")
    args = parser.parse_args()

    root = default_data_dir()
    data = DataCache(root, root / "partitions").federated(args.dataset, "metis", args.clients, 1234)
    spec = make_spec(args.method, args.dataset, "metis", args.clients, 0, {}, args.rounds, args.local_epochs)
    clock = RoundClock()
    record = run(
        spec,
        data,
        resolve_device("cpu"),
        on_round=lambda *_: clock.mark(),
        **({"batched": True} if args.batched else {}),
    )
    rounds = {kind: statistics.median(seconds[3:]) for kind, seconds in clock.rounds().items()}  # rounds 4 onwards
    path = "batched" if args.batched else "per-client"
    print(
        f"{args.label} {args.method} {args.dataset} METIS-{args.clients} {path}: median s/round "
        f"CPU {rounds['cpu']:.4f} wall {rounds['seconds']:.4f} (test {record['test']:.4f})"
    )


if __name__ == "__main__":
    main()
