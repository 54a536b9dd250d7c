"""Batched local training: every client's network trained in one pass per local epoch.

Per round, a FedAvg-style client loads what it received, trains `local_epochs` full-batch steps on
its own graph, and uploads. The per-client path runs those steps client after client: one small
forward and backward each, dominated by Python and kernel-launch overhead. Here, for the methods
whose clients' local step is made of `TrainingClient`'s hooks (`Method.batchable`, derived: the
`objective` on each client's slice plus a `TrainingClient.penalty` of the stacked parameters, in
every stage where the clients' `trains_locally` says so; the trainer is built at the first such stage, so FedSage+'s generator
stages run client by client and its classifier phase batches on the mended graphs), and a backbone
whose network is written on optionally stacked parameters (`backbones.StackedBackbone`: the GCN,
FED-PUB's masked GCN, GraphSAGE, H2GCN), the executor

- stacks state: every parameter along a leading client axis, `[M, ...]`, and makes each client's
  parameter a view into its slice, so the per-client hooks (loading received weights, uploading,
  predicting) read and write the stacks directly and the Method interface is unchanged;
- packs graphs (`PackedPass`): padded to the largest client (N_max nodes each) and block-diagonal,
  every operator the network asks for into one sparse `[M·N_max, M·N_max]` matrix, sparse features
  into one sparse `[M·N_max, M·F]` matrix;
- calls the model: the backbone's own `network`, with the stacks and the packed pass;
- slices outputs and calls each client's objective on its own (unpadded) logits and representations.

Why a packed pass rather than torch.func's `stack_module_state` + `functional_call` + `vmap` over the
clients' own forwards: vmap cannot batch sparse CSR products, so each client's graph would enter dense
and padded, several times slower than the packed pass (`bench/stacking_idioms.py`; the figures are in
docs/results.md, "Measurements behind design choices").

Which products the packed pass uses (its choice alone; the network only names them):
- The first layer is one sparse product of the features with the stacked weights `[M·F, h]` (only
  the non-zero features are multiplied: Planetoid's are 98 % zeros; `graph_ops.ConstantSparse`), or
  one `bmm` where the features are dense (`DENSE_SHARE`); later layers one `bmm`, and every
  propagation one SpMM for all clients at once (client by client where a client's operator is dense).
  GraphSAGE's mean over neighbours is one product with the row-normalised block-diagonal adjacency.
- Parameters whose input width is the feature count F (first-layer weights, and FED-PUB's mask of
  one) are stored input-major, `[M, F, h]`, so that the first layer's `[M·F, h]` is a view: the
  clients see `[h, F]` transposed views, as `nn.Linear` expects. Stored as the clients hold them,
  the first layer would copy the weights forward and back at every step. Nothing above the executor
  depends on the layout for its numbers; aggregation stacks the uploads in their own memory order
  (`aggregation.memory_order`), which keeps its copies sequential. Both pay two- to threefold at Cora
  METIS-20's sizes (`bench/first_layer_layout.py`; docs/results.md, "Measurements behind design choices").

Further:
- The clients may belong to several runs of one configuration (seeds stacked by
  `runner.run_together`): each run's dropout masks are drawn from its own random streams
  (`streams`, gfl_bench/core/randomness.py), so each run sees the numbers it would see alone.
- Dropout masks are drawn client by client and epoch by epoch, in the order the per-client path
  draws them, so on a CPU both paths give the same numbers up to float summation order
  (`tests/test_batched.py`). Their widths are the network's own: read once from a forward pass that
  draws nothing (`PackedPass` in recording mode). On CUDA, dropout's RNG stream differs, so the two
  paths agree in distribution, not number by number.
- One Adam over the stacks, with the first client's parameter groups (FED-PUB: masks without weight
  decay). Adam is elementwise, so it is each client's own Adam; the fused kernel is used, which
  computes the same update with different float rounding.
- The loss is Σ_m (client m's objective on its own slice) + the penalty of the stacks, so each
  client's gradient is its own. Where every client's objective is `TrainingClient`'s cross-entropy,
  the sum is one cross-entropy over every client's training rows, each weighted 1/(its count): the
  same sum in one call. What the objectives hold constant for the round is solved for each run's
  clients at once first (`TrainingClient.group_step`: FedGMC's Sinkhorn plans in one batched POT
  solve). After the last step each client's parameters carry their slice of the gradient, as after
  the per-client step (GCFL+ reads it).
- Evaluation is one forward in eval mode for every client (`evaluate`), scored per client on the
  padded rows of its validation and test splits (`metrics.metric_of_clients`: accuracy in one pass).

Shapes: M clients, N = N_max padded nodes, F features, h hidden, C classes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.backbones import StackedBackbone, backbone_class
from gflbench.backbones.dropout import dropout_mask
from gflbench.backbones.graph_ops import ConstantSparse, operator_product, row_normalized
from gflbench.core.metrics import metric_of_clients
from gflbench.core.randomness import RunRandomness, SharedRandomness
from gflbench.core.training import TrainingClient

# Features at least this full are multiplied dense: an embedding bag spends several times a BLAS
# multiply-add per non-zero, so it wins only on sparse features (docs/results.md, "Measurements behind
# design choices").
DENSE_SHARE = 0.25


class PackedPass:
    """`backbones.GraphPass` over every client's graph at once: parameters `[M, ...]`, activations `[M, N, ·]`.

    Operators are packed at their first use, by the attribute name the network gives, and kept.
    `masks`: one epoch's dropout masks, used in the order the network calls `dropout` (None: no dropout);
    `widths`, when given instead, records each dropout's width and drops nothing (a recording pass).
    """

    def __init__(self, graphs: list[Data], training: bool) -> None:
        self.graphs, self.training = graphs, training
        self.sizes = [g.num_nodes for g in graphs]
        self.padded, self.count = max(self.sizes), len(graphs)
        self.num_features = graphs[0].num_features
        self.operators: dict[str, Tensor | list[Tensor]] = {}
        self.inputs = self._pack_features([g.x for g in graphs])
        self.masks: Iterator[Tensor] | None = None
        self.widths: list[int] | None = None

    def mode(self, training: bool, masks: list[Tensor] | None = None, widths: list[int] | None = None) -> PackedPass:
        """This pass set for one forward: training or not, with these masks, or recording `widths`."""
        self.training, self.masks, self.widths = training, iter(masks) if masks else None, widths
        return self

    def features(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """X_m W_mᵀ (+ b_m) for every client m, W `[M, h, F]` (a transposed view of an input-major stack:
        `[M·F, h]` is then a view, no copy). [M, N, h]"""
        if isinstance(self.inputs, Tensor):
            out = torch.bmm(self.inputs, weight.transpose(1, 2))
        else:
            out = (self.inputs @ weight.transpose(1, 2).reshape(self.count * self.num_features, -1)).view(
                self.count, self.padded, -1
            )
        return out if bias is None else out + bias[:, None, :]

    def linear(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        out = torch.bmm(h, weight.transpose(1, 2))
        return out if bias is None else out + bias[:, None, :]

    def propagate(self, operator: str, h: Tensor) -> Tensor:
        """`operator` applied to every client's rows: [M, N, w] -> [M, N, w] (padding rows stay zero)."""
        return self._spread(operator, h, lambda: [g[operator] for g in self.graphs])

    def mean_linear(self, operator: str, h: Tensor | None, weight: Tensor, bias: Tensor | None) -> Tensor:
        """mean_N(h) Wᵀ + b as mean_N(h Wᵀ) + b (the same function; for the features one sparse product of
        X instead of a dense [N, F] mean), each client's mean over its own neighbours."""
        projected = self.features(weight) if h is None else self.linear(h, weight)
        mean = self._spread(f"{operator} (row-normalised)", projected,
                            lambda: [row_normalized(g[operator]) for g in self.graphs])  # fmt: skip
        return mean if bias is None else mean + bias[:, None, :]

    def dropout(self, h: Tensor) -> Tensor:
        if self.widths is not None:
            self.widths.append(h.shape[-1])
            return h
        return h * next(self.masks) if self.masks is not None else h

    def _spread(self, name: str, h: Tensor, blocks: Callable[[], list[Tensor]]) -> Tensor:
        """The operator `name` (packed from `blocks()` at its first use) applied to every client's rows."""
        adjacency = self.operators.get(name)
        if adjacency is None:
            adjacency = self.operators[name] = self._operator(blocks())
        if isinstance(adjacency, list):
            padded = [
                F.pad(operator_product(a, h[m, : len(a)]), (0, 0, 0, self.padded - len(a)))
                for m, a in enumerate(adjacency)
            ]
            return torch.stack(padded)
        return operator_product(adjacency, h.reshape(-1, h.shape[-1])).view_as(h)

    def _block_diagonal(self, blocks: list[Tensor], column_block: int | None = None) -> Tensor:
        """Sparse per-client matrices on one padded index space: client m's rows at offset m·N, its columns
        at m·N (operators) or m·`column_block` (features)."""
        width = column_block or self.padded
        rows, cols, values = [], [], []
        for m, block in enumerate(blocks):
            coo = block.to_sparse_coo().coalesce()
            rows.append(coo.indices()[0] + m * self.padded)
            cols.append(coo.indices()[1] + m * width)
            values.append(coo.values())
        shape = (len(blocks) * self.padded, len(blocks) * width)
        indices = torch.stack([torch.cat(rows), torch.cat(cols)])
        return torch.sparse_coo_tensor(indices, torch.cat(values), shape).coalesce().to_sparse_csr()

    def _operator(self, blocks: list[Tensor]) -> Tensor | list[Tensor]:
        """One block-diagonal `[M·N, M·N]` sparse operator, or the clients' own operators when any is dense.

        A dense block (a clustered client's 2-hop ring, `graph_ops.dense_if_no_larger`) would lose its
        dense product inside a sparse block-diagonal (on Tolokers METIS-5 the batched FedGMC round became
        several times slower than the per-client one). Such operators are applied client by client instead.
        """
        if any(block.layout == torch.strided for block in blocks):
            return blocks
        return self._block_diagonal(blocks)

    def _pack_features(self, features: list[Tensor]) -> ConstantSparse | Tensor:
        """The clients' features for the first layer, X_m W_m for every client at once: block-diagonally,
        `[M·N, M·F]`, for one sparse product with the stacked weights `[M·F, h]` (Planetoid and Amazon
        features are over 98 % zeros, so only their non-zeros are multiplied); or, where at least
        `DENSE_SHARE` of the entries are non-zero (word embeddings, ogbn-arxiv's, Minesweeper's), padded
        dense, `[M, N, F]`, for one `bmm`."""
        filled = sum(int(x.count_nonzero()) for x in features) / max(sum(x.numel() for x in features), 1)
        if filled >= DENSE_SHARE:
            return torch.stack([F.pad(x, (0, 0, 0, self.padded - len(x))) for x in features])
        return ConstantSparse(self._block_diagonal([x.to_sparse() for x in features], column_block=self.num_features))


