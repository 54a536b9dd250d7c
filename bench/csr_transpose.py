"""Is it worth caching the transpose of a CSR operator for the backward? Times Â·X forward + backward both ways.

    python bench/csr_transpose.py --dataset cora --clients 10 --repeats 7

torch's backward of a sparse CSR product `A @ X` (PyG's `spmm`, `batched.py`'s `_spread`) multiplies the
gradient by Aᵀ, which it forms at every step by transposing A (a CSC view) and converting it back to CSR:
a sort of the non-zeros. The alternative is a custom autograd function that multiplies by a transpose
made once per graph (for symmetric operators, by A itself). For each client's GCN operator of a METIS
partition, and for the block-diagonal operator of all clients (the batched path's), this script times
the product and its backward into X (X [n, hidden]) with torch's backward and with the kept transpose
(`graph_ops.operator_product`),
the two interleaved `--repeats` times (CPU time of this process, steadier on a shared machine), checks
that both give the same gradient bit for bit, and says which operators are symmetric. Then the round:
the per-client saving estimated against FedAvg's measured seconds per round (2 products with a backward
per client and local epoch), and FedAvg's batched round measured with `graph_ops.operator_product` (the
kept transpose) and with torch's own backward, `--pairs` interleaved runs of each. Nothing is stored.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from gflbench.backbones.graph_ops import (
    binary_adjacency,
    gcn_adjacency,
    h2gcn_adjacencies,
    operator_product,
    row_normalized,
)
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec


def cpu_ms(step, repeats: int) -> float:
    """Median CPU milliseconds of `step()` over `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return 1e3 * statistics.median(times)


def block_diagonal(blocks: list[torch.Tensor]) -> torch.Tensor:
    """The clients' operators on one padded index space, as the batched path packs them."""
    padded = max(b.shape[0] for b in blocks)
    rows, cols, values = [], [], []
    for m, block in enumerate(blocks):
        coo = block.to_sparse_coo().coalesce()
        rows.append(coo.indices()[0] + m * padded)
        cols.append(coo.indices()[1] + m * padded)
        values.append(coo.values())
    size = len(blocks) * padded
    return (
        torch.sparse_coo_tensor(torch.stack([torch.cat(rows), torch.cat(cols)]), torch.cat(values), (size, size))
        .coalesce()
        .to_sparse_csr()
    )


def compare(matrix: torch.Tensor, hidden: int, repeats: int, inner: int) -> tuple[float, float, bool]:
    """(torch ms, cached ms, same gradient) for `inner` forward+backward products, interleaved `repeats` times."""
    x = torch.randn(matrix.shape[1], hidden, requires_grad=True)
    grad = torch.randn(matrix.shape[0], hidden)

    def torch_way() -> None:
        for _ in range(inner):
            torch.autograd.grad(matrix @ x, x, grad)

    def cached_way() -> None:
        for _ in range(inner):
            torch.autograd.grad(operator_product(matrix, x), x, grad)

    same = torch.equal(
        torch.autograd.grad(matrix @ x, x, grad)[0], torch.autograd.grad(operator_product(matrix, x), x, grad)[0]
    )
    a, b = [], []
    for _ in range(repeats):
        a.append(cpu_ms(torch_way, 1) / inner)
        b.append(cpu_ms(cached_way, 1) / inner)
    return statistics.median(a), statistics.median(b), same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--inner", type=int, default=50, help="products per timed block")
    parser.add_argument("--rounds", type=int, default=12, help="FedAvg rounds per timed run")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved batched runs of each variant")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = DataCache(None, None).federated(args.dataset, "metis", args.clients, 1234)
    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.node()}, 1 thread, torch {torch.__version__}"
    )
    graphs = data.graphs
    kinds = {
        "gcn": [gcn_adjacency(g.edge_index, g.num_nodes) for g in graphs],
        "h2gcn hop1": [h2gcn_adjacencies(g.edge_index, g.num_nodes)[0] for g in graphs],
        "sage mean": [row_normalized(binary_adjacency(g.edge_index, g.num_nodes)) for g in graphs],
    }
    for kind, operators in kinds.items():
        symmetric = all(torch.equal(a.to_dense(), a.to_dense().T) for a in operators)
        print(f"{kind:11s} operators symmetric on every client: {symmetric}")
    saved_per_round = 0.0
    print("operator            nodes    nnz  torch ms  kept ms  saved ms  same grad")
    for cid, operator in enumerate(kinds["gcn"]):
        slow, fast, same = compare(operator, args.hidden, args.repeats, args.inner)
        saved_per_round += 2 * (slow - fast)  # two GCN layers, one local epoch
        print(
            f"gcn client {cid:<8d} {operator.shape[0]:6d} {operator.values().numel():6d} {slow:9.3f} {fast:10.3f} {slow - fast:9.3f}  {same}"
        )
    packed = block_diagonal(kinds["gcn"])
    slow, fast, same = compare(packed, args.hidden, args.repeats, max(args.inner // 5, 1))
    print(
        f"gcn block-diagonal {packed.shape[0]:6d} {packed.values().numel():6d} {slow:9.3f} {fast:10.3f} {slow - fast:9.3f}  {same}"
    )
    per_client = round_seconds(args, data, batched=False)
    print(
        f"FedAvg per-client round (CPU s, median of rounds 2-{args.rounds - 1}): {per_client:.4f}; kept transposes "
        f"would save {1e-3 * saved_per_round:.5f} s of it ({100 * 1e-3 * saved_per_round / per_client:.1f} %; "
        f"its products are PyG's GCNConv, in backbones.py)"
    )
    # The batched path multiplies through graph_ops.operator_product: timed as it is and with torch's own
    # backward (the product patched back to `@`), interleaved.
    import gflbench.core.batched as batched

    kept = batched.operator_product
    timings: dict[str, list[float]] = {"torch backward": [], "kept transpose": []}
    for _ in range(args.pairs):
        for name, product in (("torch backward", lambda m, d: m @ d), ("kept transpose", kept)):
            batched.operator_product = product
            timings[name].append(round_seconds(args, data, batched=True))
    batched.operator_product = kept
    print(f"FedAvg batched round (CPU s, median of rounds 2-{args.rounds - 1}), {args.pairs} interleaved pairs:")
    for name, values in timings.items():
        print(f"  {name:15s} median {statistics.median(values):.4f}  runs {' '.join(f'{v:.4f}' for v in values)}")
    ratios = [b / a for a, b in zip(timings["torch backward"], timings["kept transpose"])]
    print(f"  kept/torch per pair: {' '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")


def round_seconds(args: argparse.Namespace, data: object, batched: bool) -> float:
    """FedAvg's median CPU seconds per round (rounds 2 onwards, evaluation included) on `data`."""
    seconds: list[float] = []
    clock = [time.process_time()]

    def on_round(index: int, val: object, test: object) -> None:
        now = time.process_time()
        seconds.append(now - clock[0])
        clock[0] = now

    spec = make_spec("fedavg", args.dataset, "metis", args.clients, 0, rounds=args.rounds)
    run(spec, data, torch.device("cpu"), on_round=on_round, batched=batched)
    return statistics.median(seconds[2:])


if __name__ == "__main__":
    main()
