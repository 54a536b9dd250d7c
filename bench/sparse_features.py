"""Is a sparse first layer faster? Times X·Wᵀ forward + backward with X dense, COO and CSR.

    python bench/sparse_features.py --datasets cora,citeseer,pubmed --clients 10

For each dataset, the largest client of its METIS partition: feature density, and the median
milliseconds of one forward + backward of the first layer (X [n, F] times Wᵀ [F, hidden], the
weight's gradient included) with X stored dense, as a COO and as a CSR sparse tensor, one thread.
This is the one product whose cost scales with F; the rest of a round does not change.
"""

from __future__ import annotations

import argparse
import platform

import torch
from timing import forward_backward_ms

from gflbench.experiments.runner import DataCache, resolve_device


def layer_ms(x: torch.Tensor, weight: torch.Tensor, repeats: int) -> float:
    """Median ms of y = x Wᵀ and the backward pass into W."""
    dense = not x.is_sparse and x.layout == torch.strided
    return forward_backward_ms(
        lambda: x @ weight.T if dense else torch.sparse.mm(x, weight.T), weight, repeats, warmup=3
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="cora,citeseer,pubmed")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cache = DataCache(None, None)
    print(f"machine: {platform.processor() or platform.machine()}, {args.threads} thread(s), device {device}")
    print("dataset  nodes  features  density  dense ms  COO ms  CSR ms  dense/CSR")
    for name in args.datasets.split(","):
        graphs = cache.federated(name, "metis", args.clients, 1234).graphs
        x = max(graphs, key=lambda g: g.num_nodes).x.to(device)
        weight = torch.randn(args.hidden, x.shape[1], device=device, requires_grad=True)
        dense = layer_ms(x, weight, args.repeats)
        coo = layer_ms(x.to_sparse(), weight, args.repeats)
        csr = layer_ms(x.to_sparse_csr(), weight, args.repeats)
        density = float((x != 0).float().mean())
        print(
            f"{name:8s} {x.shape[0]:6d} {x.shape[1]:8d} {density:8.4f} {dense:9.2f} {coo:7.2f} {csr:7.2f} {dense / csr:9.2f}"
        )


if __name__ == "__main__":
    main()
