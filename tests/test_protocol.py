"""Protocols: preset resolution, the protocol in every record, tables that never mix protocols, and tune."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.core.method import all_methods, resolve_params
from gflbench.errors import UserError
from gflbench.experiments.protocol import MissingTuning, write_tuned
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore

TINY = ["-d", "tiny", "--clients", "5", "--rounds", "4"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GFLBENCH_RESULTS", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("GFLBENCH_TUNED", str(tmp_path / "tuned"))
    return tmp_path


def test_paper_preset_is_the_code_family_configuration():
    fedavg = make_spec("fedavg", "cora", "metis", 10, 0).params
    assert (fedavg.backbone, fedavg.weighting) == ("gcn", "uniform")  # FED-PUB's code: GCN, plain mean
    assert make_spec("local", "cora", "metis", 10, 0).params.backbone == "gcn"
    assert make_spec("fedpub", "cora", "metis", 10, 0).params.regularizer_grad is False  # the released code
    assert make_spec("fedpub", "cora", "metis", 10, 0).params.norm_scale == 3.0  # scripts: 3 disjoint ...
    assert make_spec("fedpub", "cora", "overlap", 30, 0).params.norm_scale == 5.0  # ... 5 overlapping
    assert make_spec("fedgmc", "cora", "metis", 10, 0).params.backbone == "h2gcn-tanh"
    # --set applies on top of the preset
    assert make_spec("fedpub", "cora", "metis", 10, 0, {"norm_scale": "7"}).params.norm_scale == 7.0


def test_protocol_enters_the_configuration_key(tmp_path):
    write_tuned(tmp_path, "tiny", "metis", 5, "fedavg", {"values": {"lr": 0.01}})
    paper = make_spec("fedavg", "tiny", "metis", 5, 0, {"lr": "0.01"})
    fair = make_spec("fedavg", "tiny", "metis", 5, 0, protocol="fair", tuned=tmp_path)
    assert paper.params == fair.params and paper.config_key != fair.config_key


def test_fair_reads_tuned_values_and_names_the_tune_command_when_missing(tmp_path):
    with pytest.raises(
        MissingTuning, match="gflbench tune --method fedprox --dataset tiny --partition metis --clients 5"
    ):
        make_spec("fedprox", "tiny", "metis", 5, 0, protocol="fair", tuned=tmp_path)
    write_tuned(tmp_path, "tiny", "metis", 5, "fedprox", {"values": {"lr": 0.02, "mu": 0.5, "backbone": "h2gcn-tanh"}})
    params = make_spec("fedprox", "tiny", "metis", 5, 0, protocol="fair", tuned=tmp_path).params
    assert (params.lr, params.mu, params.backbone) == (0.02, 0.5, "h2gcn-tanh")
    with pytest.raises(UserError, match="unknown protocol"):
        make_spec("fedprox", "tiny", "metis", 5, 0, protocol="best")


def test_a_damaged_tuned_file_is_one_clear_error(tmp_path):
    (tmp_path / "tiny-metis-5.json").write_text("{not json")
    with pytest.raises(UserError, match=r"tiny-metis-5\.json"):
        make_spec("fedavg", "tiny", "metis", 5, 0, protocol="fair", tuned=tmp_path)


@pytest.mark.parametrize("name", sorted(all_methods()))
def test_every_search_space_value_is_a_valid_setting(name):
    method = all_methods()[name]
    for key, space in method.Params.search_space.items():
        ends = space.choices if space.kind == "choice" else (space.low, space.high)
        for value in ends:
            value = int(value) if space.kind == "int" else value
            assert getattr(resolve_params(method, {key: str(value)}), key) == value


def test_record_stores_the_protocol_and_tables_never_mix_protocols(env):
    runner = CliRunner()
    assert runner.invoke(app, ["run", "-m", "fedavg", *TINY, "--seeds", "1"]).exit_code == 0
    (record,) = RunStore(env / "runs.sqlite").records()
    assert record["protocol"] == "paper" and record["config"]["protocol"] == "paper"

    write_tuned(env / "tuned", "tiny", "metis", 5, "fedavg", {"values": {"lr": 0.01}})  # the paper's values
    refused = runner.invoke(app, ["table", "--protocol", "fair", "-d", "tiny", "--rounds", "4", "-f", "csv"])
    assert refused.exit_code == 2
    assert "under protocol fair" in refused.stderr and "runs of protocol paper" in refused.stderr

    assert runner.invoke(app, ["run", "-m", "fedavg", *TINY, "--seeds", "2", "--protocol", "fair"]).exit_code == 0
    frame = RunStore(env / "runs.sqlite").frame()
    assert sorted(frame["protocol"]) == ["fair", "fair", "paper"]
    for protocol, seeds in (("paper", 1), ("fair", 2)):
        shown = runner.invoke(
            app, ["table", "--protocol", protocol, "-d", "tiny", "--rounds", "4", "--seeds", "2", "-f", "csv"]
        )
        assert shown.exit_code == 0, shown.output
        assert f"Protocol: {protocol}" in shown.stdout
        row = next(line for line in shown.stdout.splitlines() if line.startswith("FedAvg [gcn]"))
        assert ("(n=1)" in row) == (seeds == 1)  # each table counts only its own protocol's runs


def test_same_computation_rows_are_marked(env):
    runner = CliRunner()
    assert runner.invoke(app, ["run", "-m", "fedavg,fedprox,fedgnn,local", *TINY, "--seeds", "1"]).exit_code == 0
    table = runner.invoke(app, ["table", "-d", "tiny", "--rounds", "4", "--seeds", "1", "-f", "csv"])
    labels = [line.split(",")[0] for line in table.stdout.splitlines()]
    assert "FedProx [gcn] ≡ FedAvg" in labels and "FedGNN [gcn] ≡ FedAvg" in labels and "Local [gcn]" in labels
    rows = {line.split(",")[0]: line.split(",")[1] for line in table.stdout.splitlines()}
    assert rows["FedProx [gcn] ≡ FedAvg"] == rows["FedAvg [gcn]"] == rows["FedGNN [gcn] ≡ FedAvg"]
    # two local epochs: the proximal term acts, the mark goes
    assert (
        runner.invoke(app, ["run", "-m", "fedavg,fedprox", *TINY, "--seeds", "1", "--local-epochs", "2"]).exit_code == 0
    )
    two = runner.invoke(
        app, ["table", "-d", "tiny", "--rounds", "4", "--local-epochs", "2", "--seeds", "1", "-f", "csv"]
    )
    assert "FedProx [gcn]," in two.stdout and "≡" not in two.stdout


def test_tune_then_run_fair_then_table(env):
    runner = CliRunner()
    tuned = runner.invoke(app, ["tune", "-m", "fedavg,fedprox", *TINY, "--trials", "3", "--no-prune"])
    assert tuned.exit_code == 0, tuned.output
    content = json.loads((env / "tuned" / "tiny-metis-5.json").read_text())
    for name in ("fedavg", "fedprox"):
        entry = content["methods"][name]
        assert entry["trials"]["complete"] == 3 and entry["budget"]["tuning_seeds"] == [1000]
        assert set(entry["values"]) == set(all_methods()[name].Params.search_space)
    assert "trial 3/3 complete" in tuned.stdout  # one plain line per trial off a terminal

    ran = runner.invoke(app, ["run", "-m", "fedavg,fedprox", *TINY, "--seeds", "1", "--protocol", "fair"])
    assert ran.exit_code == 0, ran.output
    record = next(r for r in RunStore(env / "runs.sqlite").records() if r["method"] == "fedprox")
    assert record["config"]["params"]["mu"] == content["methods"]["fedprox"]["values"]["mu"]
    table = runner.invoke(
        app, ["table", "--protocol", "fair", "-d", "tiny", "--rounds", "4", "--seeds", "1", "-f", "csv"]
    )
    assert table.exit_code == 0 and "tuned on validation" in table.stdout
    missing = runner.invoke(app, ["run", "-m", "local", *TINY, "--seeds", "1", "--protocol", "fair"])
    assert missing.exit_code == 2 and "gflbench tune --method local" in missing.stderr


def _trial_states(storage: Path) -> list[str]:
    if not storage.exists():
        return []
    with sqlite3.connect(storage) as db:
        try:
            return [row[0] for row in db.execute("SELECT state FROM trials ORDER BY number")]
        except sqlite3.OperationalError:  # tables not created yet
            return []


def test_tune_resumes_after_kill(tmp_path):
    """SIGKILL while a trial runs: the rerun fails that trial, queues its values again and completes the budget."""
    args = ["tune", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--rounds", "60", "--trials", "4", "--no-prune",
            "--store", str(tmp_path / "runs.sqlite"), "--tuned-dir", str(tmp_path / "tuned"), "--device", "cpu"]  # fmt: skip
    env = {**os.environ, "GFLBENCH_DATA": str(tmp_path / "data")}
    code = "import sys; from gflbench.commands.app import app; sys.argv[0] = 'gflbench'; app()"
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    storage = tmp_path / "tuning.sqlite"
    deadline = time.time() + 240
    while time.time() < deadline:  # kill once a trial has completed and the next one is running
        states = _trial_states(storage)
        if "COMPLETE" in states and states[-1] == "RUNNING":
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    else:
        raise AssertionError("no trial finished in time")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = _trial_states(storage)
    assert before[-1] == "RUNNING" and not (tmp_path / "tuned" / "tiny-metis-5.json").exists()

    resumed = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=root,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = _trial_states(storage)
    assert after[: len(before) - 1] == before[:-1]  # finished trials kept, not recomputed
    assert after[len(before) - 1] == "FAIL" and after.count("COMPLETE") == 4
    entry = json.loads((tmp_path / "tuned" / "tiny-metis-5.json").read_text())["methods"]["fedavg"]
    assert entry["trials"] == {"complete": 4, "pruned": 0, "fail": 1}


@pytest.mark.parametrize("name", sorted(all_methods()))
def test_defaults_lie_inside_the_declared_ranges(name):
    from gflbench.core.method import valid_ranges

    params = all_methods()[name].Params()
    for key, bound in valid_ranges(type(params)).items():
        assert bound.admits(getattr(params, key)), (name, key)


@pytest.mark.parametrize("name", sorted(all_methods()))
def test_fair_searches_every_value_the_paper_protocol_uses(name):
    """`fair` may not be unfair by construction: for every paper dataset, partition and client count, each
    hyperparameter a method's `fair` study searches holds the value its `paper` configuration uses there
    (FedICI's lr 0.15 and width 512 once lay outside the shared ranges, and its `fair` Cora cell fell
    5.7 points below its `paper` one)."""
    from gflbench.data import DATASETS

    space = all_methods()[name].Params.search_space
    outside = set()
    for dataset in (d for d, spec in DATASETS.items() if not spec.synthetic):
        for scheme, counts in (("metis", (5, 10, 20)), ("overlap", (10, 30, 50))):
            for clients in counts:
                params = make_spec(name, dataset, scheme, clients, 0).params
                for key, searched in space.items():
                    value = getattr(params, key, None)
                    if value is None:
                        continue
                    inside = (
                        value in searched.choices
                        if searched.kind == "choice"
                        else searched.low <= value <= searched.high
                    )
                    if not inside:
                        outside.add((key, value, searched.describe()))
    assert not outside, sorted(outside)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("lr=-1", "fedavg.lr=-1.0 is out of range: it must be > 0"),
        ("lr=nan", "fedavg.lr=nan is out of range"),
        ("weight_decay=-0.1", "fedavg.weight_decay=-0.1 is out of range: it must be >= 0"),
        ("dropout=1", "fedavg.dropout=1.0 is out of range: it must be >= 0 and < 1"),
        ("hidden=0", "fedavg.hidden=0 is out of range: it must be >= 1"),
        ("fedprox.mu=-1", "fedprox.mu=-1.0 is out of range"),
    ],
)
def test_bad_values_are_one_line_before_anything_is_stored(env, setting, message):
    result = CliRunner().invoke(app, ["run", "-m", "fedavg,fedprox", *TINY, "--seeds", "1", "--set", setting])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (env / "runs.sqlite").exists()


def test_a_smaller_budget_reads_a_prefix_of_the_study(env):
    """The entry for --trials 2 is what a 2-trial study would have chosen, even after 4 trials ran."""
    runner = CliRunner()
    args = ["tune", "-m", "fedavg", *TINY, "--no-prune"]
    assert runner.invoke(app, [*args, "--trials", "4"]).exit_code == 0
    four = json.loads((env / "tuned" / "tiny-metis-5.json").read_text())["methods"]["fedavg"]
    again = runner.invoke(app, [*args, "--trials", "2"])
    assert again.exit_code == 0 and "trial" not in again.stdout.split("best validation")[0]  # nothing re-run
    two = json.loads((env / "tuned" / "tiny-metis-5.json").read_text())["methods"]["fedavg"]
    assert four["trials"]["complete"] == 4 and two["trials"]["complete"] == 2
    assert two["trial"] in (0, 1) and two["validation"] <= four["validation"]


def _write_many(folder: str, prefix: str) -> None:
    for i in range(40):
        write_tuned(Path(folder), "tiny", "metis", 5, f"{prefix}{i}", {"values": {"lr": 0.01}})


def test_parallel_tunes_of_one_setting_keep_every_entry(tmp_path):
    """Two processes adding entries to one setting's file at once (two `gflbench tune` of different
    methods): every entry of both survives, none is written over by the other's read-modify-write."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_many, args=(str(tmp_path), prefix)) for prefix in ("a", "b")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    methods = json.loads((tmp_path / "tiny-metis-5.json").read_text())["methods"]
    assert sorted(methods) == sorted(f"{p}{i}" for p in "ab" for i in range(40))
    assert not list(tmp_path.glob("*.partial"))


