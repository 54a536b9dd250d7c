"""The paper's figures from stored runs: convergence curves (Fig. 3, 6, 7), hyperparameter
sensitivity (Fig. 4, 8, 9) and the FedGMC case study (Fig. 5, 10-15); and ours, the methods' average
ranks across a table's cells (critical-difference diagram). Each is written as PNG and PDF.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import Colormap

from gflbench.data import dataset_spec
from gflbench.data.partition import scheme_title
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore
from gflbench.paper.significance import RankAnalysis
from gflbench.paper.tables import Selection

# Values of the sensitivity study; the paper shows the curves but not the grid, so these are ours.
SENSITIVITY: dict[str, tuple] = {
    "Q": (5, 10, 20, 40),
    "B": (16, 32, 64, 128),
    "tau": (0.1, 0.5, 1.0, 2.0, 5.0),
    "eta": (0.01, 0.05, 0.1, 0.2, 0.5),
}
SENSITIVITY_DATASETS = ("amazon-computer", "cora", "roman-empire")  # Fig. 4, 8, 9 (non-overlapping, 10 clients)
SENSITIVITY_SYMBOLS = {"Q": "$Q$", "B": "$B$", "tau": r"$\tau$", "eta": r"$\eta$"}
SENSITIVITY_MIN_RANGE = 4.0  # percentage points


FORMATS = (".png", ".pdf")  # what `gflbench plot` writes; `gflbench report` asks for ".svg"


def save_figure(fig: plt.Figure, out: Path, suffixes: Sequence[str] = FORMATS) -> list[Path]:
    """Write the figure once per suffix. An SVG carries no date and a fixed id salt, so that the same
    figure gives the same bytes (the report's reproducibility; matplotlib otherwise stamps both)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(suffix) for suffix in suffixes]
    for path in paths:
        svg = path.suffix == ".svg"
        with plt.rc_context({"svg.hashsalt": "gflbench"} if svg else {}):
            fig.savefig(path, bbox_inches="tight", dpi=150, **({"metadata": {"Date": None}} if svg else {}))
    plt.close(fig)
    return paths


def _metric_label(dataset: str) -> str:
    return "ROC-AUC (%)" if dataset_spec(dataset).metric == "roc_auc" else "Accuracy (%)"


def convergence(
    store: RunStore, sel: Selection, methods: Sequence[str], titles: Mapping[str, str],
    dataset: str, scheme: str, clients: int, out: Path, suffixes: Sequence[str] = FORMATS,
) -> list[Path]:  # fmt: skip
    """Client-mean test metric per round, mean over seeds with a ±std band, one line per method."""
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = 0
    for method in methods:
        keys = sel.run_keys(method, dataset, scheme, clients)
        curves = [r["curves"]["test"] for r in store.records(keys) if r.get("status", "ok") == "ok"]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        values = np.array([c[:length] for c in curves]) * 100
        mean, std = values.mean(0), values.std(0)
        rounds = np.arange(1, length + 1)
        # Line styles cycle too, so that methods with identical curves (FedProx and FedGNN on METIS
        # are FedAvg on GCN) stay visible on top of each other.
        style = ("-", "--", "-.", ":")[drawn % 4]
        ax.plot(rounds, mean, style, label=f"{titles[method]} (n={len(curves)})", linewidth=1.4)
        ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return []
    ax.set_xlabel("Communication round")
    ax.set_ylabel(f"Test {_metric_label(dataset)}")
    ax.set_title(f"{dataset_spec(dataset).title}, {scheme_title(scheme)}, {clients} clients")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out, suffixes)


def sensitivity(sel: Selection, dataset: str, scheme: str, clients: int, out: Path,
                suffixes: Sequence[str] = FORMATS) -> list[Path]:  # fmt: skip
    """FedGMC's test metric with std bars as each of Q, B, tau, eta varies and the others keep their defaults."""
    fig, axes = plt.subplots(1, len(SENSITIVITY), figsize=(4 * len(SENSITIVITY), 3.2), sharey=True)
    drawn = 0
    extent: list[float] = []
    for ax, (name, values) in zip(axes, SENSITIVITY.items()):
        xs, means, stds = [], [], []
        for value in values:
            cell = Selection(sel.runs, {"fedgmc": {name: str(value)}}, sel.rounds, sel.local_epochs).cell(
                "fedgmc", dataset, scheme, clients
            )
            if cell and cell.n:
                xs.append(value)
                means.append(cell.mean)
                stds.append(cell.std)
        if xs:
            positions = [values.index(x) for x in xs]
            ax.errorbar(positions, means, yerr=stds, marker="o", capsize=3)
            extent += [m - d for m, d in zip(means, stds)] + [m + d for m, d in zip(means, stds)]
            drawn += 1
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set_xlabel(SENSITIVITY_SYMBOLS[name])
        ax.set_ylabel(_metric_label(dataset))
        ax.grid(alpha=0.3)
    if not drawn:
        plt.close(fig)
        return []
    # One y-range for all panels, at least SENSITIVITY_MIN_RANGE points tall, so that noise-sized
    # differences are not blown up to the full height of a panel.
    middle, half = (max(extent) + min(extent)) / 2, max(max(extent) - min(extent), SENSITIVITY_MIN_RANGE) / 2 * 1.1
    axes[0].set_ylim(middle - half, middle + half)
    fig.suptitle(f"FedGMC sensitivity, {dataset_spec(dataset).title}, {clients} clients (mean ± std over seeds)")
    fig.tight_layout()
    return save_figure(fig, out, suffixes)


