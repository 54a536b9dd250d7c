"""Feature normalisation as a run setting: the `paper` presets that read features unnormalised (FedTAD, FedGTA and
AdaFGL's loaders), the `--set feature_norm=` switch, keys that stay what they were, and the data each run gets."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.core.federation import DataCache
from gflbench.errors import UserError
from gflbench.experiments.protocol import write_tuned
from gflbench.experiments.spec import make_spec, spec_of_record
from gflbench.experiments.store import RunStore


@pytest.mark.parametrize(
    ("method", "dataset", "expected"),
    [
        ("fedtad", "cora", "none"),  # every loader of the official code reads with no transform
        ("fedtad", "amazon-computer", "none"),
        ("fedtad", "minesweeper", None),  # the protocol leaves it unnormalised already: nothing to record
        ("fedgta", "pubmed", "none"),
        ("fedgta", "amazon-computer", None),  # the official code has no Amazon loader: the protocol's
        ("adafgl", "citeseer", "none"),
        ("fedavg", "cora", None),  # FED-PUB's generator normalises, as the protocol does
        ("fediih", "cora", None),
    ],
)
def test_the_paper_preset_names_the_sources_normalisation(method, dataset, expected):
    spec = make_spec(method, dataset, "metis", 10, 0)
    assert spec.feature_norm == expected
    assert spec.config().get("feature_norm") == expected


def test_fair_and_tuning_trials_run_every_method_on_the_datasets_features(tmp_path):
    write_tuned(tmp_path, "cora", "metis", 10, "fedtad", {"values": {"lr": 0.02}})
    assert make_spec("fedtad", "cora", "metis", 10, 0, protocol="fair", tuned=tmp_path).feature_norm is None
    assert make_spec("fedtad", "cora", "metis", 10, 0, shared_schedule=True).feature_norm is None


def test_the_switch_overrides_the_preset_and_the_datasets_own_value_keeps_the_old_key():
    default = make_spec("fedtad", "cora", "metis", 10, 0, overrides={"feature_norm": "row"})
    assert default.feature_norm is None and "feature_norm" not in default.config()
    # the same configuration on a graph the protocol leaves unnormalised, where the preset row changes nothing
    assert default.config_key == make_spec("fedtad", "minesweeper", "metis", 10, 0).config_key
    raw = make_spec("fedavg", "cora", "metis", 10, 0, overrides={"feature_norm": "none"})
    assert raw.feature_norm == "none" and raw.config_key != make_spec("fedavg", "cora", "metis", 10, 0).config_key
    assert make_spec("fedavg", "minesweeper", "metis", 10, 0, overrides={"feature_norm": "row"}).feature_norm == "row"
    with pytest.raises(UserError, match="feature_norm must be one of row, none, got 'l2'"):
        make_spec("fedavg", "cora", "metis", 10, 0, overrides={"feature_norm": "l2"})


def test_a_normalised_federation_has_the_same_partition_and_row_normalised_x():
    cache = DataCache(None, None)
    plain = cache.federated("tiny", "metis", 5, 1234)  # tiny is unnormalised, as the heterophilous sets
    scaled = cache.federated("tiny", "metis", 5, 1234, "row")
    assert all(
        torch.equal(a, b) for a, b in zip(plain.partition.client_nodes, scaled.partition.client_nodes, strict=True)
    )
    assert torch.equal(plain.partition.split, scaled.partition.split)
    assert plain.data_fingerprint != scaled.data_fingerprint
    for a, b in zip(plain.graphs, scaled.graphs, strict=True):
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)
        shifted = a.x - cache.graph("tiny").x.min()  # NormalizeFeatures shifts by the graph's minimum first
        assert torch.allclose(b.x, shifted / shifted.sum(dim=1, keepdim=True).clamp(min=1))
    assert cache.federated("tiny", "metis", 5, 1234, "none") is not plain  # an explicit value is its own entry


def test_a_run_records_its_normalisation_and_its_record_gives_back_its_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    store = tmp_path / "runs.sqlite"
    args = ["run", "-m", "fedavg,fedprox", "-d", "tiny", "--clients", "5", "--rounds", "3", "--seeds", "1", "--store"]
    for extra in ([], ["--set", "feature_norm=row"]):
        result = CliRunner().invoke(app, [*args, str(store), *extra])
        assert result.exit_code == 0, result.output
    with RunStore(store) as runs:
        records = list(runs.records())
    assert sorted(str(r["config"].get("feature_norm")) for r in records) == ["None", "None", "row", "row"]
    assert len({r["test"] for r in records}) == 2  # the features changed what was learned (FedProx is FedAvg)
    for record in records:
        assert spec_of_record(record).run_key == record["run_key"]
    table = ["table", "-d", "tiny", "-m", "fedavg,fedprox", "--rounds", "3", "--seeds", "1", "-f", "markdown"]
    shown = CliRunner().invoke(app, [*table, "--set", "feature_norm=row", "--store", str(store)])
    assert shown.exit_code == 0 and "FedAvg [gcn, row-normalised x]" in shown.output
    # FedProx at one local epoch computes FedAvg only on the same features
    assert "FedProx [gcn, row-normalised x] ≡ FedAvg" in shown.output
    plain = CliRunner().invoke(app, [*table, "--store", str(store)])
    assert "FedAvg [gcn] " in plain.output and "normalised" not in plain.output


def test_an_unknown_normalisation_is_one_line_exit_2_and_nothing_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    store = tmp_path / "runs.sqlite"
    result = CliRunner().invoke(
        app, ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--rounds", "2", "--seeds", "1",
              "--set", "feature_norm=l2", "--store", str(store)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "feature_norm must be one of row, none" in result.output and "Traceback" not in result.output
    assert not store.exists()
