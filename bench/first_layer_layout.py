"""The batched first layer with its stacked weights stored input-major `[M, F, h]` or as the clients hold them,
and the aggregation of the uploads that layout gives, in their memory order or not.

    python bench/first_layer_layout.py --clients 20 --nodes 136 --features 1433 --hidden 128

Why gfl_bench/core/batched.py stores first-layer weights input-major: its first layer is one sparse product
of the block-diagonal features `[M·N, M·F]` with the weights as `[M·F, h]` (`graph_ops.ConstantSparse`),
which is a view of an input-major stack, while a stack in the clients' layout `[M, h, F]` must be
copied into it in the forward and back in the backward. Times forward + backward of that product on
random features of Cora's density (1.3 %; the defaults are Cora METIS-20's sizes), both layouts
alternately, one thread.

Then the price of that layout above the executor: the clients upload `[h, F]` transposed views, and
FedAvg's mean of them is stacked in the views' memory order (`aggregation.memory_order`) or, as
`aggregation.mixtures` would without it, in their logical order; the mean is then loaded back into
every client's view (the runner's clone, `weighted_mean`, `load_model_state`'s copy). Nothing is stored.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from gflbench.backbones.graph_ops import ConstantSparse
from gflbench.core import aggregation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=136, help="padded nodes per client")
    parser.add_argument("--features", type=int, default=1433)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--density", type=float, default=0.013, help="share of non-zero features")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    m, n, f, h = args.clients, args.nodes, args.features, args.hidden
    blocks = [(torch.rand(n, f) < args.density).float() for _ in range(m)]
    features = ConstantSparse(torch.block_diag(*blocks).to_sparse())
    input_major = torch.randn(m, f, h, requires_grad=True)
    client_layout = torch.randn(m, h, f, requires_grad=True)
    steps = {
        "input-major [M, F, h]": lambda: features @ input_major.reshape(m * f, h),
        "client layout [M, h, F]": lambda: features @ client_layout.transpose(1, 2).reshape(m * f, h),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            tic = time.perf_counter()
            step().sum().backward()
            times[name].append(time.perf_counter() - tic)
    load = os.getloadavg()[0]
    print(f"M={m} N={n} F={f} h={h}, density {args.density}, 1 thread, load average {load:.2f}")
    for name, seconds in times.items():
        print(f"{name}: median {1000 * statistics.median(seconds[1:]):.1f} ms (forward + backward)")
    print(f"FedAvg of the {m} uploads of that weight and the loads back, median of {args.repeats}:")
    for name, seconds in mean_and_load(input_major.detach(), args.repeats).items():
        print(f"{name}: median {1000 * statistics.median(seconds[1:]):.1f} ms")


def mean_and_load(stack: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    """Seconds of clone + `weighted_mean` + load into each view, with and without `memory_order`."""
    views = [client.t() for client in stack]  # [h, F] views of the input-major stack, as the clients hold them
    kept = aggregation.memory_order
    orders = {"in memory order": kept, "in logical order": lambda tensor: list(range(tensor.dim()))}
    times: dict[str, list[float]] = {name: [] for name in orders}
    try:
        for _ in range(repeats):
            for name, order in orders.items():
                aggregation.memory_order = order
                tic = time.perf_counter()
                mean = aggregation.weighted_mean([{"w": view.clone()} for view in views], torch.ones(len(views)))
                for view in views:
                    view.copy_(mean["w"])
                times[name].append(time.perf_counter() - tic)
    finally:
        aggregation.memory_order = kept
    return times


if __name__ == "__main__":
    main()
