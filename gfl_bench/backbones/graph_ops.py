"""Normalised adjacency operators, computed once per client graph and kept on the device.

Backbones multiply by sparse CSR matrices instead of scattering messages: the product is the same,
it is faster for full-batch training, and CSR SpMM does not depend on atomic-add order, which keeps
CUDA runs repeatable for a fixed seed.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import to_scipy_sparse_matrix

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


def csr_tensor(matrix: sp.spmatrix) -> Tensor:
    """A scipy sparse matrix as a float32 torch CSR tensor."""
    m = sp.csr_matrix(matrix, dtype=np.float32)
    m.sort_indices()
    return torch.sparse_csr_tensor(
        torch.from_numpy(m.indptr.astype(np.int64)),
        torch.from_numpy(m.indices.astype(np.int64)),
        torch.from_numpy(m.data),
        size=m.shape,
    )


def _unit_adjacency(edge_index: Tensor, num_nodes: int) -> sp.csr_matrix:
    """A as scipy CSR with unit entries and no self-loops."""
    a = to_scipy_sparse_matrix(edge_index, None, num_nodes).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    a.data[:] = 1.0
    return a


def binary_adjacency(edge_index: Tensor, num_nodes: int) -> Tensor:
    """A with unit entries (self-loops dropped), for mean aggregation such as GraphSAGE's."""
    return csr_tensor(_unit_adjacency(edge_index, num_nodes))


def row_normalized(adjacency: Tensor) -> Tensor:
    """D⁻¹A of a unit-entry CSR matrix (`binary_adjacency`): a product with it is the mean over each node's
    neighbours, GraphSAGE's aggregator (an isolated node's row stays empty, its mean zero, as PyG's)."""
    crow, col = adjacency.crow_indices(), adjacency.col_indices()
    counts = crow.diff()
    values = (1.0 / counts.clamp(min=1)).to(adjacency.dtype).repeat_interleave(counts)
    return torch.sparse_csr_tensor(crow, col, values, size=adjacency.shape)


def gcn_adjacency(edge_index: Tensor, num_nodes: int) -> Tensor:
    """D^-1/2 (A + I) D^-1/2, as in Kipf & Welling and PyG's GCNConv."""
    edge_index, weight = gcn_norm(edge_index, None, num_nodes, add_self_loops=True)
    return csr_tensor(to_scipy_sparse_matrix(edge_index, weight, num_nodes))


def symmetric_normalized(adjacency: sp.spmatrix) -> sp.csr_matrix:
    """D^-1/2 A D^-1/2 of a scipy matrix, D the row sums of A (an isolated node keeps a zero row and column).

    The one symmetric normalisation of a matrix built with scipy (H2GCN's hops, FedSSA's Laplacian). The
    degrees and their inverse square roots are computed in A's dtype, the product in float64, as each of
    those had it, so their numbers did not move. Operators built from an edge list in torch (GCN, UniFilter)
    use PyG's `gcn_norm` instead: torch's `pow(-0.5)` and NumPy's `** -0.5` round differently for 29 % of
    the integer degrees up to 2·10⁶, so one function for both would change one side's bits.
    """
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    inv_sqrt = np.zeros_like(degree, dtype=np.float64)
    inv_sqrt[degree > 0] = degree[degree > 0] ** -0.5
    scale = sp.diags(inv_sqrt)
    return scale @ adjacency @ scale


