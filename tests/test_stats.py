"""Significance marks and rank statistics (gfl_bench/paper/significance.py) against hand-computed numbers."""

from __future__ import annotations

import csv
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.errors import UserError
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore
from gflbench.paper import significance, tables
from gflbench.paper.significance import PairedTest, cell_means, compare_to_best, holm, rank_analysis


def test_paired_t_equals_the_hand_computed_value():
    best = np.array([81.0, 80.5, 82.0, 81.5, 80.0])
    other = np.array([80.0, 80.0, 81.0, 81.0, 79.5])
    # differences 1.0 0.5 1.0 0.5 0.5: mean 0.7, squared deviations .09 .04 .09 .04 .04 = 0.30,
    # variance 0.30 / 4 = 0.075, t = 0.7 / sqrt(0.075 / 5) = 5.71548 with 4 degrees of freedom.
    t = 0.7 / math.sqrt(0.075 / 5)
    assert t == pytest.approx(5.71548, abs=1e-5)
    # Student's t CDF with 4 df in closed form: 1/2 + 3/8 * u * (1 - u^2 / 12), u = t / sqrt(1 + t^2 / 4)...
    u = t / math.sqrt(1 + t * t / 4)
    two_sided = 2 * (1 - (0.5 + 3 / 8 * u * (1 - u * u / 12)))
    assert two_sided == pytest.approx(0.004636, abs=1e-6)  # ...which gives 0.0046
    assert PairedTest("t").pvalue(best, other) == pytest.approx(two_sided, rel=1e-9)
    assert PairedTest("t").pvalue(best, best) == 1.0  # the same numbers: nothing to tell apart
    # float noise is no signal: equal up to 1e-12 points is a tie, one shift on every seed is certain
    assert PairedTest("t").pvalue(best, best + np.array([1e-12, -1e-12, 0, 2e-12, 0])) == 1.0
    assert PairedTest("wilcoxon").pvalue(best, best + np.array([1e-12, -1e-12, 0, 2e-12, 0])) == 1.0
    shifted = np.array([0.1, 0.2, 0.3, 0.7, 1.1])
    assert len(set(shifted + 0.2 - shifted)) > 1  # in floats the differences are not all equal...
    assert PairedTest("t").pvalue(shifted + 0.2, shifted) == 0.0  # ...but they are one shift


def test_wilcoxon_cannot_reject_below_six_pairs_at_five_percent():
    # every difference positive: the exact two-sided p is 2 / 2^n
    for n, expected in ((5, 0.0625), (6, 0.03125)):
        assert PairedTest("wilcoxon").pvalue(np.arange(n) + 1.0, np.zeros(n)) == pytest.approx(expected)
    assert PairedTest("wilcoxon", 0.05).min_seeds == 6 and PairedTest("wilcoxon", 0.01).min_seeds == 8
    assert PairedTest("t").min_seeds == 3


def test_holm_steps_down_over_the_sorted_p_values_and_stays_monotone():
    # sorted: 0.005 * 4 = 0.02, 0.01 * 3 = 0.03, 0.03 * 2 = 0.06, 0.04 * 1 = 0.04 -> raised to 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # 0.5 * 2 = 1.0; capped at 1
    assert len(holm([])) == 0


def _seeds(*values: float, seeds=None) -> pd.Series:
    return pd.Series(values, index=seeds if seeds is not None else range(len(values)))


