"""`gflbench compare`: gaps, flags, per-method summary and the ranking verdict."""

from __future__ import annotations

import pandas as pd
import pytest

from gflbench.experiments.spec import make_spec
from gflbench.paper.compare import compare
from gflbench.paper.tables import Selection


def _runs(values: dict[tuple[str, str, int], list[float]]) -> pd.DataFrame:
    rows = []
    for (method, dataset, clients), tests in values.items():
        for seed, test in enumerate(tests):
            spec = make_spec(method, dataset, "metis", clients, seed)
            rows.append({"run_key": spec.run_key, "config_key": spec.config_key, "method": method,
                         "dataset": dataset, "scheme": "metis", "clients": clients, "seed": seed,
                         "status": "ok", "test": test, "seconds_per_round": 0.5})  # fmt: skip
    return pd.DataFrame(rows)


def test_gaps_flags_and_summary():
    runs = _runs({
        ("fedavg", "cora", 10): [0.6969, 0.6969],   # paper 69.19±0.67: +0.50, within 1 point, not flagged
        ("local", "cora", 10): [0.8294, 0.8294],    # paper 79.94±0.24: +3.00, flagged
        ("local", "cora", 5): [0.8130, 0.8130],     # paper 81.30: exact
    })  # fmt: skip
    result = compare(Selection(runs, {}, expected_seeds=2), ["fedavg", "local"], tables=(1, 7))
    cells = result.cells.set_index(["method", "table", "clients"])
    assert cells.loc[("fedavg", 1, 10), "gap"] == pytest.approx(0.50)
    assert not cells.loc[("fedavg", 1, 10), "flag"]
    assert cells.loc[("local", 1, 10), "gap"] == pytest.approx(3.00)
    assert cells.loc[("local", 1, 10), "flag"]
    assert cells.loc[("fedavg", 7, 10), "ratio"] == pytest.approx(0.5 / 2.19)
    assert not cells.loc[("fedavg", 7, 10), "flag"]  # times are never flagged
    summary = result.summary.set_index("method")
    assert summary.loc["local", "cells"] == 2 and summary.loc["local", "within 1 point"] == 1
    assert summary.loc["local", "mean abs gap"] == pytest.approx(1.5)
    # only Cora-10 is common to both methods; FedGMC was not run, so the verdict is undecidable
    assert result.ranking["common cells"].iloc[0] == 1 and result.fedgmc_first is None


def test_cells_without_runs_or_paper_values_are_skipped():
    runs = _runs({("fedavg", "tiny", 5): [0.9]})
    assert compare(Selection(runs, {}), ["fedavg"]).cells.empty
