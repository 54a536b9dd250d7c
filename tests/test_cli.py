"""The command line: bad input is one line on stderr with exit code 2 and stores nothing; a tiny grid works."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.experiments.store import RunStore

BAD_INPUTS = [
    (["run", "-m", "nope", "-d", "tiny"], "unknown method 'nope'"),
    (["run", "-m", "fedavg", "-d", "nope"], "unknown dataset 'nope'"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "overlap", "--clients", "7"], "multiple"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "spectral"], "unknown partition scheme"),
    (["run", "-m", "fedavg", "-d", "tiny", "--clients", "five"], "integers"),
    (["run", "-m", "fedavg", "-d", "tiny", "--seeds", "0"], "--seeds"),
    (["run", "-m", "fedavg", "-d", "tiny", "--stack-seeds", "0"], "--stack-seeds"),
    (["sweep", "-m", "fedavg", "-d", "tiny", "--stack-seeds", "-1"], "--stack-seeds"),
    (["run", "-m", "fedavg", "-d", "tiny", "--set", "fedavg.nope=1"], "no parameter 'nope'"),
    (["run", "-m", "fedavg", "-d", "tiny", "--set", "fedavg.lr=fast"], "expects float"),
    (["run", "-m", "fedavg", "-d", "tiny", "--set", "fedavg.backbone=mlp"], "unknown backbone"),
    (["run", "-m", "fedavg", "-d", "tiny", "--set", "fedavg.weighting=size"], "weighting"),
    (["run", "-m", "fedavg", "-d", "tiny", "--device", "tpu"], "device"),
    (["run", "-m", "fedavg", "-d", "amazon-photo"], "GFLBENCH_RAW_MIRROR"),
    (["run", "-m", "fedavg", "-d", "tiny", "--rounds", "2", "--snapshot-rounds", "1,5"], "--snapshot-rounds 5"),
    (["table", "8"], "no table '8'"),
    (["table", "--format", "pdf"], "unknown format"),
    (["partitions", "-d", "tiny", "--scheme", "overlap", "--clients", "3"], "multiple"),
]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GFLBENCH_RAW_MIRROR", str(tmp_path / "empty-mirror"))
    monkeypatch.setenv("GFLBENCH_RESULTS", str(tmp_path / "runs.sqlite"))
    monkeypatch.setattr("torch_geometric.data.dataset.download_url", _no_network, raising=False)
    monkeypatch.setattr("torch_geometric.datasets.amazon.download_url", _no_network)
    return tmp_path


def _no_network(*args, **kwargs):
    from urllib.error import URLError

    raise URLError("no network in tests")


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(env, args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output
    if args[0] == "run":
        assert not (env / "runs.sqlite").exists() or len(RunStore(env / "runs.sqlite")) == 0


def test_tiny_grid_runs_skips_and_tabulates(env):
    runner = CliRunner()
    args = ["run", "-m", "local,fedavg", "-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", "5"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "4 runs asked, 0 already stored, 4 to run" in first.output
    second = runner.invoke(app, args)
    assert "4 runs asked, 4 already stored, 0 to run" in second.output
    assert len(RunStore(env / "runs.sqlite")) == 4

    table = runner.invoke(app, ["table", "-d", "tiny", "--rounds", "5", "--seeds", "2", "-f", "csv"])
    assert table.exit_code == 0, table.output
    rows = {line.split(",")[0]: line for line in table.stdout.splitlines()}
    assert rows["Local [gcn]"].split(",")[1].count("±") == 1 and "(n=" not in rows["Local [gcn]"]
    assert rows["FedAvg [gcn]"].split(",")[2] == ""  # 10 clients: no runs, empty cell
    assert "Protocol: paper" in table.stdout.splitlines()[0]
    # other hyperparameters select other runs: none stored for these
    other = runner.invoke(app, ["table", "-d", "tiny", "--rounds", "6", "-f", "csv"])
    assert "±" not in other.stdout


def test_stacked_seeds_are_stored_one_record_each(env):
    args = [
        "run",
        "-m",
        "fedavg",
        "-d",
        "tiny",
        "--clients",
        "5",
        "--seeds",
        "3",
        "--rounds",
        "2",
        "--stack-seeds",
        "2",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = RunStore(env / "runs.sqlite").frame()
    assert sorted(records["seed"]) == [0, 1, 2] and set(records["status"]) == {"ok"}
    with RunStore(env / "runs.sqlite") as store:
        stacked = sorted(r["stacked_runs"] for r in store.records(records["run_key"]))
    assert stacked == [1, 2, 2]  # seeds 0 and 1 together, seed 2 alone


def test_exported_runs_import_into_another_store_whole_and_once(env):
    """export → import gives the same records; a second import adds nothing; two exports of the same
    runs are the same bytes; a file with one bad line stores none of its runs."""
    runner = CliRunner()
    args = ["run", "-m", "local,fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "3"]
    assert runner.invoke(app, args).exit_code == 0
    exported = env / "runs.jsonl.gz"
    first = runner.invoke(app, ["export", str(exported), "-m", "fedavg"])
    assert first.exit_code == 0, first.output
    assert "exported 1 runs" in first.output
    runner.invoke(app, ["export", str(env / "again.jsonl.gz"), "-m", "fedavg"])
    assert exported.read_bytes() == (env / "again.jsonl.gz").read_bytes()

    other = env / "other.sqlite"
    imported = runner.invoke(app, ["import", str(exported), "--store", str(other)])
    assert imported.exit_code == 0, imported.output
    assert "imported 1 new runs" in imported.output
    with RunStore(env / "runs.sqlite") as source, RunStore(other) as target:
        original = [r for r in source.records() if r["method"] == "fedavg"]
        assert target.records() == original
    again = runner.invoke(app, ["import", str(exported), "--store", str(other)])
    assert "imported 0 new runs" in again.output and "1 were already stored" in again.output

    plain = env / "all.jsonl"
    assert runner.invoke(app, ["export", str(plain)]).exit_code == 0
    lines = plain.read_text().splitlines()
    assert len(lines) == 2
    broken = env / "broken.jsonl"
    broken.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2] + "\n")
    fresh = env / "fresh.sqlite"
    failed = runner.invoke(app, ["import", str(broken), "--store", str(fresh)])
    assert failed.exit_code == 2 and "line 2: not JSON" in failed.output
    assert len(RunStore(fresh)) == 0  # checked before anything was stored
    nothing = runner.invoke(app, ["export", str(env / "none.jsonl"), "-m", "fedgmc"])
    assert nothing.exit_code == 2 and "no stored runs" in nothing.output
    assert not (env / "none.jsonl").exists()


def test_partitions_and_methods_and_datasets_print(env):
    runner = CliRunner()
    parts = runner.invoke(app, ["partitions", "-d", "tiny", "--scheme", "overlap", "--clients", "10"])
    assert parts.exit_code == 0 and "hash" in parts.output
    listing = runner.invoke(app, ["methods"])
    assert listing.exit_code == 0 and "fedper" in listing.output and "h2gcn-tanh" in listing.output
    table3 = runner.invoke(app, ["datasets"], terminal_width=200)
    assert table3.exit_code == 0 and "absent" in table3.output and "Roman-empire" in table3.output


def test_snapshots_of_a_stored_run_are_made_by_running_it_again(env, tmp_path):
    runner = CliRunner()
    args = ["run", "-m", "fedgmc", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "3"]
    assert runner.invoke(app, args).exit_code == 0
    store = RunStore(env / "runs.sqlite")
    (key,) = store.statuses()
    record = store.record(key)
    snaps = tmp_path / "snaps"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = snaps / key / f"round2.pt.{dead.pid}.partial"  # a writer killed before its rename
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half a snapshot")
    again = runner.invoke(app, [*args, "--snapshot-rounds", "0,2", "--snapshot-dir", str(snaps)])
    assert "1 to run (1 of them stored, run again for their snapshots)" in " ".join(again.output.split())
    assert (snaps / key / "round0.pt").exists() and (snaps / key / "round2.pt").exists()
    assert not stale.exists() and not list((snaps / key).glob("*.partial"))
    rerun = store.record(key)
    assert len(store) == 1 and (rerun["curves"], rerun["test"]) == (record["curves"], record["test"])  # deterministic
    third = runner.invoke(app, [*args, "--snapshot-rounds", "0,2", "--snapshot-dir", str(snaps)])
    assert "0 to run" in third.output


def test_piped_output_is_one_plain_line_per_run_and_a_dry_run_writes_nothing(env):
    runner = CliRunner()
    result = runner.invoke(
        app, ["run", "-m", "local,fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "3"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "/2 " in line]
    assert len(lines) == 2 and lines[0].startswith("1/2 local tiny metis-5 seed 0 test ") and " ETA " in lines[0]
    dry = runner.invoke(app, ["sweep", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "2", "--dry-run",
                              "--store", str(env / "other.sqlite")])  # fmt: skip
    assert dry.exit_code == 0 and "2 runs in the grid, 2 missing" in dry.stdout
    assert not (env / "other.sqlite").exists()


def test_a_table_that_matches_nothing_names_the_nearest_stored_configuration(env):
    runner = CliRunner()
    assert (
        runner.invoke(
            app, ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "5"]
        ).exit_code
        == 0
    )
    result = runner.invoke(app, ["table", "-d", "tiny"])
    assert result.exit_code == 2
    assert "fedavg tiny metis-5 with rounds=5" in result.stderr and "--rounds 5`" in result.stderr
    hinted = result.stderr.split("`")[1].split()[1:]  # the exact command it names shows the runs
    shown = runner.invoke(app, [*hinted, "--seeds", "1", "-f", "csv"])
    assert shown.exit_code == 0 and "±" in shown.stdout


def test_methods_through_a_pipe_cuts_nothing(env):
    listing = CliRunner().invoke(app, ["methods"])
    assert (
        "…" not in listing.stdout and "fedgmc-wo-structural" in listing.stdout and "weighting=uniform" in listing.stdout
    )


def test_per_client_selection_runs_and_tabulates_the_methods_own_selection(env):
    """`run --selection per-client` runs AdaFGL with its best-epoch switch on, and only `table --selection
    per-client` (which reads each client's own best round) finds that run; the default rule meets the default run."""
    runner = CliRunner()
    common = ["-m", "adafgl", "-d", "tiny", "--rounds", "3", "--set", "adafgl.stage2_epochs=5"]
    assert (
        runner.invoke(app, ["run", *common, "--clients", "5", "--seeds", "1", "--selection", "per-client"]).exit_code
        == 0
    )
    with RunStore(env / "runs.sqlite") as store:
        (switched,) = store.records()
    assert switched["config"]["params"]["keep_best_epoch"] is True  # on, and in the key as every field is

    def shown(rule: str):
        result = runner.invoke(app, ["table", *common, "--seeds", "1", "--selection", rule, "-f", "csv"])
        return result, {line.split(",")[0]: line.split(",")[1] for line in result.stdout.splitlines()[1:]}

    per_client, rows = shown("per-client")
    assert per_client.exit_code == 0, per_client.output
    assert rows["AdaFGL [gcn]"].startswith(f"{switched['test_client_best'] * 100:.2f}±")
    assert shown("global")[0].exit_code == 2  # the switched run is not the default configuration

    assert runner.invoke(app, ["run", *common, "--clients", "5", "--seeds", "1"]).exit_code == 0
    with RunStore(env / "runs.sqlite") as store:
        (latest,) = [r for r in store.records() if r["run_key"] != switched["run_key"]]
    assert latest["config"]["params"]["keep_best_epoch"] is False
    assert shown("global")[1]["AdaFGL [gcn]"].startswith(f"{latest['test'] * 100:.2f}±")


@pytest.mark.parametrize("command", [
    ["run", "-m", "adafgl", "-d", "tiny", "--clients", "5", "--rounds", "2"],
    ["sweep", "-m", "adafgl", "-d", "tiny", "--clients", "5", "--rounds", "2"],
    ["table", "-d", "tiny"],
    ["compare"],
])  # fmt: skip
def test_an_unknown_selection_rule_is_one_line_exit_2_and_stores_nothing(env, command):
    result = CliRunner().invoke(app, [*command, "--selection", "best"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: unknown selection rule 'best'; choose from global, per-client"]
    assert not (env / "runs.sqlite").exists()


@pytest.mark.parametrize(("args", "named"), [
    (["run", "-m", "fedavg", "-d", "tiny", "--seeds", "ten"], "'--seeds'"),
    (["table", "--clients", "5"], "--clients"),
    (["run", "-d", "tiny"], "'--method'"),
    (["table", "1", "--seeds"], "'--seeds'"),
    (["plot", "ranks", "1", "--alpha", "x"], "'--alpha'"),
    (["nope"], "'nope'"),
])  # fmt: skip
def test_a_command_line_that_does_not_parse_is_one_line_and_exit_2(env, args, named):
    """click's parse errors (a value of the wrong type, an unknown option or command, a missing one), once a
    five-line box, are one line naming the option, as every other bad input."""
    result = CliRunner().invoke(app, args, prog_name="gflbench")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], result.stderr
    assert "╭" not in result.output and "Usage:" not in result.output
    if args[0] != "nope" and "--seeds" not in args[-1:]:
        assert (
            f"see `gflbench {' '.join(a for a in args[:2] if a in ('run', 'table', 'plot', 'ranks'))} --help`"
            in lines[0]
        )


def test_no_arguments_still_shows_the_help(env):
    result = CliRunner().invoke(app, [], prog_name="gflbench")
    assert "Usage: gflbench" in result.output and "run" in result.output and "error:" not in result.output


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999"])
def test_a_non_finite_hyperparameter_is_refused_as_not_a_finite_number(env, value):
    """inf and nan once met a range by accident (`lr=inf` "must be > 0"); the line says a finite number is wanted."""
    result = CliRunner().invoke(app, ["run", "-m", "fedavg", "-d", "tiny", "--set", f"lr={value}"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert (
        len(lines) == 1 and "fedavg.lr=" in lines[0] and "is out of range: it must be a finite number > 0" in lines[0]
    )
    assert not (env / "runs.sqlite").exists()


def test_methods_in_a_narrow_terminal_wraps_instead_of_cutting(env, monkeypatch):
    """On an 80-column terminal rich would cut the resolved values to `…`; `_show` folds them instead."""
    import os

    from rich.console import Console

    from gflbench.commands import common

    terminal = Console(width=80, force_terminal=True, record=True, file=open(os.devnull, "w"))
    monkeypatch.setattr(common, "console", terminal)
    result = CliRunner().invoke(app, ["methods"])
    assert result.exit_code == 0, result.output
    text = terminal.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    names = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))
    assert "fedgmc-wo-structural" in names  # the first column, read down: every name whole, if wrapped


def test_methods_lists_fidelity_and_execution_switches_apart_from_the_hyperparameters(env):
    """gfl_bench/core/switches.py: FedICI's readings (paper preset: the released code's), FedIIH's ELBO reading and
    routing kernel are in their own column, not among the resolved values; FedAvg declares none."""
    result = CliRunner().invoke(app, ["methods"])
    assert result.exit_code == 0, result.output
    rows = {cells[0]: cells for line in result.output.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}  # fmt: skip
    assert rows["fedici"][2] == "unifilter-code" and rows["fedici"][6] == "fidelity: graph_rule=code"
    assert rows["fediih"][6] == "fidelity: elbo_trains_encoder=True; execution: routing_kernel=gather"
    assert rows["fedavg"][6] == "" and "weighting=uniform" in rows["fedavg"][5]
    assert not [word for word in rows["fedici"][5].split() + rows["fediih"][5].split()
                if word.split("=")[0] in ("graph_rule", "elbo_trains_encoder", "routing_kernel", "backbone")]  # fmt: skip
