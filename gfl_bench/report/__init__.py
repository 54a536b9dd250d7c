"""`gflbench report`: the leaderboard as one static site, every number with its provenance (docs/report.md).

The site is one `index.html` with its assets (a style sheet, a small script, SVG figures) in one folder:
it needs no network to be read, and it is a pure function of the run records, the package's data (the
paper's numbers, the preset files, the tuned files) and the options, so the same records give the same
bytes. The exceptions: the build stamp (`SOURCE_DATE_EPOCH` pins it, as in reproducible builds), and
the partitions section, which recomputes each shown partition's heterogeneity from the datasets where
they are present here (and says where they are not), checked against the partition hash the runs stored.

Nothing here computes a statistic or a table of its own: the tables are `gflbench.paper.tables`' blocks with
`gflbench.paper.significance`'s marks, the critical-difference diagram is `plots.ranks` on
`significance.rank_analysis`, the paper's values and sources come from `gflbench.paper.compare`, and the
figures from `gflbench.paper.plots` where it has them. What is new is the provenance of each cell (how its
number was read, its seeds, commits, command and hyperparameter sources), the per-client view and the
cost view, which read the stored records.

The modules, in the order a build runs them: `options` (what was asked), `output` (the folder, the staging, the
template), `site` (the runs and figures a build shares), `pages` (one protocol's page) from `boards` (the tables),
`provenance` (one cell) and `views` (cost, clients, convergence, sensitivity; `figures` draws the report's own),
then `overview` (configurations not shown, reproducibility, partitions) and `grid` (what the paper's grid costs);
`text` words values the same way everywhere. Here: the names `gflbench report` and the tests use.
"""

from gflbench.report.options import STAMP_ENV, Options, check_protocols, stamp
from gflbench.report.output import MARKER, build, check_out, open_records

__all__ = ["MARKER", "STAMP_ENV", "Options", "build", "check_out", "check_protocols", "open_records", "stamp"]