def test_compare_to_best_marks_each_method_against_the_best_mean():
    samples = {
        "a": _seeds(80.0, 81.0, 82.0),
        "close": _seeds(79.0, 81.5, 81.0),  # differences 1.0 -0.5 1.0: not significant
        "far": _seeds(70.0, 71.1, 71.9),  # differences 10.0 9.9 10.1: significant
        "short": _seeds(90.0, 91.0),  # the highest mean, from two seeds: not testable, and not the best
        "other_seeds": _seeds(80.0, 80.0, 80.0, seeds=[0, 5, 6]),  # one seed in common with the best
        "none": _seeds(),
    }  # fmt: skip
    marks = compare_to_best(samples, PairedTest("t"))
    assert set(marks) == {"a", "close", "far", "short", "other_seeds"}
    assert marks["a"].verdict == "best" and marks["a"].n == 3
    assert marks["short"].verdict == "few" and marks["other_seeds"] == significance.Mark(
        "few", marks["other_seeds"].p, 1
    )
    raw = [PairedTest("t").pvalue(samples["a"].to_numpy(), samples[m].to_numpy()) for m in ("close", "far")]
    assert [marks["close"].p, marks["far"].p] == pytest.approx(list(holm(raw)))  # the family: the two tested
    assert marks["close"].verdict == "ns" and marks["far"].verdict == "worse" and marks["far"].p < 0.05
    assert marks["close"].top and not marks["far"].top
    # no method with three seeds: nothing is tested, every entry says so
    assert {m.verdict for m in compare_to_best({"x": _seeds(1.0), "y": _seeds(2.0, 3.0)}, PairedTest()).values()} == {
        "few"
    }


def test_friedman_and_critical_difference_on_a_hand_ranked_matrix():
    # ranks per cell (1 = highest): A 1 1 1 2, B 2 3 2 1, C 3 2 3 3; rank sums 5, 8, 11 over N = 4 cells, k = 3
    means = pd.DataFrame({"A": [90, 80, 70, 60], "B": [85, 70, 65, 61], "C": [80, 75, 60, 50]}, dtype=float)
    result = rank_analysis(means, 0.05)
    assert list(result.ranks) == [1.25, 2.0, 2.75]
    # chi2 = 12 / (N k (k + 1)) * sum R^2 - 3 N (k + 1) = 12 / 48 * (25 + 64 + 121) - 48 = 4.5; 2 df: p = exp(-4.5 / 2)
    assert result.statistic == pytest.approx(4.5) and result.pvalue == pytest.approx(math.exp(-2.25))
    assert not result.rejects
    # Nemenyi: q_0.05 = 2.343 for k = 3 (Demšar 2006, Table 5a); CD = 2.343 * sqrt(3 * 4 / (6 * 4))
    assert result.cd == pytest.approx(2.343 * math.sqrt(0.5), abs=1e-3)
    assert result.nemenyi.loc["A", "A"] == 1.0 and result.nemenyi.loc["A", "C"] < result.nemenyi.loc["A", "B"]
    with pytest.raises(UserError, match="at least 3 methods"):
        rank_analysis(means[["A", "B"]], 0.05)


def test_bad_test_settings_are_user_errors():
    for name, alpha in (("t", 2.0), ("t", 0.0), ("z", 0.05)):
        with pytest.raises(UserError):
            PairedTest(name, alpha)


# A small store: Cora METIS-10 with three seeds (one method clearly worse, one within noise of the
# best), Cora METIS-5 with one seed each, CiteSeer METIS-10 with three seeds.
VALUES = {
    ("cora", 10): {"fedper": (0.800, 0.810, 0.820), "fedprox": (0.790, 0.815, 0.810), "local": (0.700, 0.711, 0.719)},
    ("cora", 5): {"fedper": (0.80,), "fedprox": (0.79,), "local": (0.70,)},
    ("citeseer", 10): {"fedper": (0.70, 0.71, 0.72), "fedprox": (0.72, 0.73, 0.70), "local": (0.60, 0.61, 0.63)},
}  # fmt: skip


def _put(runs: RunStore, method: str, dataset: str, clients: int, seed: int, test: float) -> None:
    spec = make_spec(method, dataset, "metis", clients, seed)
    runs.put({"run_key": spec.run_key, "config_key": spec.config_key, "method": method, "dataset": dataset,
              "scheme": "metis", "clients": clients, "data_seed": spec.data_seed, "seed": seed, "metric": "accuracy",
              "status": "ok", "finished_at": 0.0, "seconds_per_round": [0.1], "best_round": 1, "val": test,
              "test": test, "val_client_best": test, "test_client_best": test})  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "runs.sqlite"
    with RunStore(path) as runs:
        for (dataset, clients), methods in VALUES.items():
            for method, tests in methods.items():
                for seed, test in enumerate(tests):
                    _put(runs, method, dataset, clients, seed, test)
    return path


