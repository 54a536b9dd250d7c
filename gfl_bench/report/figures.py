"""The report's own figures (the others are `gflbench.paper.plots`'): accuracy against cost, and the clients' spread,
drawn small for the page."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np

from gflbench.paper import plots  # selects matplotlib's file-only backend (Agg)
from gflbench.report.text import metric_name

if TYPE_CHECKING:  # matplotlib.typing is newer than the oldest matplotlib the package takes (3.7)
    from matplotlib.typing import RcKeyType

_FIGURE_STYLE: dict[RcKeyType, Any] = {"font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7}


def cost_figure(points: list[dict], setting: tuple[str, str, int], out: Path) -> list[Path]:
    """Accuracy against megabytes communicated and against training seconds, one labelled point per method."""
    with plt.rc_context(_FIGURE_STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(8, 3))
        for ax, key, label in (
            (axes[0], "mb", "MB communicated (all rounds)"),
            (axes[1], "seconds", "training seconds (all rounds)"),
        ):
            same: dict[tuple[float, float], list[str]] = {}  # methods at one point (FedProx = FedAvg) share a label
            for p in points:
                same.setdefault((round(p[key], 6), round(p["value"], 6)), []).append(p["method"])
            for (x, y), names in same.items():
                ax.scatter(x, y, s=18)
                ax.annotate(" = ".join(names), (x, y), textcoords="offset points", xytext=(4, 2), fontsize=7)
            ax.set_xlabel(label)
            ax.set_ylabel(f"test {metric_name(setting[0])} (%)")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        return plots.save_figure(fig, out, (".svg",))


def client_figure(boxes: Mapping[str, np.ndarray], setting: tuple[str, str, int], out: Path) -> list[Path]:
    """Box plots of the clients' test values per method."""
    with plt.rc_context(_FIGURE_STYLE):
        fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(boxes) + 1.5), 3))
        ax.boxplot([v[np.isfinite(v)] for v in boxes.values()], showmeans=True)
        ax.set_xticks(range(1, len(boxes) + 1), list(boxes), rotation=30, ha="right")
        ax.set_ylabel(f"client test {metric_name(setting[0])} (%)")
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        return plots.save_figure(fig, out, (".svg",))
