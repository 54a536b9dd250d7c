"""How far `gflbench sweep --dry-run`'s stored-basis estimate is from what the runs then took.

    python bench/estimate_check.py STORE

For each of the newer methods' Cora and CiteSeer METIS 5- and 20-client cells (3 seeds, `paper`) found in STORE,
the estimate is made from the store without that cell's runs, as the sweep saw it before they ran, by the rule
before 2026-12-07 (the mean seconds per round over every stored run of the method and dataset) and by today's
(`sweep.estimate`), and set beside the stored runs' own seconds per round times their rounds. Nothing is stored.
"""

import math
import sys

import pandas as pd

from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore
from gflbench.paper.sweep import estimate

frame = RunStore(sys.argv[1]).frame()
ok = frame[frame.status == "ok"]
rows = []
for d in ("cora", "citeseer"):
    for c in (5, 20):
        for m in ("fedgta", "fedsage+", "adafgl", "fedssa", "fedtad", "fedici", "fediih"):
            specs = [make_spec(m, d, "metis", c, s, {}, protocol="paper") for s in range(3)]
            keys = {s.run_key for s in specs}
            truth = ok[ok.run_key.isin(keys)]
            if not len(truth):
                continue
            before = frame[
                ~((frame.method == m) & (frame.dataset == d) & (frame.clients == c) & (frame.scheme == "metis"))
            ]
            same = before[(before.status == "ok") & (before.method == m) & (before.dataset == d)]
            old = same.seconds_per_round.mean() * sum(s.rounds for s in specs)
            new = estimate(specs, before, pd.DataFrame())
            rows.append(
                (
                    m,
                    d,
                    c,
                    round(truth.seconds_per_round.mean() * specs[0].rounds * 3),
                    round(old),
                    round(new["est. seconds"].iloc[0]),
                    new["basis"].iloc[0],
                )
            )
df = pd.DataFrame(
    rows, columns=["method", "dataset", "clients", "stored s (3 runs)", "old estimate", "new estimate", "new basis"]
)
df["old/stored"] = (df["old estimate"] / df["stored s (3 runs)"]).round(2)
df["new/stored"] = (df["new estimate"] / df["stored s (3 runs)"]).round(2)
print(df.to_markdown(index=False))
print(
    "median |log ratio| old",
    df["old/stored"].apply(lambda r: abs(math.log(r))).median(),
    "new",
    df["new/stored"].apply(lambda r: abs(math.log(r))).median(),
)
