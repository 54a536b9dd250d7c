"""The generated graphs: `tiny` for smoke tests, and ogbn-arxiv's size for cost measurements."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gflbench.data.pyg import preprocess
from gflbench.data.registry import DATASETS

if TYPE_CHECKING:
    from torch_geometric.data import Data


def tiny_graph(
    num_nodes: int = 300, num_classes: int = 4, num_features: int = 16, seed: int = 0, degree: int = 4
) -> Data:
    """A deterministic stochastic-block graph with class-informative features: `tiny` for smoke tests,
    and at ogbn-arxiv's size `synthetic-arxiv-size` for cost measurements.

    Edges fall inside a class with probability 0.8 (homophily), features are a noisy one-hot of the
    class, so a GNN can learn it in a few rounds; a ring keeps the graph connected. `degree` edges
    leave each node before symmetrisation.
    """
    import torch
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(num_nodes) % num_classes
    y = y[torch.randperm(num_nodes, generator=gen)]
    src = torch.arange(num_nodes).repeat_interleave(degree)
    same_class = torch.rand(src.numel(), generator=gen) < 0.8
    dst = torch.randint(0, num_nodes, (src.numel(),), generator=gen)
    for c in range(num_classes):  # redirect intra-class draws to a random member of the class
        members = (y == c).nonzero().view(-1)
        pick = same_class & (y[src] == c)
        dst[pick] = members[torch.randint(0, members.numel(), (int(pick.sum()),), generator=gen)]
    ring = torch.stack([torch.arange(num_nodes), (torch.arange(num_nodes) + 1) % num_nodes])
    edge_index = torch.cat([torch.stack([src, dst]), ring], dim=1)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    centers = torch.randn(num_classes, num_features, generator=gen)
    x = centers[y] + 1.5 * torch.randn(num_nodes, num_features, generator=gen)
    return preprocess(Data(x=x, y=y, edge_index=edge_index), DATASETS["tiny"])
