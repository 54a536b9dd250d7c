"""Protocol rules of the runner: best-round selection, metric choice, record contents."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from gfl_bench.datasets import DATASETS
from gfl_bench.metrics import accuracy, metric_of_clients, roc_auc
from gfl_bench.runner import best_round, per_client_best, resolve_device, run
from gfl_bench.errors import UserError
from gfl_bench.spec import make_spec


def test_best_round_is_first_maximum_of_validation():
    assert best_round([0.5, 0.7, 0.7, 0.6]) == 1
    assert best_round([math.nan, 0.2, 0.9, math.nan]) == 2
    assert best_round([math.nan, math.nan]) == 0


def test_per_client_rule_takes_each_clients_own_best_validation_round():
    nan = math.nan
    val = [[0.5, 0.1, nan], [0.9, 0.3, nan], [0.9, 0.2, nan]]  # rounds x clients; client 2 never defined
    test = [[0.4, 0.6, 0.5], [0.7, 0.8, 0.5], [0.1, 0.0, 0.5]]
    mean_val, mean_test = per_client_best(val, test)
    assert mean_val == pytest.approx((0.9 + 0.3) / 2)
    assert mean_test == pytest.approx((0.7 + 0.8) / 2)  # first maximum: round 1 for client 0, not round 2
    assert math.isnan(per_client_best([[nan]], [[0.3]])[1])


def test_record_reports_test_at_best_validation_round(tiny_federation, device):
    spec = make_spec("fedavg", "tiny", "metis", 5, 0, rounds=8)
    record = run(spec, tiny_federation, device)
    best = record["best_round"]
    assert record["val"] == max(record["curves"]["val"])
    assert record["test"] == record["curves"]["test"][best]
    assert record["val_weighted"] == record["curves"]["val_weighted"][best]
    per_client_test = record["client_curves"]["test"]
    assert len(per_client_test) == 8 and all(len(r) == 5 for r in per_client_test)
    assert record["test"] == pytest.approx(sum(per_client_test[best]) / 5)
    assert (record["val_client_best"], record["test_client_best"]) == per_client_best(
        record["client_curves"]["val"], per_client_test
    )
    assert record["val_client_best"] >= record["val"] - 1e-6  # float32 client mean; each client's own best cannot be worse on validation
    assert len(record["seconds_per_round"]) == 8 and all(s > 0 for s in record["seconds_per_round"])
    assert record["config"]["params"]["backbone"] == "gcn" and record["protocol"] == "paper"
    assert record["partition_hash"] == tiny_federation.partition.digest()
    assert record["versions"]["torch"] == torch.__version__.split("+")[0] or record["versions"]["torch"].startswith(
        torch.__version__.split("+")[0]
    )


def test_metric_per_dataset_follows_the_paper():
    auc = {name for name, spec in DATASETS.items() if spec.metric == "roc_auc"}
    assert auc == {"minesweeper", "tolokers", "questions"}
    assert DATASETS["roman-empire"].metric == "accuracy"


def test_roc_auc_matches_sklearn_with_ties():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(200, 2, generator=gen).round(decimals=1)  # rounding makes ties
    y = torch.randint(0, 2, (200,), generator=gen)
    expected = roc_auc_score(y.numpy(), torch.softmax(logits.double(), 1)[:, 1].numpy())
    assert roc_auc(logits, y).item() == pytest.approx(expected, abs=1e-6)
    assert math.isnan(roc_auc(logits, torch.ones(200, dtype=torch.long)).item())


def test_accuracy():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1])).item() == pytest.approx(2 / 3)
    assert math.isnan(accuracy(logits[:0], torch.tensor([], dtype=torch.long)).item())


@pytest.mark.parametrize(("name", "metric"), [("accuracy", accuracy), ("roc_auc", roc_auc)])
def test_metric_of_clients_is_each_clients_own_metric_bit_for_bit(name, metric):
    """The batched path's one-pass metric gives every client exactly the number the per-client
    metric gives on its own nodes, NaN for a client whose split is empty (the last one)."""
    gen = torch.Generator().manual_seed(2)
    clients, padded = 7, 300
    logits = torch.randn(clients, padded, 3, generator=gen).round(decimals=1)  # ties in argmax and ranks
    y = torch.randint(0, 2 if name == "roc_auc" else 3, (clients, padded), generator=gen)
    mask = torch.rand(clients, padded, generator=gen) < torch.linspace(0.9, 0.05, clients)[:, None]
    mask[-1] = False
    together = metric_of_clients(name, logits, y, mask)
    for m in range(clients - 1):
        assert together[m].item() == metric(logits[m][mask[m]], y[m][mask[m]]).item()
    assert math.isnan(together[-1].item())


def test_missing_cuda_is_a_user_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(UserError):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_an_absent_cuda_index_is_a_user_error(monkeypatch):
    """cuda:N beyond the devices torch sees is refused by name (testable without a GPU: torch's answers faked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match=r"device cuda:2 is not there: torch sees 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
