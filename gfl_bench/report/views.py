"""The views over one protocol's cells beyond their values: cost (seconds, bytes and memory per round, and
accuracy against communication and time), the clients' spread against Local, and the convergence and
sensitivity figures of `gflbench plot`, all read from the stored records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from gflbench.data import dataset_spec
from gflbench.experiments.protocol import DEFAULT_PROTOCOL
from gflbench.paper import plots, tables
from gflbench.report.figures import client_figure, cost_figure
from gflbench.report.site import Site
from gflbench.report.text import metric_name, pct, scheme_words, slug


def cost(
    site: Site, sel: tables.Selection, protocol: str, cells: Sequence[tuple], settings: Sequence[tuple]
) -> dict[str, Any]:
    """Seconds, bytes and memory per round per cell, and accuracy against communication and time per setting."""
    rows = []
    points: dict[tuple, list[dict]] = {}
    for method, d, s, c in cells:
        ok = sorted((r for r in site.records(sel.run_keys(method, d, s, c)) if r.get("status", "ok") == "ok"),
                    key=lambda r: r["seed"])  # fmt: skip
        if not ok:
            continue
        column = "test" + tables.SELECTION_RULES[sel.rule]
        value = float(np.mean([math.nan if r.get(column) is None else r[column] for r in ok])) * 100
        per_round = float(np.mean([site.seconds[r["run_key"]] for r in ok]))  # the store's column, as Table 7
        traffic = [np.asarray(r["bytes_up"], float) + np.asarray(r["bytes_down"], float) for r in ok]
        peaks = [r["peak_memory_bytes"] for r in ok if r.get("peak_memory_bytes")]
        total_seconds = float(np.mean([np.sum(r["seconds_per_round"]) for r in ok]))
        total_bytes = float(np.mean([t.sum() for t in traffic]))
        row = {
            "method": site.titles[method], "setting": f"{dataset_spec(d).title} {s}-{c}", "seeds": len(ok),
            "value": pct(value), "seconds": f"{per_round:.3f}", "mb_round": f"{np.mean([t.mean() for t in traffic]) / 2**20:.2f}",
            "peak": f"{np.mean(peaks) / 2**20:.0f}" if peaks else "", "total_seconds": f"{total_seconds:.1f}",
            "total_mb": f"{total_bytes / 2**20:.1f}", "devices": ", ".join(sorted({r.get("device_name", "?") for r in ok})),
        }  # fmt: skip
        rows.append(row)
        points.setdefault((d, s, c), []).append({"method": site.titles[method], "value": value,
                                                 "mb": total_bytes / 2**20, "seconds": total_seconds})  # fmt: skip
    figures = []
    for setting in settings:
        if setting not in points:
            continue
        d, s, c = setting
        stem = f"cost-{slug(protocol, d, s, c)}"
        path = site.figure(partial(cost_figure, points[setting], setting), stem)
        figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {scheme_words(s)}, {c} clients: "
                        f"mean test {metric_name(d)} over seeds against the bytes communicated (up + down, all clients, "
                        "all rounds) and against the training time (sum of seconds per round, evaluation excluded)."})  # fmt: skip
    return {"rows": rows, "figures": figures}


def client_view(
    site: Site, sel: tables.Selection, protocol: str, cells: Sequence[tuple], settings: Sequence[tuple]
) -> dict[str, Any]:
    """Per cell, the spread of the clients' test values at each run's best round, the worst client, and the
    fraction of clients below Local (same seed, same client, Local at its own best round)."""
    values: dict[tuple, dict[int, np.ndarray]] = {}
    for method, d, s, c in cells:
        per_seed = {}
        for r in site.records(sel.run_keys(method, d, s, c)):
            if r.get("status", "ok") == "ok" and r.get("client_curves"):
                row = r["client_curves"]["test"][r["best_round"]]
                per_seed[r["seed"]] = np.array([math.nan if v is None else v for v in row], float) * 100
        if per_seed:
            values[(method, d, s, c)] = dict(sorted(per_seed.items()))  # seed order: the same sums every build
    rows, figures = [], []
    for (method, d, s, c), per_seed in values.items():
        local = values.get(("local", d, s, c), {})
        shared = sorted(set(per_seed) & set(local)) if method != "local" else []
        below = [float(np.nanmean(per_seed[k] < local[k])) for k in shared
                 if np.isfinite(per_seed[k]).any() and np.isfinite(local[k]).any()]  # fmt: skip
        rows.append({
            "method": site.titles[method], "setting": f"{dataset_spec(d).title} {s}-{c}", "seeds": len(per_seed),
            "mean": pct(np.mean([np.nanmean(v) for v in per_seed.values()])),
            "spread": pct(np.mean([np.nanstd(v) for v in per_seed.values()])),
            "range": pct(np.mean([np.nanmax(v) - np.nanmin(v) for v in per_seed.values()])),
            "worst": pct(np.mean([np.nanmin(v) for v in per_seed.values()])),
            "worst_ever": pct(min(np.nanmin(v) for v in per_seed.values())),
            "below_local": "" if method == "local" else (f"{100 * np.mean(below):.0f}% ({len(below)} seeds)" if below else "no Local runs"),
        })  # fmt: skip
    for setting in settings:
        boxes = {site.titles[m]: np.concatenate([v[seed] for seed in sorted(v)])
                 for (m, *rest), v in values.items() if tuple(rest) == setting}  # fmt: skip
        if not boxes:
            continue
        d, s, c = setting
        stem = f"clients-{slug(protocol, d, s, c)}"
        path = site.figure(partial(client_figure, boxes, setting), stem)
        figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {scheme_words(s)}, {c} clients: every "
                        f"client's test {metric_name(d)} at its run's best round, all seeds pooled, one box per method."})  # fmt: skip
    return {"rows": rows, "figures": figures}


def convergence(
    site: Site, sel: tables.Selection, protocol: str, methods: Sequence[str], settings: Sequence[tuple]
) -> list[dict]:
    """`gflbench plot convergence` per setting, as SVG."""
    figures = []
    for d, s, c in settings:
        stem = f"convergence-{slug(protocol, d, s, c)}"
        draw = partial(plots.convergence, site.runs, sel, methods, site.titles, d, s, c, suffixes=(".svg",))
        path = site.figure(draw, stem)
        if path:
            figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {scheme_words(s)}, {c} clients: "
                            f"client-mean test {metric_name(d)} per round, mean ± std over seeds."})  # fmt: skip
    return figures


def sensitivity(site: Site, sel: tables.Selection, protocol: str, stored: pd.DataFrame) -> list[dict]:
    """`gflbench plot sensitivity` (FedGMC over Q, B, tau, eta; `paper` only, as that command reads) for each
    setting where FedGMC has runs of more than one configuration: with one, every panel is its single point."""
    if protocol != DEFAULT_PROTOCOL:
        return []
    fedgmc = stored[stored["method"] == "fedgmc"]
    varied = fedgmc.groupby(["dataset", "scheme", "clients"])["config_key"].nunique()
    figures = []
    for (d, s, c), count in sorted(varied.items()):
        if count < 2:
            continue
        stem = f"sensitivity-{slug(protocol, d, s, c)}"
        path = site.figure(partial(plots.sensitivity, sel, d, s, int(c), suffixes=(".svg",)), stem)
        if path:
            figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {scheme_words(s)}, {c} clients: FedGMC's "
                            f"test {metric_name(d)} as each of Q, B, tau, eta varies around its default (mean ± std over seeds)."})  # fmt: skip
    return figures
