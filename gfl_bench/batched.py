"""Batched local training: every client's GCN, GraphSAGE or H2GCN trained in one pass per local epoch.

Per round, a FedAvg-style client loads what it received, trains `local_epochs` full-batch steps on
its own graph, and uploads. The per-client path runs those steps client after client: one small
forward and backward each, dominated by Python and kernel-launch overhead. Here, for the methods
whose clients' local step is made of `TrainingClient`'s hooks (`Method.batchable`, derived: the
`objective` on each client's slice plus a `TrainingClient.penalty` of the stacked parameters, in
every stage where the clients' `trains_locally` says so; the trainer is built at the first such
stage, so FedSage+'s generator stages run client by client and its classifier phase batches on the mended graphs):

- Parameters are stacked along a leading client axis, `[M, ...]`, and each client's model holds views
  into the stacks, so the per-client hooks (loading received weights, uploading, predicting) read and
  write the stacks directly and the Method interface is unchanged. The first layer's weights are
  stacked input-major, `[M, F, h]`, so that the first layer needs no copy of them (the clients see
  `[h, F]` views, as `nn.Linear` expects).
- Graphs are padded to the largest client (N_max nodes each) and packed block-diagonally: the
  normalised adjacencies into one sparse `[M·N_max, M·N_max]` matrix, sparse features into one sparse
  `[M·N_max, M·F]` matrix. The first layer is one sparse product of the features with the stacked
  weights `[M·F, h]` (only the non-zero features are multiplied: Planetoid's are 98 % zeros;
  `graph_ops.ConstantSparse`), or one `bmm` where the features are dense (`DENSE_SHARE`), later
  layers one `bmm`, and every propagation one SpMM, for all clients at once.
- GraphSAGE (FedSage+'s, and any method's under `backbone=sage`): the mean over neighbours is one
  product with the row-normalised block-diagonal adjacency (`graph_ops.row_normalized`).
- FED-PUB's masked GCN (`baselines/fedpub.py:MaskedGCN`) is the same network with each weight used
  as W ⊙ M; its masks are stacked like the weights, and pruned in evaluation as the model prunes them.
- H2GCN (FedGMC's backbone, and any method's under `backbone=h2gcn*`): the ego layer is the same
  sparse product, the 1-hop and 2-hop operators are block-diagonal (or applied client by client where a client's is
  dense), and the classifier one `bmm`.
  Its clients' objective may read the representations (FedGMC's calibration losses), so each
  client's `TrainingClient.objective` is called on its own slice of the batch's representations
  and logits; only the network's arithmetic is batched, and what the objectives hold constant for
  the round is solved for each run's clients at once first (`TrainingClient.group_step`:
  FedGMC's Sinkhorn plans in one batched POT solve).
- The clients may belong to several runs of one configuration (seeds stacked by
  `runner.run_together`): each run's dropout masks are drawn from its own random streams
  (`streams`, gfl_bench/randomness.py), so each run sees the numbers it would see alone.
- One Adam over the stacks, with the first client's parameter groups (FED-PUB: masks without weight
  decay). Adam is elementwise, so it is each client's own Adam; the fused kernel is used, which
  computes the same update with different float rounding.
- The loss is Σ_m (client m's objective on its own slice), so each client's gradient is its own:
  for the GCN, mean CE over client m's training nodes + client m's penalty of its own parameters. After the last step each client's parameters carry their
  slice of the gradient, as after the per-client step (GCFL+ reads it).
- Evaluation is one forward in eval mode for every client (`evaluate`), scored per client on the
  padded rows of its validation and test splits (`metrics.metric_of_clients`: accuracy in one pass).
- Dropout masks are drawn client by client and epoch by epoch, in the order the per-client path
  draws them, so on a CPU both paths give the same numbers up to float summation order
  (`tests/test_batched.py`). On CUDA, dropout's RNG stream differs, so the two paths agree in
  distribution, not number by number.

Shapes: M clients, N = N_max padded nodes, F features, h hidden, C classes.
`Method.batchable` is derived from the client's hooks; `batched_trainer` picks the class for its backbone.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from gfl_bench.backbones import EGO_ACTIVATIONS, GCN, H2GCN, Backbone, GraphSAGE, H2GCNRepresentations, backbone_class
from gfl_bench.dropout import dropout_mask
from gfl_bench.graph_ops import ConstantSparse, operator_product, row_normalized
from gfl_bench.metrics import metric_of_clients
from gfl_bench.randomness import RunRandomness, SharedRandomness
from gfl_bench.training import TrainingClient

# Features at least this full are multiplied dense: an embedding bag spends several times a BLAS
# multiply-add per non-zero (dense features: 2-6x slower than `bmm`; 1.3 % full Cora-like: 15x faster).
DENSE_SHARE = 0.25


class BatchedTraining(ABC):
    """Stacks the models of `clients` (their parameters become views into the stacks) and trains them
    together; a subclass gives the network's batched forward and the loss."""

    input_major: ClassVar[tuple[str, ...]] = ()  # first-layer weights, stacked [M, F, h]
    operators: ClassVar[tuple[str, ...]] = ()  # the graph attributes packed block-diagonally
    dropout_widths: ClassVar[
        tuple[str, ...]
    ] = ()  # per dropout call of a forward: the stack whose last dimension is its width

    def __init__(self, clients: list[TrainingClient], streams: list[tuple[RunRandomness, int]] | None = None) -> None:
        self.clients = clients
        # `streams`: (random streams, client count) per run, in client order (several runs when stacked
        # along seeds). Kept as each run's streams and the positions of its clients in `clients`.
        streams = streams or [(SharedRandomness(), len(clients))]
        ends = itertools.accumulate(count for _, count in streams)
        self.runs = [(randomness, range(end - count, end)) for (randomness, count), end in zip(streams, ends)]
        first = clients[0]
        self.local_epochs = first.setup.local_epochs
        self.dropout = first.params.dropout
        device = first.train_index.device
        names = {id(p): name for name, p in first.model.named_parameters()}
        groups = [({**g, "params": [names[id(p)] for p in g["params"]]}) for g in first.optimizer.param_groups]
        self.stacks = {name: self._stack_and_rebind(name) for name in names.values()}
        # Fused Adam: one kernel over each stack (5× the per-tensor loop on a CPU for Cora-20); same update.
        self.optimizer = torch.optim.Adam(
            [{**g, "params": [self.stacks[n] for n in g["params"]], "foreach": None, "fused": True} for g in groups]
        )
        sizes = [c.graph.num_nodes for c in clients]
        self.sizes, self.padded = sizes, max(sizes)
        self.num_features = first.graph.num_features
        self.features = self._pack_features([c.graph.x for c in clients])
        self.adjacency = {name: self._operator([c.graph[name] for c in clients]) for name in self.operators}
        self.train_rows = torch.cat([m * self.padded + c.train_index for m, c in enumerate(clients)])
        self.train_labels = torch.cat([c.graph.y[c.train_index] for c in clients])
        self.train_weights = torch.cat(
            [torch.full((c.num_train,), 1.0 / c.num_train, device=device) for c in clients]
        )  # mean CE per client, summed over clients
        # For evaluation, every client's labels and splits on the padded rows ([M, N]; padding in no split).
        self.labels = torch.stack([F.pad(c.graph.y, (0, self.padded - size)) for c, size in zip(clients, sizes)])
        self.splits = {
            split: torch.stack(
                [F.pad(c.graph[f"{split}_mask"], (0, self.padded - size)) for c, size in zip(clients, sizes)]
            )
            for split in ("val", "test")
        }
        self.padding = torch.arange(self.padded, device=device)[None, :] >= torch.tensor(sizes, device=device)[:, None]

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

    def in_client_layout(self, stacks: dict[str, Tensor]) -> dict[str, Tensor]:
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
        dense product inside a sparse block-diagonal: on Tolokers METIS-5 that made the batched FedGMC
        round 7× slower than the per-client one. Such operators are applied client by client instead.
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

    def _first_layer(self, weight: Tensor) -> Tensor:
        """X_m W_m for every client m, W stacked input-major [M, F, h]: [M, N, h], no copy of W."""
        if isinstance(self.features, Tensor):
            return torch.bmm(self.features, weight)
        return (self.features @ weight.reshape(len(self.clients) * self.num_features, -1)).view(
            len(self.clients), self.padded, -1
        )

    def _spread(self, operator: str, h: Tensor) -> Tensor:
        """`operator` applied to every client's rows: [M, N, w] -> [M, N, w] (padding rows stay zero)."""
        adjacency = self.adjacency[operator]
        if isinstance(adjacency, list):
            padded = [
                F.pad(operator_product(a, h[m, : len(a)]), (0, 0, 0, self.padded - len(a)))
                for m, a in enumerate(adjacency)
            ]
            return torch.stack(padded)
        return operator_product(adjacency, h.reshape(-1, h.shape[-1])).view_as(h)

    def _dropout_masks(self) -> list[list[Tensor]]:
        """Per epoch, every dropout mask of every client, drawn in the per-client path's order."""
        keep = 1.0 - self.dropout
        device = self.train_rows.device
        widths = [self.stacks[name].shape[-1] for name in self.dropout_widths]
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

    @abstractmethod
    def forward(self, training: bool, masks: list[Tensor] | None = None) -> Tensor:
        """Every client's logits, [M, N, C]; `masks` are one epoch's dropout masks (None: no dropout)."""

    def loss(self, masks: list[Tensor] | None) -> Tensor:
        """Σ_m client m's local objective on its own slice of one batched forward; here TrainingClient's
        (mean CE over client m's training nodes + client m's penalty on its own parameters)."""
        logits = self.forward(training=True, masks=masks)
        chosen = logits.reshape(-1, logits.shape[-1])[self.train_rows]
        loss = (F.cross_entropy(chosen, self.train_labels, reduction="none") * self.train_weights).sum()
        penalty = self.penalty()
        return loss if penalty is None else loss + penalty

    @torch.no_grad()
    def predict(self) -> Tensor:
        """Every client's logits from its current model in one pass, [M, N, C]: client m's first
        `sizes[m]` rows are what its `Client.predict` gives, the rest is padding."""
        return self.forward(training=False)

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


