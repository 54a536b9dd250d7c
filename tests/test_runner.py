"""Protocol rules of the runner: best-round selection, metric choice, record contents."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from gflbench.core.metrics import accuracy, metric_of_clients, roc_auc
from gflbench.data import DATASETS
from gflbench.errors import UserError
from gflbench.experiments.runner import best_round, per_client_best, resolve_device, run
from gflbench.experiments.spec import make_spec


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
    assert (
        record["val_client_best"] >= record["val"] - 1e-6
    )  # float32 client mean; each client's own best cannot be worse on validation
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


def test_seconds_per_round_column_is_the_median_after_the_first_round_for_new_records(tiny_federation, tmp_path):
    """Round 0 carries one-off work; a new record stores it apart and the column is the later rounds' median.
    A record written before (no `first_round_seconds`) keeps its column: the mean of all its rounds."""
    from gflbench.experiments.store import RunStore, round_seconds

    record = run(make_spec("fedavg", "tiny", "metis", 5, 0, rounds=4), tiny_federation, torch.device("cpu"))
    seconds = record["seconds_per_round"]
    assert len(seconds) == 4 and record["first_round_seconds"] == seconds[0]
    with RunStore(tmp_path / "runs.sqlite") as store:
        store.put(record)
        column = float(store.frame()["seconds_per_round"].iloc[0])
    assert column == pytest.approx(sorted(seconds[1:])[1])  # the median of three
    old = {k: v for k, v in record.items() if k != "first_round_seconds"} | {"seconds_per_round": [9.0, 1.0, 2.0]}
    assert round_seconds(old) == 4.0  # the old rule, unchanged
    assert round_seconds({**old, "first_round_seconds": 9.0}) == 1.5
    assert round_seconds({"seconds_per_round": [3.0], "first_round_seconds": 3.0}) == 3.0  # one round: itself


def test_nondeterministic_kernels_are_named_and_other_warnings_kept():
    """Deterministic mode warns (warn_only) where a kernel has no deterministic form; workers ignore
    warnings, so the record names the kernel instead. `put_` is one on the CPU too."""
    import warnings

    from gflbench.core.randomness import nondeterministic_kernels, seed_everything

    seed_everything(0, torch.device("cpu"))
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("ignore")  # as in a worker process
        warnings.filterwarnings("always", message="kept")
        with nondeterministic_kernels() as kernels:
            torch.zeros(3).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
            warnings.warn("kept", stacklevel=1)
            warnings.warn("dropped as before", stacklevel=1)
    assert kernels == {"put_"}
    assert [str(w.message) for w in shown] == ["kept"]


def test_a_record_names_no_nondeterministic_kernel_on_the_cpu(tiny_federation, cpu):
    record = run(make_spec("fedavg", "tiny", "metis", 5, 0, rounds=2), tiny_federation, cpu)
    assert record["nondeterministic_kernels"] == []


def test_seeded_restores_the_runs_generators(monkeypatch):
    """FedSSA seeds each client's heads from (seed, client) and must leave the run's streams as they were:
    the CPU's (checked), and on CUDA the run's device generator, which `torch.manual_seed` reseeds too."""
    from gflbench.core import randomness

    torch.manual_seed(5)
    before = torch.get_rng_state()
    with randomness.seeded(123, torch.device("cpu")):
        inside = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before)
    with randomness.seeded(123, torch.device("cpu")):
        assert torch.equal(torch.rand(3), inside)
    forked = []
    monkeypatch.setattr(
        torch.random, "fork_rng", lambda **kw: forked.append(kw) or __import__("contextlib").nullcontext()
    )
    monkeypatch.setattr(torch, "manual_seed", lambda seed: None)
    with randomness.seeded(1, torch.device("cuda", 1)):
        pass
    assert forked == [{"devices": [1], "device_type": "cuda"}]


def test_cuda_peak_memory_counts_the_runs_own_graphs_once(monkeypatch):
    """The peak is the run's: memory held before its start (device graphs other runs of the worker cached)
    is left out, its own input graphs are counted once, cached or not. torch's CUDA counters faked."""
    from torch_geometric.data import Data

    from gflbench.core import rounds

    counters = {"allocated": 0, "reserved": 0, "max_allocated": 0, "max_reserved": 0}
    for name, key in (
        ("memory_allocated", "allocated"),
        ("memory_reserved", "reserved"),
        ("max_memory_allocated", "max_allocated"),
        ("max_memory_reserved", "max_reserved"),
    ):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, key=key: counters[key])  # fmt: skip
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def reset(device=None):
        counters["max_allocated"], counters["max_reserved"] = counters["allocated"], counters["reserved"]

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    graphs = [Data(x=torch.zeros(10, 5), edge_index=torch.zeros(2, 6, dtype=torch.long))]
    own = 10 * 5 * 4 + 2 * 6 * 8
    assert rounds._bytes_of(graphs) == own
    other_runs_cache = 1_000_000
    counters.update(allocated=other_runs_cache + own, reserved=2 * other_runs_cache + own)
    memory = rounds._DeviceMemory(torch.device("cuda"), graphs)
    counters.update(max_allocated=other_runs_cache + own + 5000, max_reserved=2 * other_runs_cache + own + 8192)
    assert memory.peaks() == {"peak_memory_bytes": own + 5000, "peak_reserved_bytes": own + 8192}
