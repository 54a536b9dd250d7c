"""Does H2GCN's strict 2-hop operator multiply faster dense? Times A2·X forward + backward per client.

    python bench/h2gcn_operators.py --datasets cora,amazon-computer,tolokers --clients 5

For each client of a METIS partition: its nodes, the strict 2-hop operator's density, the storage
`graph_ops.dense_if_no_larger` picks (dense only where that is no bigger than the CSR form), and the
median milliseconds of A2 @ X with the backward into X (X [n, 3·hidden], the widest product in an
H2GCN forward), with A2 as CSR and as a dense tensor, one thread. The product is done three times
per forward (widths hidden, 2·hidden), so it is most of an H2GCN round on dense clients.
"""

from __future__ import annotations

import argparse
import platform

import torch
from timing import forward_backward_ms

from gflbench.backbones.graph_ops import dense_if_no_larger, h2gcn_adjacencies
from gflbench.experiments.runner import DataCache, resolve_device


def product_ms(operator: torch.Tensor, x: torch.Tensor, repeats: int) -> float:
    """Median ms of (operator @ x).sum() and its backward into x."""
    return forward_backward_ms(lambda: operator @ x, x, repeats, warmup=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="cora,amazon-computer,tolokers")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cache = DataCache(None, None)
    print(f"machine: {platform.processor() or platform.machine()}, {args.threads} thread(s), device {device}")
    print("dataset          client  nodes  2-hop density  chosen  CSR ms  dense ms  CSR/dense")
    for name in args.datasets.split(","):
        for cid, graph in enumerate(cache.federated(name, "metis", args.clients, 1234).graphs):
            _, sparse = h2gcn_adjacencies(graph.edge_index, graph.num_nodes)
            sparse = sparse.to_sparse_csr() if sparse.layout == torch.strided else sparse
            chosen = "dense" if dense_if_no_larger(sparse).layout == torch.strided else "CSR"
            n = graph.num_nodes
            x = torch.randn(n, 3 * args.hidden, device=device, requires_grad=True)
            csr_ms = product_ms(sparse.to(device), x, args.repeats)
            dense_ms = product_ms(sparse.to_dense().to(device), x, args.repeats)
            density = sparse.values().numel() / n**2
            print(
                f"{name:16s} {cid:6d} {n:6d} {density:14.3f} {chosen:>7s} {csr_ms:7.1f} {dense_ms:9.1f} {csr_ms / dense_ms:10.2f}"
            )


if __name__ == "__main__":
    main()