class BatchedGCNTraining(BatchedTraining):
    """The (masked) GCN: Â relu(Â X W1 + b1) W2 + b2 -> relu -> classifier, for every client at once."""

    input_major = ("conv1.lin.weight", "conv1.mask")
    operators = ("gcn_adj",)
    dropout_widths = ("conv1.bias", "conv2.bias")  # after each convolution, h wide

    def __init__(self, clients: list[TrainingClient], streams: list[tuple[RunRandomness, int]] | None = None) -> None:
        model = clients[0].model
        # FED-PUB's masked GCN: the eval-mode pruning of its masks (`MaskedGCN.pruned`), None for the plain GCN
        self.pruned: Callable[[Tensor], Tensor] | None = model.pruned if hasattr(model.conv1, "mask") else None
        super().__init__(clients, streams)

    def _weight(self, layer: str, training: bool) -> Tensor:
        """The stacked weight of `layer` as the forward uses it: W, or W ⊙ M for the masked GCN (pruned in eval)."""
        weight = self.stacks[f"{layer}.weight" if layer == "classifier" else f"{layer}.lin.weight"]
        if self.pruned is None:
            return weight
        mask = self.stacks[f"{layer}.mask"]
        return weight * (mask if training else self.pruned(mask))

    def forward(self, training: bool, masks: list[Tensor] | None = None) -> Tensor:
        h = F.relu(
            self._spread("gcn_adj", self._first_layer(self._weight("conv1", training)))
            + self.stacks["conv1.bias"][:, None, :]
        )
        h = h * masks[0] if masks else h
        projected = torch.bmm(h, self._weight("conv2", training).transpose(1, 2))
        h = F.relu(self._spread("gcn_adj", projected) + self.stacks["conv2.bias"][:, None, :])
        h = h * masks[1] if masks else h
        return (
            torch.bmm(h, self._weight("classifier", training).transpose(1, 2))
            + self.stacks["classifier.bias"][:, None, :]
        )