def h2gcn_adjacencies(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """H2GCN's 1-hop and strict 2-hop neighbourhoods, each symmetric-normalised by its own degrees.

    N1 = 1[(A+I) > 0] - I (neighbours, never the ego node); N2 = 1[(A+I)^2 > 0] - 1[(A+I) > 0]
    (nodes at distance exactly two). Self-loops in the input are dropped first (Zhu et al., 2020).
    """
    a = _unit_adjacency(edge_index, num_nodes)
    a_hat = (a + sp.identity(num_nodes, format="csr")).astype(bool).astype(np.float32)
    reach2 = (a_hat @ a_hat).astype(bool).astype(np.float32)
    hop1 = a.astype(bool).astype(np.float32)
    hop2 = (reach2 - a_hat).tocsr()
    hop2.eliminate_zeros()
    return csr_tensor(symmetric_normalized(hop1)), dense_if_no_larger(csr_tensor(symmetric_normalized(hop2)))


def dense_if_no_larger(matrix: Tensor) -> Tensor:
    """A CSR operator as a dense tensor when that takes no more memory than its CSR form, else as is.

    Strict 2-hop rings fill a clustered client: on Tolokers METIS-5 they cover 36-66 % of N×N, where
    CSR stores 12 bytes per non-zero against a dense 4 bytes per entry, and its product (with the
    backward) is several times slower than the dense one (bench/h2gcn_operators.py; docs/results.md,
    "Measurements behind design choices"). Above one third full,
    dense is both smaller and faster; below, the operator stays sparse, so no client ever holds a
    dense N×N matrix bigger than the sparse one it replaces. Products use `@`, which takes either.
    """
    rows, cols = matrix.shape
    csr_bytes = matrix.values().numel() * (matrix.values().element_size() + matrix.col_indices().element_size())
    csr_bytes += matrix.crow_indices().numel() * matrix.crow_indices().element_size()
    dense_bytes = rows * cols * matrix.values().element_size()
    return matrix.to_dense() if dense_bytes <= csr_bytes else matrix


class ConstantSparse:
    """A constant sparse matrix S (features that never change) for products S @ W with W trained.

    `S @ W` goes through `F.embedding_bag` in sum mode with the non-zeros as per-sample weights: row r
    of the product is Σ_c S[r, c] W[c], a bag over row r's non-zeros. The gradient Sᵀ G is the same
    kind of bag over a CSR copy of Sᵀ made once here. Both directions are gathers without atomics, and
    on a CPU the pair is faster than torch's CSR product with its autograd (docs/results.md,
    "Measurements behind design choices").
    """

    def __init__(self, matrix: Tensor) -> None:
        coo = matrix.to_sparse_coo().coalesce()
        self.shape = tuple(coo.shape)
        self.rows = coo.to_sparse_csr()  # S, row-major
        self.columns = coo.t().coalesce().to_sparse_csr()  # Sᵀ, row-major

    def __matmul__(self, weight: Tensor) -> Tensor:
        """S @ W for a dense W of shape [S.shape[1], h]; differentiable in W."""
        return _ConstantSparseProduct.apply(weight, self)


def _bag_product(matrix: Tensor, dense: Tensor) -> Tensor:
    """CSR `matrix` @ `dense` as one embedding bag per row."""
    return F.embedding_bag(matrix.col_indices(), dense, matrix.crow_indices()[:-1], mode="sum",
                           per_sample_weights=matrix.values())  # fmt: skip


class _ConstantSparseProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight: Tensor, matrix: ConstantSparse) -> Tensor:
        ctx.matrix = matrix
        return _bag_product(matrix.rows, weight.contiguous())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _bag_product(ctx.matrix.columns, grad.contiguous()), None


def operator_product(matrix: Tensor, dense: Tensor) -> Tensor:
    """`matrix @ dense` for a constant operator; a CSR operator's backward multiplies by a transpose made once.

    torch's backward of a CSR product forms Aᵀ at every step (a CSC view converted back to CSR, which
    sorts the non-zeros); here Aᵀ is made at the operator's first product and kept as long as the
    operator (`_transpose`), and is the operator itself where it is symmetric (GCN's and H2GCN's on
    undirected graphs; not GraphSAGE's row-normalised mean). The gradient is the same bit for bit: the
    converted transpose and the kept one are the same CSR matrix (bench/csr_transpose.py checks it, and
    times it). A dense operator is multiplied as is.
    """
    if matrix.layout != torch.sparse_csr:
        return matrix @ dense
    return _OperatorProduct.apply(dense, matrix, _transpose(matrix))


_TRANSPOSES: WeakIdKeyDictionary = WeakIdKeyDictionary()  # operator -> its transpose, dropped with the operator
_SYMMETRIC = torch.empty(0)  # kept for an operator that is its own transpose (holding the operator would keep it alive)


def _transpose(matrix: Tensor) -> Tensor:
    """Aᵀ of a constant CSR operator as CSR, made once per operator tensor (A itself when symmetric)."""
    found = _TRANSPOSES.get(matrix)
    if found is None:
        transposed = matrix.detach().t().to_sparse_csr()
        same = all(torch.equal(a, b) for a, b in zip(
            (matrix.crow_indices(), matrix.col_indices(), matrix.values()),
            (transposed.crow_indices(), transposed.col_indices(), transposed.values()),
        ))  # fmt: skip
        found = _SYMMETRIC if same else transposed
        _TRANSPOSES[matrix] = found
    return matrix if found is _SYMMETRIC else found


class _OperatorProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, dense: Tensor, matrix: Tensor, transposed: Tensor) -> Tensor:
        ctx.transposed = transposed
        return matrix @ dense

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return ctx.transposed @ grad, None, None


