"""Whether differences between methods exceed seed noise (docs/protocol.md, "Statistics").

Within one table column (a dataset, scheme and client count), every method is compared with the
column's best method (highest mean) by a two-sided paired test over the seeds both have (same seed:
same partition and initial model), and the p-values are Holm-adjusted across the column's methods.
Across columns, the methods' mean values form a cells × methods matrix: a Friedman test over its
ranks, then Nemenyi's pairwise test and critical difference (Demšar 2006) for the rank diagram.

The tests come from scipy, Holm's adjustment from statsmodels and the Nemenyi p-values from
scikit-posthocs; this module only chooses what to compare and refuses what cannot be tested.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from gflbench.data import dataset_spec
from gflbench.errors import UserError

if TYPE_CHECKING:
    from gflbench.paper.tables import Selection

# name -> what a caption calls it
TESTS = {"t": "paired t-test", "wilcoxon": "Wilcoxon signed-rank test"}
T_MIN_SEEDS = 3  # df >= 2: with one degree of freedom the variance of the differences is a single number
RANK_MIN_SEEDS = 2  # a method's cell mean enters the rank analysis only over at least this many seeds
DIFFERENCE_DECIMALS = 9  # paired differences in points are rounded to this many decimals (PairedTest.pvalue)

# What a tested entry is: the column's best, not significantly worse than it, significantly worse,
# or not tested (fewer paired seeds than the test needs).
BEST, NOT_WORSE, WORSE, FEW = "best", "ns", "worse", "few"


def check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must lie strictly between 0 and 1, not {alpha:g}")


@dataclass(frozen=True)
class PairedTest:
    """The per-column test against the best method, and its level."""

    name: str = "t"
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.name not in TESTS:
            raise UserError(f"unknown test {self.name!r}; choose from {', '.join(TESTS)}")
        check_alpha(self.alpha)

    @property
    def min_seeds(self) -> int:
        """The fewest paired seeds at which the test is run.

        Wilcoxon's exact two-sided p is at least 2 / 2**n (every difference of one sign), so below
        log2(2 / alpha) pairs it cannot reject at all: 6 pairs at alpha = 0.05.
        """
        if self.name == "wilcoxon":
            return max(2, math.ceil(math.log2(2 / self.alpha)))
        return T_MIN_SEEDS

    def pvalue(self, best: np.ndarray, other: np.ndarray) -> float:
        """Two-sided p of the paired differences; 1 where they are all zero (the same numbers).

        The differences (in points) are rounded to 1e-9, far below any metric's resolution, so that
        float noise neither makes a variance out of a constant shift nor a sign out of a tie.
        """
        differences = np.round(np.asarray(best, float) - np.asarray(other, float), DIFFERENCE_DECIMALS)
        if not differences.any():
            return 1.0
        if self.name == "wilcoxon":
            return float(stats.wilcoxon(differences).pvalue)
        if np.all(differences == differences[0]):  # the same shift on every seed: t is infinite (scipy: 0, warning)
            return 0.0
        return float(stats.ttest_1samp(differences, 0.0).pvalue)  # the paired t-test is this one on the differences

    def describe(self) -> str:
        """The sentence a caption states: test, pairing, adjustment, level, and the untested entries."""
        return (f"two-sided {TESTS[self.name]} against the column's best mean (among methods with at least "
                f"{self.min_seeds} seeds) over the seeds both methods have (paired by seed), Holm-adjusted across "
                f"the column's methods, α = {self.alpha:g}; n<{self.min_seeds}: too few paired seeds to test")  # fmt: skip


@dataclass(frozen=True)
class Mark:
    """One method's verdict in one column."""

    verdict: str  # BEST, NOT_WORSE, WORSE or FEW
    p: float  # Holm-adjusted p against the best; NaN for the best and for FEW
    n: int  # seeds paired with the best (the best: its own seeds)

    @property
    def top(self) -> bool:
        """The best, or not significantly worse than it."""
        return self.verdict in (BEST, NOT_WORSE)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (monotone in the sorted order, capped at 1), in the input order."""
    from statsmodels.stats.multitest import multipletests  # 0.8 s to import: only when a table is tested

    if not len(pvalues):
        return np.array([])
    return multipletests(np.asarray(pvalues, dtype=float), method="holm")[1]


def compare_to_best(samples: Mapping[str, pd.Series], test: PairedTest) -> dict[str, Mark]:
    """Every method of one column against the column's best mean, paired on the seed index.

    `samples` maps each method to its finished runs' values indexed by seed (a seed occurs once per
    method: the run key includes it). Methods without values get no mark. The best is the highest
    mean among the methods with at least `test.min_seeds` seeds, so that one lucky seed of another
    method does not leave the whole column untested; a method with fewer seeds, or fewer in common
    with the best, is FEW. The Holm family is the methods that are tested.
    """
    present = {m: s for m, s in samples.items() if len(s)}
    testable = [m for m, s in present.items() if len(s) >= test.min_seeds]
    if not testable:
        return {m: Mark(FEW, math.nan, len(s)) for m, s in present.items()}
    best = max(testable, key=lambda m: present[m].mean())  # ties: the first in row order
    reference = present[best]
    marks = {best: Mark(BEST, math.nan, len(reference))}
    tested: dict[str, tuple[float, int, bool]] = {}
    for method, values in present.items():
        if method == best:
            continue
        shared = values.index.intersection(reference.index)
        if len(shared) < test.min_seeds:
            marks[method] = Mark(FEW, math.nan, len(shared))
            continue
        a, b = reference[shared].to_numpy(float), values[shared].to_numpy(float)
        tested[method] = (test.pvalue(a, b), len(shared), bool(a.mean() > b.mean()))
    for (method, (_, n, below)), p in zip(tested.items(), holm([p for p, _, _ in tested.values()])):
        # "worse" needs the paired mean below the best's too: on a subset of seeds the order can turn
        marks[method] = Mark(WORSE if p < test.alpha and below else NOT_WORSE, float(p), n)
    return marks


@dataclass(frozen=True)
class RankAnalysis:
    """Friedman's test and Nemenyi's pairwise comparison over a cells × methods matrix of means."""

    means: pd.DataFrame  # rows: cells, columns: methods; higher is better
    ranks: pd.Series  # average rank per method, 1 = best
    statistic: float  # Friedman's chi-square
    pvalue: float
    nemenyi: pd.DataFrame  # pairwise p-values, methods × methods
    cd: float  # Nemenyi's critical difference of average ranks
    alpha: float

    @property
    def rejects(self) -> bool:
        return self.pvalue < self.alpha


def rank_analysis(means: pd.DataFrame, alpha: float) -> RankAnalysis:
    """Average ranks (1 = highest mean, ties averaged), Friedman over them, Nemenyi pairs and CD."""
    import scikit_posthocs

    cells, k = means.shape
    if k < 3 or cells < 2:
        raise UserError(f"a rank analysis needs at least 3 methods and 2 cells where all of them have runs; "
                        f"found {k} methods over {cells} cell{'s' * (cells != 1)}")  # fmt: skip
    ranks = means.rank(axis=1, ascending=False).mean(axis=0)
    friedman = stats.friedmanchisquare(*(means[m].to_numpy(float) for m in means.columns))
    nemenyi = scikit_posthocs.posthoc_nemenyi_friedman(means.to_numpy(float))
    nemenyi.index = nemenyi.columns = means.columns
    # the largest rank difference Nemenyi does not reject: q_alpha of the studentized range over sqrt(2)
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    cd = float(q * math.sqrt(k * (k + 1) / (6 * cells)))
    return RankAnalysis(means, ranks, float(friedman.statistic), float(friedman.pvalue), nemenyi, cd, alpha)


def rank_caption(analysis: RankAnalysis, protocol: str, selection: str, left_out: str) -> str:
    """The caption of a critical-difference diagram: what was ranked, Friedman's result, what a bar means
    and what was left out (`gflbench plot ranks` and `gflbench report` print the same sentence)."""
    k, n, alpha = analysis.means.shape[1], len(analysis.means), analysis.alpha
    verdict = (f"Nemenyi post-hoc at α = {alpha:g}: methods joined by a bar do not differ (CD = {analysis.cd:.2f})"
               if analysis.rejects else f"Friedman does not reject at α = {alpha:g}: no pairwise difference is claimed")  # fmt: skip
    return (f"Average ranks (1 = highest mean over seeds, at least {RANK_MIN_SEEDS} seeds) of {k} methods "
            f"over {n} cells ({', '.join(analysis.means.index)}); protocol {protocol}, {selection} selection. Friedman "
            f"χ²({k - 1}) = {analysis.statistic:.2f}, p = {analysis.pvalue:.3g}; {verdict}. Left out: {left_out}.")  # fmt: skip


def cell_means(sel: Selection, methods: Sequence[str], cells: Sequence[tuple[str, str, int]],
               named: bool) -> tuple[pd.DataFrame, list[str], list[str]]:  # fmt: skip
    """The cells × methods matrix of seed means where every method has at least RANK_MIN_SEEDS seeds.

    Methods not `named` by the user that reach that count in no cell are left out first. If fewer
    than two cells then have every remaining method, the method whose absence completes the most
    cells is left out too, one at a time, while that helps and at least three methods remain (a
    method stored for one cell, FedSage+ on Cora alone, would otherwise leave no analysis at all).
    Then every cell where a method falls short is left out. Named methods are never left out.
    Returns the matrix and a line per method and per cell left out.
    """
    values = {(m, c): sel.seed_values(m, *c) for m in methods for c in cells}
    counts = {key: 0 if v is None else len(v) for key, v in values.items()}
    dropped_methods = []
    kept = list(methods)
    if not named:
        kept = [m for m in methods if any(counts[(m, c)] >= RANK_MIN_SEEDS for c in cells)]
        dropped_methods = [f"{m} (fewer than {RANK_MIN_SEEDS} seeds in every cell)" for m in methods
                           if m not in kept and any(counts[(m, c)] for c in cells)]  # fmt: skip

    def complete(methods: list[str]) -> int:
        return sum(all(counts[(m, c)] >= RANK_MIN_SEEDS for m in methods) for c in cells)

    while not named and complete(kept) < 2 and len(kept) > 3:
        gains = {m: complete([k for k in kept if k != m]) for m in kept}
        drop = max(kept, key=lambda m: gains[m])  # ties: the first in row order
        if gains[drop] <= complete(kept):
            break
        kept.remove(drop)
        dropped_methods.append(
            f"{drop} (too few cells with {RANK_MIN_SEEDS} seeds: without it {gains[drop]} cells have every method)"
        )
    rows, dropped_cells = {}, []
    for cell in cells if kept else []:
        short = [f"{m} {counts[(m, cell)]}" for m in kept if counts[(m, cell)] < RANK_MIN_SEEDS]
        if not short:
            rows[cell_label(cell)] = {m: float(values[(m, cell)].mean()) for m in kept}
        elif any(counts[(m, cell)] for m in kept):  # a cell nobody ran is not part of the analysis, not a dropped cell
            dropped_cells.append(f"{cell_label(cell)} (seeds: {', '.join(short)})")
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=kept)
    return frame, dropped_methods, dropped_cells


def cell_label(cell: tuple[str, str, int]) -> str:
    dataset, scheme, clients = cell
    return f"{dataset_spec(dataset).title} {scheme}-{clients}"