class BatchedSAGETraining(BatchedTraining):
    """GraphSAGE (mean aggregator): relu(mean_N(h) W_l + b_l + h W_r) twice -> relu -> classifier, for every
    client at once. mean_N(X) W_l is computed as mean_N(X W_l) (the same function; one sparse product of
    the features instead of a dense [N, F] mean), each client's mean over its own neighbours."""

    input_major = ("conv1.lin_l.weight", "conv1.lin_r.weight")
    dropout_widths = ("conv1.lin_l.bias", "conv2.lin_l.bias")  # after each convolution's relu, h wide

    def __init__(self, clients: list[TrainingClient], streams: list[tuple[RunRandomness, int]] | None = None) -> None:
        super().__init__(clients, streams)
        self.adjacency["mean"] = self._operator([row_normalized(c.graph.adj) for c in clients])

    def _root_and_neighbours(self, layer: str, h: Tensor | None) -> Tensor:
        """One SAGE layer for every client: h W_r + mean_N(h W_l) + b_l, h None for the features."""
        weight = {side: self.stacks[f"{layer}.lin_{side}.weight"] for side in ("l", "r")}
        if h is None:
            root, neighbours = self._first_layer(weight["r"]), self._first_layer(weight["l"])
        else:
            root, neighbours = (torch.bmm(h, weight[side].transpose(1, 2)) for side in ("r", "l"))
        return self._spread("mean", neighbours) + self.stacks[f"{layer}.lin_l.bias"][:, None, :] + root

    def forward(self, training: bool, masks: list[Tensor] | None = None) -> Tensor:
        h = F.relu(self._root_and_neighbours("conv1", None))
        h = h * masks[0] if masks else h
        h = F.relu(self._root_and_neighbours("conv2", h))
        h = h * masks[1] if masks else h
        return (
            torch.bmm(h, self.stacks["classifier.weight"].transpose(1, 2)) + self.stacks["classifier.bias"][:, None, :]
        )


