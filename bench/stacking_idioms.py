"""Two idioms for a GCN forward over a stack of clients: torch.func's vmap, and the packed pass batched.py uses.

    python bench/stacking_idioms.py --clients 20 --nodes 136 --features 1433 --hidden 128

(a) `torch.func.stack_module_state` + `functional_call` + `vmap` over the clients, running the GCN's own
    per-client forward. vmap has no batching rule for sparse CSR products ("expand is unsupported for
    SparseCsr tensors", checked below), so each client's graph enters as a dense padded `[N, N]`
    adjacency and its features as a dense `[N, F]` matrix.
(b) `GCN.network` on the stacked parameters and the graphs packed block-diagonally
    (`batched.PackedPass`: sparse features and operators), first-layer weights stored input-major, as
    the batched executor runs it.
Random graphs and features of Cora METIS-20's sizes and density (defaults), dropout 0, forward +
backward, both alternately, one thread. Nothing is stored.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch.func import functional_call, stack_module_state, vmap
from torch_geometric.data import Data

from gflbench.backbones import GCN
from gflbench.core.batched import PackedPass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=136)
    parser.add_argument("--features", type=int, default=1433)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=7)
    parser.add_argument("--density", type=float, default=0.013, help="share of non-zero features")
    parser.add_argument("--degree", type=float, default=4.0, help="mean neighbours per node")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(1)
    m, n, f = args.clients, args.nodes, args.features
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(m, n, f, generator=generator) < args.density).float()
    edges = (torch.rand(m, n, n, generator=generator) < args.degree / n).float()
    adjacency = ((edges + edges.transpose(1, 2)) > 0).float() + torch.eye(n)
    degree = adjacency.sum(-1).sqrt()
    adjacency = adjacency / degree[..., None] / degree[..., None, :]  # D^-1/2 (A + I) D^-1/2, dense [M, N, N]
    models = [GCN(f, args.hidden, args.classes, 0.0) for _ in range(m)]

    params, _ = stack_module_state(models)  # type: ignore[arg-type]
    template = copy.deepcopy(models[0]).to("meta")

    def client_forward(p: dict[str, torch.Tensor], features: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return functional_call(template, p, (Data(x=features, gcn_adj=adj, num_nodes=n),))

    def vmapped() -> None:
        vmap(client_forward)(params, x, adjacency).sum().backward()

    graphs = [Data(x=x[c], gcn_adj=adjacency[c].to_sparse_csr(), num_nodes=n) for c in range(m)]
    packed = PackedPass(graphs, training=True)
    stored = {
        name: (p.detach().transpose(1, 2).contiguous() if name == "conv1.lin.weight" else p.detach().clone())
        for name, p in params.items()
    }
    for stack in stored.values():
        stack.requires_grad_()

    def packed_network() -> None:
        p = {name: s.transpose(1, 2) if name == "conv1.lin.weight" else s for name, s in stored.items()}
        models[0].network(p, packed.mode(True))[0].sum().backward()

    try:
        vmap(lambda h: graphs[0].gcn_adj @ h)(x[:, :, :4])
        print("vmap over a sparse CSR product: runs")
    except RuntimeError as error:
        print(f"vmap over a sparse CSR product: {error}")
    steps: dict[str, Callable[[], None]] = {
        "(a) stack_module_state + functional_call + vmap, dense padded graphs": vmapped,
        "(b) GCN.network on batched.PackedPass, sparse block-diagonal": packed_network,
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            tic = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - tic)
    print(f"M={m} N={n} F={f} h={args.hidden}, 1 thread, load average {os.getloadavg()[0]:.2f}")
    for name, seconds in times.items():
        print(f"{name}: median {1000 * statistics.median(seconds[1:]):.1f} ms (forward + backward)")


if __name__ == "__main__":
    main()