class EdgeOperators:
    """An edge list (row 0 = source v, row 1 = target u) as CSR structure twice: rows by target (A[u, v]
    for v → u) and rows by source (Aᵀ), for products whose matrix entries are per-edge values.

    Per-edge weights live in the target-major order (`matrix`); `transposed` permutes them for Aᵀ, so a
    backward pass multiplies by Aᵀ without converting a CSR matrix. Duplicate edges stay separate
    entries (summed in a product, as `index_add` sums them).
    """

    def __init__(self, edge_index: Tensor, num_nodes: int) -> None:
        source, target = edge_index
        by_target = torch.argsort(target * num_nodes + source)
        self.num_nodes = num_nodes
        self.num_edges = int(source.numel())
        self.source = source[by_target]  # column of each entry of A, target-major
        self.target = target[by_target]
        self.crow = self._crow(self.target)
        self.to_transposed = torch.argsort(self.source * num_nodes + self.target)  # target-major → source-major
        self.crow_t = self._crow(self.source[self.to_transposed])
        self.col_t = self.target[self.to_transposed]

    def _crow(self, rows: Tensor) -> Tensor:
        counts = torch.bincount(rows, minlength=self.num_nodes)
        return torch.cat([counts.new_zeros(1), counts.cumsum(0)])

    def matrix(self, values: Tensor) -> Tensor:
        """A with entry A[u, v] = values[e] for the e-th edge v → u (target-major order)."""
        return torch.sparse_csr_tensor(self.crow, self.source, values, (self.num_nodes, self.num_nodes))

    def transposed(self, values: Tensor) -> Tensor:
        """Aᵀ for the same per-edge values (given target-major)."""
        return torch.sparse_csr_tensor(
            self.crow_t, self.col_t, values[self.to_transposed], (self.num_nodes, self.num_nodes)
        )

    def edge_dots(self, rows: Tensor, cols: Tensor) -> Tensor:
        """rows[u] · cols[v] for every edge v → u (a sampled dense-dense product), [E]."""
        pattern = self.matrix(rows.new_zeros(self.num_edges))
        return torch.sparse.sampled_addmm(pattern, rows, cols.T).values()


class _EdgeDots(torch.autograd.Function):
    """a[e, k] = c[k, u_e] · x[k, v_e] for every edge v → u and factor k: [K, N, h] × 2 → [E, K].

    Written as sampled products so that no [E, K, h] gather is built: on a PubMed client (K 4, h 256)
    forward and backward are several times cheaper than gathering both ends of every edge."""

    @staticmethod
    def forward(ctx: Any, c: Tensor, x: Tensor, ops: EdgeOperators) -> Tensor:
        ctx.save_for_backward(c, x)
        ctx.ops = ops
        return torch.stack([ops.edge_dots(c[k], x[k]) for k in range(c.shape[0])], dim=1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        c, x = ctx.saved_tensors
        ops: EdgeOperators = ctx.ops
        grad_c = torch.stack([ops.matrix(grad[:, k].contiguous()) @ x[k] for k in range(c.shape[0])])
        grad_x = torch.stack([ops.transposed(grad[:, k].contiguous()) @ c[k] for k in range(c.shape[0])])
        return grad_c, grad_x, None


class _EdgeWeightedSum(torch.autograd.Function):
    """out[k, u] = Σ_{v → u} w[e, k] x[k, v]: one sparse product per factor, [E, K] × [K, N, h] → [K, N, h]."""

    @staticmethod
    def forward(ctx: Any, weights: Tensor, x: Tensor, ops: EdgeOperators) -> Tensor:
        ctx.save_for_backward(weights, x)
        ctx.ops = ops
        return torch.stack([ops.matrix(weights[:, k].contiguous()) @ x[k] for k in range(x.shape[0])])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        weights, x = ctx.saved_tensors
        ops: EdgeOperators = ctx.ops
        grad = grad.contiguous()
        grad_weights = torch.stack([ops.edge_dots(grad[k], x[k]) for k in range(x.shape[0])], dim=1)
        grad_x = torch.stack([ops.transposed(weights[:, k].contiguous()) @ grad[k] for k in range(x.shape[0])])
        return grad_weights, grad_x, None


def edge_dots(c: Tensor, x: Tensor, ops: EdgeOperators) -> Tensor:
    """[K, N, h] × [K, N, h] → [E, K]: c[k, u] · x[k, v] per edge v → u and factor k (differentiable)."""
    return _EdgeDots.apply(c.contiguous(), x.contiguous(), ops)


def edge_weighted_sum(weights: Tensor, x: Tensor, ops: EdgeOperators) -> Tensor:
    """[E, K] × [K, N, h] → [K, N, h]: Σ_{v → u} w[e, k] x[k, v] per target u and factor k (differentiable)."""
    return _EdgeWeightedSum.apply(weights.contiguous(), x.contiguous(), ops)