def _table(store, fmt: str, *extra: str):
    result = CliRunner().invoke(
        app, ["table", "1", "-d", "cora", "-f", fmt, "--store", str(store), "--seeds", "3", *extra]
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def _expected_p() -> dict[str, float]:
    """Holm over the two paired t-tests of Cora METIS-10 against FedPer, from the raw numbers."""
    best = np.array(VALUES[("cora", 10)]["fedper"]) * 100
    raw = [PairedTest().pvalue(best, np.array(VALUES[("cora", 10)][m]) * 100) for m in ("fedprox", "local")]
    return dict(zip(("fedprox", "local"), holm(raw)))


def test_csv_carries_verdicts_and_adjusted_p_values(store):
    rows = {
        row[0].split(" [")[0]: row
        for row in csv.reader(_table(store, "csv").splitlines())
        if not row[0].startswith("#")
    }
    header = rows["Methods"]
    top, p = header.index("Cora 10 Clients top"), header.index("Cora 10 Clients p")
    expected = _expected_p()
    assert expected["fedprox"] > 0.05 > expected["local"]  # the fixture has one of each
    assert (rows["FedPer"][top], rows["FedPer"][p]) == ("best", "")
    assert rows["FedProx"][top] == "ns" and float(rows["FedProx"][p]) == pytest.approx(expected["fedprox"], rel=1e-3)
    assert rows["Local"][top] == "worse" and float(rows["Local"][p]) == pytest.approx(expected["local"], rel=1e-3)
    five = header.index("Cora 5 Clients top")  # one seed each: rendered, marked n<3, not tested
    assert {rows[m][five] for m in ("FedPer", "FedProx", "Local")} == {"n<3"}
    assert rows["Local"][header.index("Cora 5 Clients")] == "70.00±0.00 (n=1) · n<3"
    caption = _table(store, "csv").splitlines()[0]
    assert "paired t-test" in caption and "Holm-adjusted" in caption and "'Cora 10 Clients p'" not in caption


def test_markdown_latex_and_terminal_mark_the_same_entries(store):
    markdown = _table(store, "markdown")
    assert "**81.00±0.82**" in markdown and "**80.50±1.08**" in markdown  # FedPer (best), FedProx (ns)
    assert "| 71.00±0.78 " in markdown  # Local: worse, not bold
    assert "Bold: the best mean" in markdown and "α = 0.05" in markdown and "Holm-adjusted" in markdown
    assert "paired by seed" in markdown
    latex = _table(store, "latex")
    assert r"\textbf{81.00$\pm$0.82}" in latex and r"\textbf{80.50$\pm$1.08}" in latex
    assert r"\textbf{71.00" not in latex and r"(n=1) · n$<$3" in latex
    terminal = _table(store, "terminal")  # off a terminal: the dagger carries the mark
    assert "81.00±0.82 †" in terminal and "80.50±1.08 †" in terminal and "71.00±0.78 †" not in terminal
    # on a terminal the same entries are bold
    from rich.console import Console

    frame = RunStore(store).frame()
    sel = tables.Selection(frame, {}, expected_seeds=3)
    blocks = tables.results_table(
        0,
        sel,
        ["local", "fedprox", "fedper"],
        {"local": "Local", "fedprox": "FedProx", "fedper": "FedPer"},
        ["cora"],
        "metis",
    )
    console = Console(record=True, force_terminal=True, width=300, file=open("/dev/null", "w"))
    console.print(tables.render(blocks, "caption", "terminal"))
    styled = console.export_text(styles=True)
    assert "\x1b[1m80.50±1.08 †" in styled and "\x1b[1m71.00" not in styled


def test_alpha_changes_the_marks(store):
    rows = {row[0].split(" [")[0]: row for row in csv.reader(_table(store, "csv", "--alpha", "0.9").splitlines())
            if not row[0].startswith("#")}  # fmt: skip
    top = rows["Methods"].index("Cora 10 Clients top")
    assert rows["FedProx"][top] == "worse"  # its adjusted p is below 0.9
    assert "α = 0.9" in _table(store, "markdown", "--alpha", "0.9")


@pytest.mark.parametrize("args", [
    ["table", "1", "--alpha", "2"],
    ["table", "1", "--test", "z"],
    ["plot", "ranks"],  # no table, no datasets: nothing to rank over
    ["plot", "ranks", "1", "--alpha", "0"],
    ["plot", "ranks", "1", "-d", "cora", "--partition", "metis"],  # Cora-5 has one seed per method; one cell left
    ["plot", "ranks", "1", "-m", "fedper,fedprox"],  # two methods: no Friedman test
    ["plot", "ranks", "3"],  # not a results table
])  # fmt: skip
def test_statistics_refusals_are_one_line_and_write_nothing(store, tmp_path, args):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*args, "--store", str(store), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert not list(tmp_path.iterdir())


def test_rank_figure_covers_the_cells_where_every_method_has_seeds(store, tmp_path):
    out = tmp_path / "figures" / "ranks"
    result = CliRunner().invoke(app, ["plot", "ranks", "1", "--store", str(store), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert all(out.with_suffix(s).stat().st_size > 1000 for s in (".png", ".pdf"))
    # Cora METIS-10 and CiteSeer METIS-10 enter; Cora METIS-5 (one seed each) is left out and said so
    assert "of 3 methods over 2 cells (Cora metis-10, CiteSeer metis-10)" in result.stdout
    assert "Left out: Cora metis-5 (seeds: local 1, fedprox 1, fedper 1)" in result.stdout
    # ranks: FedPer 1.5 (1st, 2nd), FedProx 1.5, Local 3 -> chi2 = 12/24 * (9 + 9 + 36) - 24 = 3.0, p = exp(-1.5)
    assert f"χ²(2) = 3.00, p = {math.exp(-1.5):.3g}" in result.stdout and "Friedman does not reject" in result.stdout


class _Seeds:
    """A stand-in for tables.Selection: each (method, cell) has the given number of seeds."""

    def __init__(self, counts: dict[tuple[str, str], int]) -> None:
        self.counts = counts

    def seed_values(self, method: str, dataset: str, scheme: str, clients: int) -> pd.Series | None:
        n = self.counts.get((method, dataset), 0)
        return pd.Series([80.0 + len(method)] * n, index=range(n)) if n else None


def test_a_method_stored_for_one_cell_is_left_out_rather_than_every_other_cell():
    cells = [("cora", "metis", 10), ("citeseer", "metis", 10), ("pubmed", "metis", 10)]
    counts = {(m, d): 3 for m in ("local", "fedavg", "fedpub", "fedgmc") for d, _, _ in cells}
    counts[("fedsage+", "cora")] = 3  # one cell only
    counts[("adafgl", "cora")] = counts[("adafgl", "citeseer")] = 3  # no PubMed
    methods = ["local", "fedavg", "fedsage+", "fedpub", "adafgl", "fedgmc"]
    frame, dropped_methods, dropped_cells = cell_means(_Seeds(counts), methods, cells, named=False)
    # without FedSage+ two cells have every method: it alone is left out, said so, and PubMed goes as a cell
    assert list(frame.columns) == ["local", "fedavg", "fedpub", "adafgl", "fedgmc"] and len(frame) == 2
    assert dropped_methods == ["fedsage+ (too few cells with 2 seeds: without it 2 cells have every method)"]
    assert dropped_cells == ["PubMed metis-10 (seeds: adafgl 0)"]
    # named methods are the user's choice: never left out, so only Cora has them all
    frame, dropped_methods, _ = cell_means(_Seeds(counts), methods, cells, named=True)
    assert len(frame) == 1 and dropped_methods == []
