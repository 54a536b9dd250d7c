"""Is stacking runs along a seed axis faster than running them one after another (or in processes)?

    python bench/stacked_seeds.py --dataset cora --clients 10 --methods fedavg,fedgmc --stack 1,2,4,8

For each method and stack size S, runs S seeds of one configuration together (`runner.run_together`:
every client of every run in one batched pass) and reports wall seconds per run-round, i.e. the
stacked round's time divided by S, beside the same runs done one at a time on the batched path
(S = 1) and on the per-client path. One process, one thread by default, `--rounds` rounds each,
evaluation included; the machine is printed. Processes are the alternative on a multi-core CPU: S
runs in S one-thread processes cost S cores, a stack of S costs one, so a stack pays where its
per-run-round time is below the single run's divided by the cores the processes would take.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from gflbench.experiments.runner import DataCache, resolve_device, run, run_together
from gflbench.experiments.spec import make_spec


def seconds_per_run_round(specs: list, data, device: torch.device, batched: bool) -> float:
    """Wall seconds of the whole job divided by runs × rounds (set-up and evaluation included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    if len(specs) == 1:
        run(specs[0], data, device, batched=batched)
    else:
        run_together(specs, data, device, batched=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / (len(specs) * specs[0].rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--methods", default="fedavg,fedgmc")
    parser.add_argument("--stack", default="1,2,4,8", help="stack sizes S to time")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    data = DataCache(None, None).federated(args.dataset, "metis", args.clients, 1234)
    print(
        f"machine: {platform.processor() or platform.machine()}, {args.threads} thread(s), device {device}; "
        f"{args.dataset} METIS-{args.clients}, {args.rounds} rounds, evaluation included"
    )
    print("method   S  s/run-round  per-client s/run-round  per-client ÷ stacked")
    for method in args.methods.split(","):
        spec = make_spec(method, args.dataset, "metis", args.clients, 0, rounds=args.rounds)
        run(make_spec(method, args.dataset, "metis", args.clients, 0, rounds=2), data, device, batched=True)  # warm-up
        per_client = seconds_per_run_round([spec], data, device, batched=False)
        for size in (int(s) for s in args.stack.split(",")):
            specs = [
                make_spec(method, args.dataset, "metis", args.clients, seed, rounds=args.rounds) for seed in range(size)
            ]
            stacked = seconds_per_run_round(specs, data, device, batched=True)
            print(f"{method:8s} {size:2d} {stacked:12.4f} {per_client:23.4f} {per_client / stacked:21.2f}")


if __name__ == "__main__":
    main()