class BatchedH2GCNTraining(BatchedTraining):
    """H2GCN (K = 2): r0 = σ(X W_ego), r1 = [A1 r0 || A2 r0], r2 = [A1 r1 || A2 r1], classifier on the
    dropped-out [r0 || r1 || r2], for every client at once; each client's objective reads its slice."""

    input_major = ("ego.weight",)
    operators = ("hop1_adj", "hop2_adj")
    dropout_widths = ("classifier.weight",)  # one dropout on the 7h-wide input of the classifier

    def __init__(self, clients: list[TrainingClient], streams: list[tuple[RunRandomness, int]] | None = None) -> None:
        self.activation = EGO_ACTIVATIONS[clients[0].model.activation]
        super().__init__(clients, streams)

    def representations(self) -> H2GCNRepresentations:
        """Every client's representations, each [M, N, ·]."""
        ego = self.activation(self._first_layer(self.stacks["ego.weight"]))  # [M, N, h]
        hop1, hop2 = self._spread("hop1_adj", ego), self._spread("hop2_adj", ego)
        r1 = torch.cat([hop1, hop2], dim=-1)  # [M, N, 2h]
        r2 = torch.cat([self._spread("hop1_adj", r1), self._spread("hop2_adj", r1)], dim=-1)  # [M, N, 4h]
        return H2GCNRepresentations(ego, hop1, hop2, torch.cat([ego, r1, r2], dim=-1))  # combined [M, N, 7h]

    def _logits(self, combined: Tensor, masks: list[Tensor] | None) -> Tensor:
        h = combined * masks[0] if masks else combined
        return torch.bmm(h, self.stacks["classifier.weight"].transpose(1, 2))  # [M, N, C], no bias (official)

    def forward(self, training: bool, masks: list[Tensor] | None = None) -> Tensor:
        return self._logits(self.representations().combined, masks)

    def loss(self, masks: list[Tensor] | None) -> Tensor:
        """Σ_m client m's `objective` on its own (unpadded) representations and logits."""
        reps = self.representations()
        logits = self._logits(reps.combined, masks)
        per_client = zip(*(t.unbind(0) for t in (reps.ego, reps.hop1, reps.hop2, reps.combined, logits)))
        slices = [
            (H2GCNRepresentations(ego[:size], hop1[:size], hop2[:size], combined[:size]), client_logits[:size])
            for size, (ego, hop1, hop2, combined, client_logits) in zip(self.sizes, per_client)
        ]
        for _, clients in self.runs:  # per run: a stacked run's constants must not depend on its companions
            run_clients = [self.clients[m] for m in clients]
            type(run_clients[0]).group_step(run_clients, [slices[m][0] for m in clients])
        total = torch.zeros((), device=logits.device)
        for client, (own, client_logits) in zip(self.clients, slices):
            total = total + client.objective(client_logits, own)
        penalty = self.penalty()
        return total if penalty is None else total + penalty


# The batched network for each backbone family; a backbone batches when its class is one of these
# (FED-PUB's masked GCN is a GCN, the H2GCN variants are H2GCNs).
TRAINERS: dict[type[Backbone], type[BatchedTraining]] = {
    GCN: BatchedGCNTraining, GraphSAGE: BatchedSAGETraining, H2GCN: BatchedH2GCNTraining,
}  # fmt: skip


def batched_trainer(clients: list[TrainingClient], backbone: str) -> type[BatchedTraining] | None:
    """The batched trainer class for these clients' backbone, or None where the per-client path must run:
    another backbone, a single client, or a client without training nodes (it does not step in the
    per-client path, and Adam would move it here). The runner builds it, with each run's random
    streams, at the first stage where every client trains locally (`TrainingClient.trains_locally`)."""
    if len(clients) < 2 or any(c.num_train == 0 for c in clients):
        return None
    network = backbone_class(backbone)
    return next((trainer for family, trainer in TRAINERS.items() if issubclass(network, family)), None)