def sensitivity_specs(dataset: str, scheme: str, clients: int, seeds: int, rounds: int | None = None) -> list:
    """The runs `sensitivity` reads: one-at-a-time variations around FedGMC's defaults (each run once)."""
    specs = [
        make_spec("fedgmc", dataset, scheme, clients, seed, {name: str(v)}, rounds)
        for name, values in SENSITIVITY.items() for v in values for seed in range(seeds)
    ]  # fmt: skip
    return list({s.run_key: s for s in specs}.values())  # the default value of each parameter is one config


def _tsne(points: np.ndarray, seed: int = 0) -> np.ndarray:
    from sklearn.manifold import TSNE

    perplexity = float(min(30, max(2, len(points) // 4)))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(points)


def case_study(before: Mapping, after: Mapping, title: str, out: Path, suffixes: Sequence[str] = FORMATS) -> list[Path]:
    """t-SNE of FedGMC's global and local manifolds at two rounds (paper Fig. 5).

    Semantic panels: the anchors (stars) and every client's calibrated class means (dots, coloured by
    class). Structural panels: the templates (stars) and the sampled local structural manifolds (dots,
    coloured by the template they are assigned to), each flattened from 2×d to 2d.
    """
    fig, axes = plt.subplots(2, 2, figsize=(9, 8))
    for column, (label, snap) in enumerate((("before refinement", before), ("after refinement", after))):
        _semantic_panel(axes[0][column], snap, f"Semantic manifolds, {label}")
        _structural_panel(axes[1][column], snap, f"Structural manifolds, {label}")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, out, suffixes)


def _semantic_panel(ax: plt.Axes, snap: Mapping, title: str) -> None:
    anchors = snap["anchors"].float().numpy()
    num_classes = anchors.shape[0]
    colours = plt.get_cmap("tab10" if num_classes <= 10 else "tab20")
    points, labels = [anchors], [np.arange(num_classes)]
    if "calibrated_means" in snap:
        means, present = snap["calibrated_means"].float(), snap["class_present"].bool()
        points.append(means[present].numpy())
        labels.append(torch.arange(num_classes).expand_as(present)[present].numpy())
    flat = _tsne(np.concatenate(points))
    ax.scatter(
        flat[num_classes:, 0],
        flat[num_classes:, 1],
        c=[colours(c % 20) for c in np.concatenate(labels[1:] or [np.array([], int)])],
        s=14,
        alpha=0.7,
    )
    _centres(ax, flat[:num_classes], colours, title)


def _structural_panel(ax: plt.Axes, snap: Mapping, title: str) -> None:
    templates = snap["templates"].float().reshape(len(snap["templates"]), -1).numpy()
    q = templates.shape[0]
    colours = plt.get_cmap("tab20")
    points, labels = [templates], []
    for measures, assignment in zip(snap.get("local_structural", []), snap.get("assignment", [])):
        points.append(measures.float().reshape(len(measures), -1).numpy())
        labels.append(assignment.float().argmax(1).numpy())
    flat = _tsne(np.concatenate(points))
    if labels:
        ax.scatter(flat[q:, 0], flat[q:, 1], c=[colours(c % 20) for c in np.concatenate(labels)], s=6, alpha=0.5)
    _centres(ax, flat[:q], colours, title)


def _centres(ax: plt.Axes, centres: np.ndarray, colours: Colormap, title: str) -> None:
    """A case-study panel's last strokes: its centres (prototypes or templates) as large stars, one colour each,
    over the points already drawn, and the title on bare axes (t-SNE coordinates have no scale to show)."""
    ax.scatter(centres[:, 0], centres[:, 1], c=[colours(c % 20) for c in range(len(centres))], marker="*", s=260,
               edgecolors="black", linewidths=0.8)  # fmt: skip
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def ranks(analysis: RankAnalysis, titles: Mapping[str, str], caption: str, out: Path,
          suffixes: Sequence[str] = FORMATS) -> list[Path]:  # fmt: skip
    """Critical-difference diagram of the methods' average ranks (scikit-posthocs), the caption below it.

    Methods joined by a bar are not told apart by Nemenyi's test. Where Friedman's test does not
    reject, no pairwise difference is claimed (Demšar 2006: the post-hoc test only after the
    omnibus one), so every method is joined.
    """
    import pandas as pd
    import scikit_posthocs

    labels = {m: titles.get(m, m) for m in analysis.means.columns}
    ranks = analysis.ranks.rename(index=labels)
    pvalues = analysis.nemenyi if analysis.rejects else analysis.nemenyi * 0 + 1.0
    pvalues = pd.DataFrame(pvalues.to_numpy(), index=ranks.index, columns=ranks.index)
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.3 * len(ranks)))
    drawn = scikit_posthocs.critical_difference_diagram(ranks, pvalues, ax=ax, alpha=analysis.alpha)
    for lines in drawn["crossbars"]:  # a bar's points in rank order: the library walks a set of labels, whose
        for line in lines:  # order changes from process to process, and the file would with it (same picture)
            x, y = (np.asarray(v) for v in line.get_data())
            order = np.argsort(x, kind="stable")
            line.set_data(x[order], y[order])
    if analysis.rejects:  # the CD bar above the rank axis's tick labels (the library draws it on them)
        ax.plot([1, 1 + analysis.cd], [1.3, 1.3], color="black", linewidth=2)
        ax.text(1 + analysis.cd / 2, 1.45, f"CD = {analysis.cd:.2f}", ha="center", va="bottom", fontsize=9)
        ax.set_ylim(ax.get_ylim()[0], 2.2)
    fig.text(0.02, 0.0, textwrap.fill(caption, 120), ha="left", va="top", fontsize=7)
    return save_figure(fig, out, suffixes)
