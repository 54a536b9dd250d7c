"""`gflbench table --evaluate personalised|global` (issue 32 item 4; docs/protocol.md, "Evaluation modes"):
a cell reads the personalised reading (each client's model after local training) or the global one (the global
or cluster model before it), the caption names which, and a method without a global model says so."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.errors import UserError
from gflbench.experiments.store import RunStore
from gflbench.paper.tables import NO_GLOBAL_MODEL, Selection

ROUNDS = "3"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> object:
    """Two seeds of FedAvg (a global model) and FedPer (none) on tiny, 5 clients."""
    root = tmp_path_factory.mktemp("evaluate")
    path = root / "runs.sqlite"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GFLBENCH_DATA", str(root / "data"))
        args = ["run", "-m", "fedavg,fedper", "-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", ROUNDS,
                "--store", str(path)]  # fmt: skip
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return path


def table(store: object, *extra: str) -> str:
    args = ["table", "-d", "tiny", "--rounds", ROUNDS, "--seeds", "2", "-f", "csv", "--store", str(store), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout


def cell_of(csv: str, title: str) -> str:
    row = next(line for line in csv.splitlines() if line.startswith(title))
    return row.split(",")[1]


def test_global_cells_read_the_global_reading_and_say_so(store):
    records = RunStore(store).records()
    fedavg = [r for r in records if r["method"] == "fedavg"]
    global_mean = 100 * sum(r["global_test"] for r in fedavg) / len(fedavg)
    personal_mean = 100 * sum(r["test"] for r in fedavg) / len(fedavg)
    assert f"{global_mean:.2f}" != f"{personal_mean:.2f}"  # the two readings differ here, so the check can fail
    shown = table(store, "--evaluate", "global")
    assert cell_of(shown, "FedAvg").startswith(f"{global_mean:.2f}±")
    assert cell_of(shown, "FedPer") == NO_GLOBAL_MODEL
    assert "Evaluation: global" in shown.splitlines()[0]
    default = table(store)
    assert cell_of(default, "FedAvg").startswith(f"{personal_mean:.2f}±")
    assert cell_of(default, "FedPer")[0].isdigit()
    assert "Evaluation: personalised" in default.splitlines()[0]


def test_a_record_older_than_the_reading_leaves_the_cell_empty(store):
    """A record written before records carried the global reading is not a method without a global model."""
    with RunStore(store) as runs:
        frame = runs.frame()
    older = frame.assign(global_recorded=False, global_test=math.nan, global_val=math.nan)
    sel = Selection(older, {}, rounds=int(ROUNDS), expected_seeds=2, evaluate="global")
    assert sel.cell("fedper", "tiny", "metis", 5) is None and sel.cell("fedavg", "tiny", "metis", 5) is None
    recorded = Selection(frame, {}, rounds=int(ROUNDS), expected_seeds=2, evaluate="global")
    no_model = recorded.cell("fedper", "tiny", "metis", 5)
    assert no_model is not None and recorded.format(no_model) == NO_GLOBAL_MODEL


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--evaluate", "local"], "unknown evaluation mode 'local'; choose from personalised, global"),
        (["--evaluate", "global", "--selection", "per-client"], "use it with --selection global"),
    ],
)
def test_bad_evaluation_is_one_line_exit_2(store, extra, message):
    result = CliRunner().invoke(app, ["table", "-d", "tiny", "--store", str(store), *extra])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_selection_refuses_an_unknown_mode(store):
    with RunStore(store) as runs, pytest.raises(UserError, match="unknown evaluation mode"):
        Selection(runs.frame(), {}, evaluate="server")
