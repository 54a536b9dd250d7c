"""The batched path (gfl_bench/core/batched.py) computes what the per-client path computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gflbench.backbones import build_backbone
from gflbench.core.method import Setup, method_class
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec

BATCHED_CASES = [
    ("local", {}),
    ("fedavg", {}),
    ("fedper", {}),
    ("fedprox", {"mu": "0.5"}),  # a proximal term large enough to move the numbers
    ("gcfl", {}),
    ("fedpub", {}),  # masked GCN, masks without weight decay off (the code's default)
    ("fedpub", {"regularizer_grad": "true", "mask_weight_decay": "false", "l1": "0.01"}),  # the paper's penalty
    ("fedavg", {"backbone": "h2gcn-tanh"}),  # H2GCN with the plain CE objective
    ("fedavg", {"backbone": "sage"}),  # GraphSAGE, mean aggregator
    ("fedprox", {"backbone": "h2gcn", "mu": "0.5"}),
    ("fedgmc", {}),  # calibration losses on each client's slice of the batched representations
    ("fedgmc", {"share": "all", "combine": "ring"}),
    (
        "fedsage+",
        {"local_gen_epochs": "3", "fed_gen_epochs": "2"},
    ),  # GraphSAGE on the mended graphs, after per-client generator stages
]


def run_with_logits(spec, federation, device, monkeypatch, batched: bool) -> tuple[dict, list[list]]:
    """The run's record and every client's evaluated logits, round by round (captured at evaluation)."""
    import gflbench.core.rounds as runner  # the engine, whose round loop calls `_evaluate`
    from gflbench.core.batched import BatchedTraining

    evaluate, predict, seen = runner._evaluate, BatchedTraining.predict, []

    def capturing(clients, metric):
        seen.append([c.predict() for c in clients])
        return evaluate(clients, metric)

    def capturing_together(trainer):
        logits = predict(trainer)
        seen.append([logits[m, :size].clone() for m, size in enumerate(trainer.sizes)])
        return logits

    monkeypatch.setattr(runner, "_evaluate", capturing)
    monkeypatch.setattr(BatchedTraining, "predict", capturing_together)
    record = run(spec, federation, device, batched=batched)
    monkeypatch.setattr(runner, "_evaluate", evaluate)
    monkeypatch.setattr(BatchedTraining, "predict", predict)
    return record, seen


@pytest.mark.parametrize(("method", "overrides"), BATCHED_CASES)
@pytest.mark.parametrize("epochs", [1, 2])
def test_batched_clients_give_the_per_client_numbers(tiny_federation, cpu, monkeypatch, method, overrides, epochs):
    """Every client's logits after every round agree to float rounding. (Accuracies are not compared
    number for number: a test node whose two logits tie to the last bit may flip between the paths.)"""
    spec = make_spec(method, "tiny", "metis", 5, 3, overrides, rounds=4, local_epochs=epochs)
    one_by_one, expected = run_with_logits(spec, tiny_federation, cpu, monkeypatch, batched=False)
    together, actual = run_with_logits(spec, tiny_federation, cpu, monkeypatch, batched=True)
    assert (one_by_one["execution"], together["execution"]) == ("per-client", "batched")
    for round_expected, round_actual in zip(expected, actual, strict=True):
        for client_expected, client_actual in zip(round_expected, round_actual, strict=True):
            torch.testing.assert_close(client_actual, client_expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(together["client_curves"]["val"], one_by_one["client_curves"]["val"], atol=0.05)
    np.testing.assert_allclose(together["bytes_up"], one_by_one["bytes_up"])


def test_batched_gcfl_plus_splits_as_the_per_client_path(tiny_federation, cpu):
    """GCFL+ reads each client's last gradient: the batched path must leave it on the client's parameters."""
    forced = {"variant": "gcfl+", "eps1": "100", "eps2": "0", "warmup_rounds": "2", "seq_length": "2"}
    spec = make_spec("gcfl", "tiny", "metis", 5, 0, forced, rounds=6)
    one_by_one = run(spec, tiny_federation, cpu)
    together = run(spec, tiny_federation, cpu, batched=True)
    assert together["execution"] == "batched"
    assert max(one_by_one["diagnostics"]["clusters"]) > 1  # the split happened, so the grad norms were used
    assert together["diagnostics"]["clusters"] == one_by_one["diagnostics"]["clusters"]
    np.testing.assert_allclose(together["client_curves"]["val"], one_by_one["client_curves"]["val"], atol=1e-5)


@pytest.mark.parametrize("method", ["fedavg", "fedgmc"])
def test_batched_logits_match_after_three_rounds_on_cora(cpu, monkeypatch, method):
    import os
    from pathlib import Path

    if not (Path(os.environ.get("GFLBENCH_RAW_MIRROR", "../shared/data")) / "Cora").is_dir():
        pytest.skip("Cora raw files not in GFLBENCH_RAW_MIRROR")
    data = DataCache(None, None).federated("cora", "metis", 10, 1234)
    spec = make_spec(method, "cora", "metis", 10, 0, rounds=3)
    one_by_one, expected = run_with_logits(spec, data, cpu, monkeypatch, batched=False)
    together, actual = run_with_logits(spec, data, cpu, monkeypatch, batched=True)
    assert together["execution"] == "batched"
    for client_expected, client_actual in zip(expected[-1], actual[-1], strict=True):
        torch.testing.assert_close(client_actual, client_expected, rtol=1e-4, atol=1e-4)
    assert together["test"] == pytest.approx(one_by_one["test"], abs=2e-3)  # at most a tie flip or two


def test_methods_that_cannot_batch_run_per_client(tiny_federation, cpu):
    spec = make_spec("fedavg", "tiny", "metis", 5, 0, {"backbone": "gamlp"}, rounds=2)  # no batched GAMLP
    assert run(spec, tiny_federation, cpu, batched=True)["execution"] == "per-client"
    gta = make_spec("fedgta", "tiny", "metis", 5, 0, rounds=2)  # not `batchable`: label propagation after training
    assert run(gta, tiny_federation, cpu, batched=True)["execution"] == "per-client"


def test_constant_sparse_product_and_gradient_equal_the_dense_ones():
    import torch

    from gflbench.backbones.graph_ops import ConstantSparse

    generator = torch.Generator().manual_seed(0)
    dense = torch.rand(7, 5, generator=generator) * (torch.rand(7, 5, generator=generator) < 0.4)
    dense[3] = 0.0  # an empty row, and (likely) empty columns: empty bags must give zeros
    weight = torch.randn(5, 3, generator=generator, requires_grad=True)
    reference = torch.randn(5, 3, generator=generator)
    reference.copy_(weight.detach()).requires_grad_(True)
    upstream = torch.randn(7, 3, generator=generator)
    (ConstantSparse(dense) @ weight).mul(upstream).sum().backward()
    (dense @ reference).mul(upstream).sum().backward()
    torch.testing.assert_close(ConstantSparse(dense) @ weight.detach(), dense @ weight.detach())
    torch.testing.assert_close(weight.grad, reference.grad)


def test_operator_product_keeps_the_transpose_and_gives_torchs_numbers_bit_for_bit():
    """`graph_ops.operator_product`'s backward multiplies by a transpose kept per operator (the operator
    itself when symmetric) and gives exactly torch's product and gradient, for a symmetric GCN operator
    and the non-symmetric row-normalised mean."""
    import gc

    from gflbench.backbones.graph_ops import (
        _TRANSPOSES,
        _transpose,
        binary_adjacency,
        gcn_adjacency,
        operator_product,
        row_normalized,
    )

    before = len(_TRANSPOSES)
    edge_index = torch.tensor([[0, 1, 1, 2, 0, 2, 3, 1], [1, 0, 2, 1, 2, 0, 1, 3]])
    generator = torch.Generator().manual_seed(0)
    for operator, symmetric in [
        (gcn_adjacency(edge_index, 5), True),
        (row_normalized(binary_adjacency(edge_index, 5)), False),
    ]:
        x = torch.randn(5, 3, generator=generator, requires_grad=True)
        upstream = torch.randn(5, 3, generator=generator)
        ours = operator_product(operator, x)
        (grad,) = torch.autograd.grad(ours, x, upstream)
        (expected,) = torch.autograd.grad(operator @ x, x, upstream)
        assert torch.equal(ours, operator @ x) and torch.equal(grad, expected)
        torch.testing.assert_close(grad, operator.to_dense().T @ upstream)  # the transpose, not the operator
        assert (_transpose(operator) is operator) is symmetric
        kept = _TRANSPOSES[operator]
        operator_product(operator, x)
        assert _TRANSPOSES[operator] is kept  # made once per operator
    del operator, ours, grad, expected
    gc.collect()
    assert len(_TRANSPOSES) == before  # dropped with their operators


def test_tiny_mixes_dense_and_sparse_2hop_operators(tiny_federation):
    """The H2GCN cases above cover both operator kinds of the batched path only while `tiny`'s clients mix
    them (graph_ops.dense_if_no_larger): a dense 2-hop ring on some clients, a CSR one on others."""
    from gflbench.backbones.graph_ops import h2gcn_adjacencies

    layouts = {h2gcn_adjacencies(g.edge_index, g.num_nodes)[1].layout for g in tiny_federation.graphs}
    assert layouts == {torch.strided, torch.sparse_csr}


def test_row_normalized_adjacency_is_sage_mean_aggregation():
    """D⁻¹A x is PyG's mean over each node's neighbours; an isolated node (3) gets zero, as in SAGEConv."""
    from torch_geometric.utils import spmm

    from gflbench.backbones.graph_ops import binary_adjacency, row_normalized

    edge_index = torch.tensor([[0, 1, 1, 2, 0, 2], [1, 0, 2, 1, 2, 0]])
    adjacency = binary_adjacency(edge_index, 4)
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0], [13.0, 17.0]])
    mean = row_normalized(adjacency) @ x
    torch.testing.assert_close(mean, torch.tensor([[5.0, 8.0], [4.0, 6.5], [2.0, 3.5], [0.0, 0.0]]))
    torch.testing.assert_close(mean, spmm(adjacency, x, reduce="mean"))


@pytest.mark.parametrize("kept", [16, 2])
def test_first_layer_is_each_clients_own_product_for_dense_and_sparse_features(tiny_federation, cpu, kept):
    """Dense features (tiny's, all 16 non-zero) go through one padded bmm, sparse ones (2 of 16 kept)
    through the block-diagonal sparse product; either way each client's first layer is its own X_m W_m."""
    from gflbench.backbones.graph_ops import ConstantSparse
    from gflbench.core.batched import BatchedTraining

    spec = make_spec("fedavg", "tiny", "metis", 5, 0, rounds=1)
    cls = method_class("fedavg")
    setup = Setup(tiny_federation.num_features, tiny_federation.num_classes, 5, 1, 1, cpu, 0)
    clients = []
    for cid, shared in enumerate(tiny_federation.on_device(spec.params, cpu)):
        graph = shared.clone()
        graph.x = graph.x.clone()
        graph.x[:, kept:] = 0.0
        clients.append(
            cls.client(
                cid, graph, build_backbone(spec.params, setup.num_features, setup.num_classes), spec.params, setup
            )
        )
    trainer = BatchedTraining(clients)
    assert isinstance(trainer.graph.inputs, ConstantSparse) == (kept == 2)
    assert trainer.input_major == {"conv1.lin.weight"}  # the one weight with F input columns, stored [M, F, h]
    weight = trainer.in_client_layout(trainer.stacks)["conv1.lin.weight"]  # [M, h, F], as the clients hold it
    assert weight.transpose(1, 2).is_contiguous()
    product = trainer.graph.features(weight)
    for m, client in enumerate(clients):
        torch.testing.assert_close(product[m, : client.graph.num_nodes], client.graph.x @ weight[m].T)
        assert not product[m, client.graph.num_nodes :].any()  # padding rows stay zero


def test_batched_evaluation_stops_a_diverged_run(tiny_federation, cpu):
    """The one-pass evaluation checks every client's logits for NaN and inf, as the per-client one does."""
    from gflbench.experiments.runner import RunFailed

    spec = make_spec("fedavg", "tiny", "metis", 5, 0, {"lr": "1e30"}, rounds=5)
    with pytest.raises(RunFailed, match="non-finite predictions at round"):
        run(spec, tiny_federation, cpu, batched=True)
