"""FedGMC's per-round Sinkhorn plans: one POT solve per client, or one batched solve for all clients?

    python bench/sinkhorn_batch.py --clients 5,10,20,50 --B 64 --Q 10

Each client solves a B×Q balanced problem once per round (methods/fedgmc.py: `sinkhorn_assignment`);
on a CPU its cost is POT's per-iteration NumPy overhead, not arithmetic. The batched path solves the
clients of a run together (`sinkhorn_assignments`, POT `ot.solve_batch`). The costs are those of
FedGMC's structural loss: two-point Wasserstein costs of random unit radial sequences to random
templates. Prints the median milliseconds per round of both, their ratio, and the machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from gflbench.methods.fedgmc import random_templates, sinkhorn_assignment, sinkhorn_assignments, two_point_wasserstein


def median_ms(solve, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call (imports, allocations) is left out
        start = time.perf_counter()
        solve()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="5,10,20,50")
    parser.add_argument("--B", type=int, default=64, help="nodes sampled per client (FedGMCParams.B)")
    parser.add_argument("--Q", type=int, default=10, help="templates (FedGMCParams.Q)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--reg", type=float, default=0.1, help="FedGMCParams.sinkhorn_reg")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    templates = random_templates(args.Q, args.hidden, generator)
    print(
        f"{platform.machine()} ({platform.processor() or 'cpu'}), {args.threads} thread(s); B={args.B}, Q={args.Q}, reg={args.reg}"
    )
    print("clients | per client, ms/round | batched, ms/round | per client / batched")
    for count in (int(c) for c in args.clients.split(",")):
        measures = torch.nn.functional.normalize(
            torch.randn(count, args.B, 2, args.hidden, generator=generator), dim=-1
        )
        costs = torch.stack([two_point_wasserstein(m, templates) for m in measures.unbind(0)])
        alone = median_ms(lambda costs=costs: [sinkhorn_assignment(c, args.reg) for c in costs.unbind(0)], args.repeats)
        together = median_ms(lambda costs=costs: sinkhorn_assignments(costs, args.reg), args.repeats)
        print(f"{count:7d} | {alone:20.2f} | {together:17.2f} | {alone / together:.2f}×")


if __name__ == "__main__":
    main()
