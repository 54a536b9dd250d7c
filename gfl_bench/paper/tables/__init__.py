"""The paper's Tables 1-7, built from the run store (Table 3 from the loaded datasets).

A cell holds the runs of one method on one dataset, scheme and client count whose configuration key
equals the one `gflbench run` would use with the same options, so a table never mixes
hyperparameters. Values are percentages with two decimals; std is the population std (ddof=0,
numpy's default, as in the FED-PUB analysis notebook) over seeds. A cell with fewer or more seeds than asked
shows `(n=k)`; a cell whose runs all failed shows `failed`; a cell without runs is empty. "Avg." is
the mean of a row's cell means, with the count of cells it covers when some are missing.

Every table is a list of `Block`s (the paper splits wide tables into blocks of three datasets, and
Tables 6 and 7 into one block per dataset); `render` writes blocks as terminal tables, Markdown,
LaTeX (best value bold, second underlined) or CSV.

One job per module: `catalog` (the paper's tables, row order, captions, selection rules), `blocks` (cells,
bands, blocks), `selection` (which stored runs a cell reads), `layouts` (Tables 1, 2, 4-7 from the store),
`graphs` (Table 3 from the data), `render` (the four formats) and `terminal` (folding to the console's width).
"""

from gflbench.experiments.protocol import hyperparameter_source
from gflbench.paper.tables.blocks import Band, Block, Cell
from gflbench.paper.tables.catalog import (
    ABLATIONS,
    ALL_TABLES,
    CAPTIONS,
    CLIENTS,
    EVALUATIONS,
    HETEROPHILIC,
    HOMOPHILIC,
    NO_GLOBAL_MODEL,
    PAPER_METHOD_ORDER,
    RESULT_TABLES,
    SELECTION_RULES,
    SETTINGS,
    TIME_DATASETS,
    VALUES,
    check_evaluation,
    check_rule,
    check_value,
    method_order,
    rule_overrides,
)
from gflbench.paper.tables.graphs import dataset_table, partition_table
from gflbench.paper.tables.layouts import ablation_table, result_cells, results_table, time_table
from gflbench.paper.tables.render import BAND_LEGEND, FORMATS, MARK_LEGENDS, check_format, render
from gflbench.paper.tables.selection import Selection, same_computation
from gflbench.paper.tables.terminal import FoldedTables

__all__ = [
    "ABLATIONS",
    "ALL_TABLES",
    "BAND_LEGEND",
    "CAPTIONS",
    "CLIENTS",
    "EVALUATIONS",
    "FORMATS",
    "HETEROPHILIC",
    "HOMOPHILIC",
    "MARK_LEGENDS",
    "NO_GLOBAL_MODEL",
    "PAPER_METHOD_ORDER",
    "RESULT_TABLES",
    "SELECTION_RULES",
    "SETTINGS",
    "TIME_DATASETS",
    "VALUES",
    "Band",
    "Block",
    "Cell",
    "FoldedTables",
    "Selection",
    "ablation_table",
    "check_evaluation",
    "check_format",
    "check_rule",
    "check_value",
    "dataset_table",
    "hyperparameter_source",  # the report reads it from here
    "method_order",
    "partition_table",
    "render",
    "result_cells",
    "results_table",
    "rule_overrides",
    "same_computation",
    "time_table",
]
