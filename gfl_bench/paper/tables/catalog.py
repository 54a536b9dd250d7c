"""What the paper's tables are (their datasets, settings, row order and captions), and the choices a table
offers beside them (the selection rule, test or validation values). Plain values, no pandas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gflbench.core.method import method_class
from gflbench.errors import UserError

# The paper's row order (Tables 1-2); variants registered later are appended after these.
PAPER_METHOD_ORDER = (
    "local", "fedavg", "fedprox", "fedper", "gcfl", "fedgnn", "fedsage+", "fedpub", "fedgta",
    "adafgl", "fedtad", "fediih", "fedici", "fedssa", "fedgmc",
)  # fmt: skip
ABLATIONS = ("fedgmc-wo-semantic", "fedgmc-wo-structural", "fedgmc-wo-refinement")

HOMOPHILIC = ("cora", "citeseer", "pubmed", "amazon-computer", "amazon-photo", "ogbn-arxiv")
HETEROPHILIC = ("roman-empire", "amazon-ratings", "minesweeper", "tolokers", "questions")
SETTINGS = (("metis", 5), ("metis", 10), ("metis", 20), ("overlap", 10), ("overlap", 30), ("overlap", 50))
CLIENTS = {"metis": (5, 10, 20), "overlap": (10, 30, 50)}
TIME_DATASETS = ("cora", "roman-empire")
# How a run's reported value is chosen (docs/protocol.md, "Selection rules"): "global" = the test value
# at the run's best client-mean validation round (FED-PUB, the default); "per-client" = each client's
# test value at its own best validation round, then the client mean (FedICI's released code).
SELECTION_RULES = {"global": "", "per-client": "_client_best"}
VALUES = ("test", "val")  # what a cell shows: the test value, or the validation value that chose it
# Which model a cell reads (docs/protocol.md, "Evaluation modes"), as a table's caption names it.
EVALUATIONS = {
    "personalised": "each client's own model right after its local training",
    "global": "the global or cluster model each client starts a round from, before local training",
}
NO_GLOBAL_MODEL = "no global model"  # a cell under --evaluate global whose method has none (its records say null)

_HETERO_METRICS = (
    "Accuracy (%) for Roman-empire and Amazon-ratings, ROC-AUC (%) for Minesweeper, Tolokers and Questions."
)
CAPTIONS = {
    1: "Table 1: Accuracy (%) on six homophilic graphs, non-overlapping partitioning.",
    2: f"Table 2: Five heterophilic graphs, non-overlapping partitioning. {_HETERO_METRICS}",
    3: "Table 3: Statistics of the eleven graphs (after the largest connected component; undirected edges).",
    4: "Table 4: Accuracy (%) on six homophilic graphs, overlapping partitioning.",
    5: f"Table 5: Five heterophilic graphs, overlapping partitioning. {_HETERO_METRICS}",
    6: "Table 6: Ablations of FedGMC under non-overlapping and overlapping partitioning (↓: drop against FedGMC, ↑: gain).",
    7: "Table 7: Seconds per communication round (configure + local training + aggregation, evaluation excluded), "
    "and the runs' mean peak memory in MB (CUDA: torch's peak allocation; CPU: the worker process's peak RSS).",
}
RESULT_TABLES = {
    1: (HOMOPHILIC, "metis"),
    2: (HETEROPHILIC, "metis"),
    4: (HOMOPHILIC, "overlap"),
    5: (HETEROPHILIC, "overlap"),
}
ALL_TABLES = (1, 2, 3, 4, 5, 6, 7)


def method_order(names: Sequence[str]) -> list[str]:
    known = [m for m in PAPER_METHOD_ORDER + ABLATIONS if m in names]
    return known + sorted(n for n in names if n not in known)


def check_rule(rule: str) -> None:
    if rule not in SELECTION_RULES:
        raise UserError(f"unknown selection rule {rule!r}; choose from {', '.join(SELECTION_RULES)}")


def check_evaluation(evaluate: str, rule: str) -> None:
    """`--evaluate`: a known mode; the global reading has one selection rule (its own best client-mean
    validation round: records store no per-client selection of it)."""
    if evaluate not in EVALUATIONS:
        raise UserError(f"unknown evaluation mode {evaluate!r}; choose from {', '.join(EVALUATIONS)}")
    if evaluate == "global" and rule != "global":
        raise UserError("--evaluate global is read at the global model's best client-mean validation round only; "
                        "use it with --selection global")  # fmt: skip


def rule_overrides(method: str, rule: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """One method's `--set` values under a selection rule: `per-client` adds the method's own per-client
    selection switch (`Method.per_client_selection`, e.g. AdaFGL's best epoch) where `--set` leaves it, so
    `run` and `table` with the same rule meet the same runs; `global` adds nothing."""
    check_rule(rule)
    switch = method_class(method).per_client_selection
    if rule != "per-client" or switch is None:
        return dict(overrides)
    field, value = switch
    return {field: value, **overrides}


def check_value(value: str) -> None:
    if value not in VALUES:
        raise UserError(f"unknown value {value!r}; choose from {', '.join(VALUES)}")