def test_every_params_field_enters_the_key_at_every_value():
    """No field stays out of the key at any value: runs stored before a field existed are re-keyed instead
    (gfl_bench/experiments/upgrades.py). FedIIH's routing kernel at its default is in the configuration, and
    each kernel is its own configuration."""
    gather = make_spec("fediih", "tiny", "metis", 5, 0)
    assert gather.config()["params"] == dataclasses.asdict(gather.params)
    assert gather.config()["params"]["routing_kernel"] == gather.params.routing_kernel
    other = "sparse" if gather.params.routing_kernel == "gather" else "gather"
    assert make_spec("fediih", "tiny", "metis", 5, 0, {"routing_kernel": other}).config_key != gather.config_key


def _tuned_content(dataset: str = "tiny", scheme: str = "metis", clients: int = 5, entry: object = None) -> dict:
    entry = {"values": {"lr": 0.01}} if entry is None else entry
    return {"dataset": dataset, "scheme": scheme, "clients": clients, "methods": {"fedavg": entry}}


@pytest.mark.parametrize(
    "setting", [("cora", "overlap", 30), ("tiny", "overlap", 5), ("tiny", "metis", 10), ("cora", "metis", 5)]
)
def test_a_tuned_file_of_another_setting_is_refused_by_name(env, setting):
    """The issue's probe: the file made for cora overlap-30, read for tiny METIS-5 (renamed or copied)."""
    path = env / "tuned" / "tiny-metis-5.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_tuned_content(*setting)))
    result = CliRunner().invoke(app, ["run", "-m", "fedavg", *TINY, "--seeds", "1", "--protocol", "fair"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert str(path) in lines[0] and f"{setting[0]} {setting[1]}-{setting[2]}" in lines[0]
    assert not (env / "runs.sqlite").exists()


@pytest.mark.parametrize(
    "entry",
    [
        {"trial": 3},  # no values
        {"values": [0.01]},
        {"values": "lr=0.01"},
        "lr=0.01",
        {"values": {"lr": -1}},
        {"values": {"lr": [0.01]}},
        {"values": {"lr": None}},
        {"values": {"hidden": 1.5}},
        {"values": {"no_such_parameter": 1}},
    ],
)
def test_a_malformed_tuned_entry_is_one_line_naming_the_file(env, entry):
    path = env / "tuned" / "tiny-metis-5.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_tuned_content(entry=entry)))
    result = CliRunner().invoke(app, ["run", "-m", "fedavg", *TINY, "--seeds", "1", "--protocol", "fair"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert str(path) in lines[0] and "fedavg" in lines[0]
    assert not (env / "runs.sqlite").exists()


def test_a_fair_record_names_its_tuned_file_and_its_sha256(env):
    import hashlib

    path = write_tuned(env / "tuned", "tiny", "metis", 5, "fedavg", {"values": {"lr": 0.02}})
    runner = CliRunner()
    assert runner.invoke(app, ["run", "-m", "fedavg", *TINY, "--seeds", "1", "--protocol", "fair"]).exit_code == 0
    assert runner.invoke(app, ["run", "-m", "fedavg", *TINY, "--seeds", "1"]).exit_code == 0
    records = {r["protocol"]: r for r in RunStore(env / "runs.sqlite").records()}
    assert records["fair"]["tuned_file"] == str(path)
    assert records["fair"]["tuned_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert records["paper"]["tuned_file"] is None and records["paper"]["tuned_sha256"] is None