class BatchedTraining:
    """Stacks the models of `clients` (their parameters become views into the stacks) and trains them
    together: the backbone's `network` on the stacks and the packed graphs, each client's objective on
    its slice. Nothing here names a parameter or knows a network's layers."""

    def __init__(self, clients: list[TrainingClient], streams: list[tuple[RunRandomness, int]] | None = None) -> None:
        self.clients = clients
        # `streams`: (random streams, client count) per run, in client order (several runs when stacked
        # along seeds). Kept as each run's streams and the positions of its clients in `clients`.
        streams = streams or [(SharedRandomness(), len(clients))]
        ends = itertools.accumulate(count for _, count in streams)
        self.runs = [(randomness, range(end - count, end)) for (randomness, count), end in zip(streams, ends)]
        first = clients[0]
        if not isinstance(first.model, StackedBackbone):
            raise TypeError(f"{type(first.model).__name__} has no network on stacked parameters (batched_trainer)")
        self.model = first.model
        self.local_epochs = first.setup.local_epochs
        self.dropout = first.params.dropout
        device = first.train_index.device
        self.graph = PackedPass([c.graph for c in clients], training=True)
        self.sizes, self.padded = self.graph.sizes, self.graph.padded
        parameters = dict(first.model.named_parameters())
        # Stored input-major: the weights the first layer multiplies the features by (see the module docstring).
        self.input_major = {n for n, p in parameters.items() if p.dim() == 2 and p.shape[1] == self.graph.num_features}
        names = {id(p): name for name, p in parameters.items()}
        groups = [({**g, "params": [names[id(p)] for p in g["params"]]}) for g in first.optimizer.param_groups]
        self.stacks = {name: self._stack_and_rebind(name) for name in parameters}
        # Fused Adam: one kernel over each stack (5× the per-tensor loop on a CPU for Cora-20); same update.
        self.optimizer = torch.optim.Adam(
            [{**g, "params": [self.stacks[n] for n in g["params"]], "foreach": None, "fused": True} for g in groups]
        )
        # Every client's own objective is called unless all are TrainingClient's cross-entropy, which is
        # then one weighted cross-entropy over all clients' training rows (mean per client, summed).
        self.own_objectives = any(type(c).objective is not TrainingClient.objective for c in clients)
        self.train_rows = torch.cat([m * self.padded + c.train_index for m, c in enumerate(clients)])
        self.train_labels = torch.cat([c.graph.y[c.train_index] for c in clients])
        self.train_weights = torch.cat([torch.full((c.num_train,), 1.0 / c.num_train, device=device) for c in clients])
        # For evaluation, every client's labels and splits on the padded rows ([M, N]; padding in no split).
        sizes = self.sizes
        self.labels = torch.stack([F.pad(c.graph.y, (0, self.padded - size)) for c, size in zip(clients, sizes)])
        self.splits = {
            split: torch.stack(
                [F.pad(c.graph[f"{split}_mask"], (0, self.padded - size)) for c, size in zip(clients, sizes)]
            )
            for split in ("val", "test")
        }
        self.padding = torch.arange(self.padded, device=device)[None, :] >= torch.tensor(sizes, device=device)[:, None]
        self.widths: list[int] = []  # each dropout's width, in the order of the network's calls
        with torch.no_grad():
            self.model.network(self.in_client_layout(self.stacks), self.graph.mode(True, widths=self.widths))

    def _stack_and_rebind(self, name: str) -> nn.Parameter:
        """Stack parameter `name` of every client, then make each client's parameter a view of its slice."""
        flip = name in self.input_major
        stack = nn.Parameter(
            torch.stack([self._as_stored(c.model.get_parameter(name).detach(), flip) for c in self.clients])
        )
        module_name, _, attribute = name.rpartition(".")
        for m, client in enumerate(self.clients):
            setattr(
                client.model.get_submodule(module_name), attribute, nn.Parameter(self._as_stored(stack.data[m], flip))
            )
        return stack

    @staticmethod
    def _as_stored(tensor: Tensor, flip: bool) -> Tensor:
        """[h, F] <-> [F, h] for the input-major parameters; the identity for the others."""
        return tensor.t() if flip else tensor

    def in_client_layout(self, stacks: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """`stacks` as the clients hold their slices: `[M, *shape]` with `shape` as in `named_parameters()`
        (the input-major stacks as transposed views, no copy)."""
        return {name: stack.transpose(1, 2) if name in self.input_major else stack for name, stack in stacks.items()}

    def penalty(self) -> Tensor | None:
        """Σ_m client m's penalty of its own parameters (`TrainingClient.penalty` on the stacks), or None."""
        first = self.clients[0]
        return type(first).penalty(first.params, self.in_client_layout(self.stacks), self.reference)

    def _stack_reference(self) -> dict[str, Tensor]:
        """Every client's `TrainingClient.reference` of this round, `[M, *shape]` per name, in the memory
        layout of the stacked parameter it is compared with (one element-wise pass per penalty term)."""
        parameters = self.in_client_layout(self.stacks)
        names = [name for name in self.clients[0].reference if name in parameters]
        if any(sorted(c.reference) != sorted(self.clients[0].reference) for c in self.clients):
            raise RuntimeError("the clients' `reference` must name the same parameters in one round")
        stacked = {}
        for name in names:
            stacked[name] = torch.empty_like(parameters[name], requires_grad=False)
            for m, client in enumerate(self.clients):
                stacked[name][m].copy_(client.reference[name])
        return stacked

    def _dropout_masks(self) -> list[list[Tensor]]:
        """Per epoch, every dropout mask of every client, drawn in the per-client path's order."""
        keep = 1.0 - self.dropout
        device = self.train_rows.device
        widths = self.widths
        masks = [
            [torch.zeros(len(self.clients), self.padded, w, device=device) for w in widths]
            for _ in range(self.local_epochs)
        ]
        for randomness, clients in self.runs:  # each run from its own streams
            with randomness.active():
                for m in clients:  # client-major, as the per-client path trains client after client
                    for epoch in range(self.local_epochs):
                        for layer, width in enumerate(widths):
                            masks[epoch][layer][m, : self.sizes[m]] = dropout_mask((self.sizes[m], width), keep, device)
        return masks

    def outputs(self, training: bool, masks: list[Tensor] | None = None) -> tuple[Tensor, Any]:
        """Every client's logits `[M, N, C]` and representations (`[M, N, ·]` each) from one call of the
        backbone's network; `masks` are one epoch's dropout masks (None: no dropout)."""
        return self.model.network(self.in_client_layout(self.stacks), self.graph.mode(training, masks))

    def loss(self, masks: list[Tensor] | None) -> Tensor:
        """Σ_m client m's `objective` on its own (unpadded) logits and representations, plus the penalty."""
        logits, reps = self.outputs(training=True, masks=masks)
        if self.own_objectives:
            slices = [(logits[m, :size], _client_slice(reps, m, size)) for m, size in enumerate(self.sizes)]
            for _, clients in self.runs:  # per run: a stacked run's constants must not depend on its companions
                run_clients = [self.clients[m] for m in clients]
                type(run_clients[0]).group_step(run_clients, [slices[m][1] for m in clients])
            total = torch.zeros((), device=logits.device)
            for client, (client_logits, own) in zip(self.clients, slices):
                total = total + client.objective(client_logits, own)
        else:
            chosen = logits.reshape(-1, logits.shape[-1])[self.train_rows]
            total = (F.cross_entropy(chosen, self.train_labels, reduction="none") * self.train_weights).sum()
        penalty = self.penalty()
        return total if penalty is None else total + penalty

    @torch.no_grad()
    def predict(self) -> Tensor:
        """Every client's logits from its current model in one pass, [M, N, C]: client m's first
        `sizes[m]` rows are what its `Client.predict` gives, the rest is padding."""
        return self.outputs(training=False)[0]

    def evaluate(self, metric: str) -> tuple[Tensor, Tensor, Tensor]:
        """Every client's validation and test `metric` and whether its logits are all finite ([M] each),
        from one `predict`: what the runner's per-client evaluation computes, without a loop over clients."""
        logits = self.predict()
        finite = (torch.isfinite(logits).all(dim=-1) | self.padding).all(dim=-1)
        val, test = (metric_of_clients(metric, logits, self.labels, self.splits[split]) for split in ("val", "test"))
        return val, test, finite

    def train_round(self) -> None:
        """Every client's `local_epochs` optimiser steps, one batched step per epoch."""
        masks = self._dropout_masks() if self.dropout > 0 else None
        self.reference = self._stack_reference()  # what this round's penalties compare with
        for epoch in range(self.local_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            self.loss(masks[epoch] if masks else None).backward()
            self.optimizer.step()
        grads = {name: stack.grad for name, stack in self.stacks.items() if stack.grad is not None}
        for name, stacked in self.in_client_layout(grads).items():  # as the per-client step leaves them
            for client, grad in zip(self.clients, stacked.unbind(0)):
                client.model.get_parameter(name).grad = grad


def _client_slice(representations: Any, m: int, size: int) -> Any:
    """Client m's unpadded rows of every tensor of a representations dataclass (None stays None)."""
    if representations is None:
        return None
    return type(representations)(**{
        field.name: getattr(representations, field.name)[m, :size] for field in dataclasses.fields(representations)
    })  # fmt: skip


def batched_trainer(clients: list[TrainingClient], backbone: str) -> type[BatchedTraining] | None:
    """The batched trainer for these clients, or None where the per-client path must run: a backbone
    whose network is not written on stacked parameters (`StackedBackbone`), a single client, or a
    client without training nodes (it does not step in the per-client path, and Adam would move it
    here). The runner builds it, with each run's random streams, at the first stage where every
    client trains locally (`TrainingClient.trains_locally`)."""
    if len(clients) < 2 or any(c.num_train == 0 for c in clients):
        return None
    return BatchedTraining if issubclass(backbone_class(backbone), StackedBackbone) else None
