"""gfl_bench/paper/planning.py: what sweep, run and table work out before anything runs, called without a command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gflbench.core.method import all_methods
from gflbench.errors import UserError
from gflbench.experiments.spec import make_spec
from gflbench.paper import planning
from gflbench.paper.sweep import Grid


def test_selected_overrides_add_what_a_selection_rule_switches_on_inside_a_method():
    chosen = planning.selected_overrides(["fedavg.lr=0.1"], ["fedavg", "adafgl"], "per-client")
    assert chosen == {"fedavg": {"lr": "0.1"}, "adafgl": {"keep_best_epoch": "true"}}
    assert planning.selected_overrides([], ["fedavg", "adafgl"], "global") == {"fedavg": {}, "adafgl": {}}


def test_table_specs_restrict_a_paper_table_and_name_what_the_package_lacks():
    specs, skipped = planning.table_specs("1", list(all_methods()), ["fedavg"], ["cora"], 2, [], "global")
    cells = sorted({(s.method, s.dataset, s.scheme, s.clients) for s in specs})
    assert cells == [("fedavg", "cora", "metis", c) for c in (5, 10, 20)] and len(specs) == 6 and skipped == ()
    ablations, lacking = planning.table_specs("6", ["fedgmc"], None, ["cora"], 1, [], "global")
    assert {s.method for s in ablations} == {"fedgmc"} and "fedgmc-wo-semantic" in lacking
    assert planning.table_specs("sensitivity", list(all_methods()), ["fedavg"], None, 1, [], "global") == ([], ())


def test_bad_plans_are_refused_before_any_work():
    with pytest.raises(UserError, match="--seeds must be at least 1"):
        planning.grid_run_specs(Grid(("fedavg",), ("cora",), (("metis", 10),)), 0, [], "global")
    with pytest.raises(UserError, match="unknown dataset 'nosuch'"):
        planning.restricted_grid(Grid(("fedavg",), ("cora",), (("metis", 10),)), None, ["nosuch"])
    spec = make_spec("fedavg", "cora", "metis", 10, 0, rounds=5)
    with pytest.raises(UserError, match=r"--snapshot-rounds 5,9: fedavg on cora runs rounds 0\.\.4"):
        planning.check_snapshot_rounds(frozenset({1, 5, 9}), [spec])
    planning.check_snapshot_rounds(frozenset({0, 4}), [spec])
    assert planning.planned_device("cuda:1") == "cuda" and planning.planned_device("auto") is None


def test_nearest_configurations_name_what_differs_fewest_first_with_the_command_that_shows_it():
    wanted = make_spec("fedavg", "cora", "metis", 10, 0)
    one = make_spec("fedavg", "cora", "metis", 10, 0, {"lr": "0.1"})
    two = make_spec("fedavg", "cora", "metis", 10, 0, {"lr": "0.1", "dropout": "0.2"}, rounds=7)
    records = [{"method": s.method, "dataset": "cora", "scheme": "metis", "clients": 10, "config": s.config()}
               for s in (two, one)]  # fmt: skip
    text = planning.nearest_configurations(records, lambda *cell: wanted, Path("s.sqlite"), "1")
    first, second = text.split("; ")
    assert first == "fedavg cora metis-10 with lr=0.1: `gflbench table 1 -d cora --store s.sqlite --set fedavg.lr=0.1`"
    assert second == (
        "fedavg cora metis-10 with lr=0.1, dropout=0.2, rounds=7: `gflbench table 1 -d cora --store "
        "s.sqlite --rounds 7 --set fedavg.lr=0.1 --set fedavg.dropout=0.2`"
    )
    assert planning.nearest_configurations([], lambda *cell: wanted, Path("s.sqlite"), None) == "none"
