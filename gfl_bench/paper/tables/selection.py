"""Which stored runs a table cell reads (`Selection`): the runs of one method on one dataset, scheme and client
count whose configuration key equals the one `gflbench run` would use with the same options, so a table never
mixes hyperparameters; and what a cell shows of them (mean, std over seeds, counts, execution band)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gflbench.core.method import method_class
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, PROTOCOLS, MissingTuning, hyperparameter_source
from gflbench.experiments.records import run_key_of
from gflbench.experiments.spec import RunSpec, execution_variants, make_spec
from gflbench.paper.tables.blocks import Band, Cell
from gflbench.paper.tables.catalog import (
    EVALUATIONS,
    NO_GLOBAL_MODEL,
    SELECTION_RULES,
    check_evaluation,
    rule_overrides,
)


def _at_participation(runs: pd.DataFrame, participation: float) -> pd.DataFrame:
    """The rows run at `participation`: those whose run key is their configuration's at it (runs at F = 0.5
    and at 1 share the configuration key and differ in the run key only, `records.run_key_of`)."""
    if runs.empty:
        return runs
    columns = (runs[name] for name in ("config_key", "dataset", "scheme", "clients", "seed"))
    keys = [run_key_of(c, d, s, int(m), int(seed), participation) for c, d, s, m, seed in zip(*columns)]
    return runs[runs["run_key"] == pd.Series(keys, index=runs.index)]


@dataclass(frozen=True)
class Selection:
    """Which stored runs a table reads: the methods' configurations as `gflbench run` would resolve them."""

    runs: pd.DataFrame
    overrides: Mapping[str, Mapping[str, str]]
    rounds: int | None = None
    local_epochs: int | None = None
    expected_seeds: int = 10
    rule: str = "global"
    protocol: str = DEFAULT_PROTOCOL
    tuned: Path | None = None  # the `fair` protocol's folder of tuned values
    value: str = "test"  # "test", or "val" to choose settings by (never report validation as a result)
    # Every execution of every stored run (`RunStore.frame(every_execution=True)`), for execution bands; `runs`
    # holds the one execution per run that cells read. None: no bands.
    executions: pd.DataFrame | None = None
    # The fraction of clients sampled per round the runs used (`--participation`; docs/protocol.md): it shares
    # the configuration key, so cells keep the runs whose run key is their configuration's at this fraction.
    participation: float = 1.0
    # Which model's reading the cells show (`--evaluate`; docs/protocol.md, "Evaluation modes"): personalised
    # (each client's model after local training) or global (the global or cluster model before it).
    evaluate: str = "personalised"

    def __post_init__(self) -> None:
        check_evaluation(self.evaluate, self.rule)

    def _column(self, column: str | None = None) -> str:
        """The store column a cell reads: `column`, or the shown value under the evaluation mode and rule."""
        column = column or self.value
        if column not in ("test", "val"):
            return column
        return f"global_{column}" if self.evaluate == "global" else column + SELECTION_RULES[self.rule]

    def spec_of(self, method: str, dataset: str, scheme: str, clients: int) -> RunSpec | None:
        """Seed 0's spec of one cell under the selected protocol; None where `fair` has no tuned values."""
        try:
            overrides = rule_overrides(method, self.rule, self.overrides.get(method, {}))
            return make_spec(method, dataset, scheme, clients, 0, overrides, self.rounds, self.local_epochs,
                             protocol=self.protocol, tuned=self.tuned, participation=self.participation)  # fmt: skip
        except MissingTuning:
            return None

    def runs_of(self, method: str, dataset: str, scheme: str, clients: int) -> pd.DataFrame:
        """The stored runs (any status) of one cell under the selected protocol and configuration."""
        runs = self.runs
        spec = self.spec_of(method, dataset, scheme, clients)
        if runs.empty or spec is None:
            return runs.iloc[0:0]
        key = spec.config_key
        return _at_participation(runs[(runs["config_key"] == key) & (runs["method"] == method)
                                      & (runs["dataset"] == dataset) & (runs["scheme"] == scheme)
                                      & (runs["clients"] == clients)], self.participation)  # fmt: skip

    def run_keys(self, method: str, dataset: str, scheme: str, clients: int) -> list[str]:
        return list(self.runs_of(method, dataset, scheme, clients)["run_key"]) if len(self.runs) else []

    def seed_values(
        self, method: str, dataset: str, scheme: str, clients: int, column: str | None = None
    ) -> pd.Series | None:
        """One cell's finished runs' values indexed by seed (percent; s or MB for the cost columns), what tests
        pair on; None where the store predates the column."""
        chosen = self.runs_of(method, dataset, scheme, clients)
        column = self._column(column)
        if column not in chosen:
            return None
        ok = chosen[chosen["status"] == "ok"].dropna(subset=[column])
        scale = {"seconds_per_round": 1.0, "peak_memory_bytes": 1.0 / 2**20}.get(column, 100.0)  # s, MB, percent
        return pd.Series(ok[column].to_numpy(float) * scale, index=ok["seed"])

    def band(self, method: str, dataset: str, scheme: str, clients: int) -> Band | None:
        """The cell's execution band, where the store holds some seed under more than one execution; else None.

        The executions of a seed are its records under the cell's run key (one per execution key) and under
        the run keys that differ from it in execution switches only (`spec.execution_variants`). The value is
        the one the cell shows (test or validation, under the selection rule)."""
        spec = self.spec_of(method, dataset, scheme, clients)
        runs = self.executions
        if runs is None or runs.empty or spec is None:
            return None
        variants = execution_variants(spec)
        column = self._column()
        chosen = runs[runs["config_key"].isin(list(variants)) & (runs["method"] == method) & (runs["status"] == "ok")
                      & (runs["dataset"] == dataset) & (runs["scheme"] == scheme) & (runs["clients"] == clients)]  # fmt: skip
        chosen = _at_participation(chosen, self.participation)
        if column not in chosen:
            return None
        chosen = chosen.dropna(subset=[column])
        labels = (chosen["execution_key"] + " " + chosen["config_key"].map(variants)).str.strip()
        per_seed = chosen.assign(label=labels, value=chosen[column] * 100.0).groupby("seed")
        several = per_seed["label"].nunique() > 1
        if not several.any():
            return None
        spreads = per_seed["value"].agg(lambda v: v.max() - v.min())[several]
        seen = tuple(sorted(set(labels[chosen["seed"].isin(spreads.index)])))
        return Band(float(spreads.max()), int(several.sum()), seen)

    def cell(self, method: str, dataset: str, scheme: str, clients: int, column: str | None = None) -> Cell | None:
        chosen = self.runs_of(method, dataset, scheme, clients)
        if chosen.empty:
            return None
        ok = self.seed_values(method, dataset, scheme, clients, column)
        if ok is None:  # a store written before the column existed
            return None
        failed = int((chosen["status"] == "failed").sum())
        if ok.empty and self._has_no_global_model(chosen, column):
            return Cell(math.nan, math.nan, 0, failed, note=NO_GLOBAL_MODEL)
        if ok.empty and not failed:
            return None
        if ok.empty:
            return Cell(math.nan, math.nan, 0, failed)
        return Cell(float(ok.mean()), float(ok.std(ddof=0)), len(ok), failed)

    def _has_no_global_model(self, chosen: pd.DataFrame, column: str | None) -> bool:
        """Under --evaluate global, whether the cell's finished runs recorded a global reading and it was null:
        the method has no global model. Runs stored before records carried the reading leave the cell empty."""
        if self.evaluate != "global" or self._column(column) not in ("global_test", "global_val"):
            return False
        finished = chosen[chosen["status"] == "ok"]
        return "global_recorded" in finished and bool(finished["global_recorded"].astype(bool).any())

    def format(self, cell: Cell | None, decimals: int = 2, with_std: bool = True) -> str:
        if cell is None:
            return ""
        if cell.n == 0:
            return cell.note or "failed"
        text = f"{cell.mean:.{decimals}f}" + (f"±{cell.std:.{decimals}f}" if with_std else "")
        notes = []
        if cell.n != self.expected_seeds:  # fewer or more seeds than the table asks for
            notes.append(f"n={cell.n}")
        if cell.failed:
            notes.append(f"{cell.failed} failed")
        return f"{text} ({', '.join(notes)})" if notes else text

    def caption(self, text: str, reading: bool = True) -> str:
        """A table caption that states the protocol, where the hyperparameters came from and, for a table of
        results (`reading`; not Table 7's seconds), which model's reading its cells show."""
        extra = "; with --set " + " ".join(
            f"{m}.{k}={v}" for m, values in sorted(self.overrides.items()) for k, v in sorted(values.items())
        ) if any(self.overrides.values()) else ""  # fmt: skip
        if reading:
            text = f"{text.rstrip('.')}. Evaluation: {self.evaluate} ({EVALUATIONS[self.evaluate]})"
        if self.participation != 1:
            text = f"{text.rstrip('.')}, participation F = {self.participation:g} (⌈F·M⌉ clients sampled per round)"
        return (f"{text.rstrip('.')}. Protocol: {self.protocol} ({PROTOCOLS[self.protocol]}); "
                f"{hyperparameter_source(self.protocol, self.tuned)}{extra}. Row labels name each method's backbone.")  # fmt: skip

    def row_label(self, method: str, title: str, settings: Sequence[tuple[str, str, int]]) -> str:
        """`Title [backbone]` over the table's cells, plus `≡ Other` where every cell provably computes another row,
        and the features' normalisation where a cell's is not its dataset's (`unnormalised x`, a source's loader)."""
        specs = [s for s in (self.spec_of(method, d, sc, c) for d, sc, c in settings) if s is not None]
        backbones = sorted({s.params.backbone for s in specs})
        norms = sorted({f"{'unnormalised' if s.feature_norm == 'none' else 'row-normalised'} x" for s in specs
                        if s.feature_norm is not None})  # fmt: skip
        label = f"{title} [{', '.join(['/'.join(backbones), *norms])}]" if backbones else title
        twins = {same_computation(s, self) for s in specs}
        if len(twins) == 1 and None not in twins:
            label += f" ≡ {method_class(twins.pop()).title}"
        return label


def same_computation(spec: RunSpec, sel: Selection) -> str | None:
    """The method whose run in `sel`'s configuration provably computes the same numbers as `spec`, if any.

    A method declares the condition (`Method.equivalent`: FedProx at one local epoch is FedAvg, FedGNN
    without cross-client matches is FedAvg); it holds only when the other method's resolved
    configuration equals the one the equivalence needs.
    """
    twin = method_class(spec.method).equivalent(spec.params, spec.scheme, spec.local_epochs)
    if twin is None:
        return None
    name, values = twin
    other = sel.spec_of(name, spec.dataset, spec.scheme, spec.clients)
    if other is None or (other.rounds, other.local_epochs, other.feature_norm) != (
        spec.rounds,
        spec.local_epochs,
        spec.feature_norm,
    ):
        return None
    return name if dataclasses.asdict(other.params) == values else None
