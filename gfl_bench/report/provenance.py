"""The provenance of one cell: everything a reader needs to trust or redo it: how its number was read from its
runs, each seed's run (status, best round, commit, device), the `gflbench run` command that makes those runs,
every hyperparameter with where its value came from, and for FedGMC the paper's case-study figure."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from typing import Any

from gflbench.core.method import Method, method_class
from gflbench.data import dataset_spec
from gflbench.experiments.presets import PresetRow, paper_preset, read_preset
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, read_tuned, tuned_dir, tuned_file
from gflbench.experiments.spec import RunSpec
from gflbench.paper import plots, tables
from gflbench.report.site import Site
from gflbench.report.text import metric_name, pct, scheme_words, slug, utc

CASE_STUDY_METHOD = "fedgmc"  # the paper's case study (Fig. 5, 10-15) shows FedGMC's manifolds


def provenance(
    site: Site, sel: tables.Selection, method: str, dataset: str, scheme: str, clients: int
) -> dict[str, Any]:
    """Everything a reader needs to trust or redo one cell."""
    spec = sel.spec_of(method, dataset, scheme, clients)
    assert spec is not None  # the cell has runs of this configuration
    chosen = sel.runs_of(method, dataset, scheme, clients)
    records = sorted(site.records(chosen["run_key"]), key=lambda r: r["seed"])
    ok = [r for r in records if r.get("status", "ok") == "ok"]
    column = "test" + tables.SELECTION_RULES[sel.rule]
    seeds = [{
        "seed": r["seed"], "status": r.get("status", "ok"),
        "value": pct(100 * r[column]) if r.get(column) is not None else "",
        "best_round": "" if r.get("best_round") is None else f"{r['best_round'] + 1} of {len(r['curves']['test'])}",
        "excluded": ", ".join(f"{k}: {v}" for k, v in sorted((r.get("excluded_clients") or {}).items()) if v) or "none",
        "run_key": r["run_key"], "finished": utc(r.get("finished_at")), "commit": r.get("git_commit", "unknown"),
        "device": f"{r.get('device', '?')} ({r.get('device_name', '?')})", "error": r.get("error", ""),
    } for r in records]  # fmt: skip
    cell = sel.cell(method, dataset, scheme, clients)
    metric = metric_name(dataset)
    seed_list = [r["seed"] for r in records]
    redo = command(site, sel, spec, max(seed_list) + 1)
    commits = sorted({r.get("git_commit", "unknown") for r in records})
    versions = sorted({r.get("versions", {}).get("gflbench", "?") for r in records})
    cell_id = slug(sel.protocol, method, dataset, scheme, clients)
    reading = _reading(sel.rule, metric, clients)
    hover = (f"{site.titles[method]}, {dataset_spec(dataset).title} {scheme}-{clients}: {metric}, {reading['short']}; "
             f"seeds {', '.join(map(str, seed_list))}; commit {', '.join(c[:10] for c in commits)}; click for provenance")  # fmt: skip
    return {
        "id": cell_id,
        "title": f"{site.titles[method]} on {dataset_spec(dataset).title}, {scheme_words(scheme)}, {clients} clients "
        f"(protocol {sel.protocol})",
        "hover": hover,
        "value": sel.format(cell) if cell else "",
        "metric": metric,
        "reading": reading["long"],
        "seeds": seeds,
        "seed_list": ", ".join(map(str, seed_list)),
        "commits": commits,
        "harness": spec.config()["harness"],
        "versions": versions,
        "command": redo,
        "hyperparameters": hyperparameters(site, sel, spec),
        "schedule": f"{spec.rounds} rounds × {spec.local_epochs} local epochs",
        "config_key": spec.config_key,
        "run_keys": [r["run_key"] for r in records],
        "ok": len(ok),
        "paper": None,  # filled in by the board that shows the cell, where the paper has it
        "case_study": case_study(site, sel, spec, ok, cell_id) if method == CASE_STUDY_METHOD else None,
    }


def case_study(site: Site, sel: tables.Selection, spec: RunSpec, ok: Sequence[dict], cell_id: str) -> dict[str, Any]:
    """The paper's case-study figure (Fig. 5: t-SNE of FedGMC's global and local, semantic and structural
    manifolds before and after refinement) for the cell's lowest finished seed, at its first and last round.
    Records hold no manifolds: `gflbench run --snapshot-rounds` saves them as files, which the report reads
    from `Options.snapshots`. Without them the cell says what is missing and the commands that make it."""
    at = (0, spec.rounds - 1)
    if not ok:
        return {"src": None, "missing": "No case-study figure: the cell has no finished run.", "commands": []}
    record = ok[0]
    run = f"{command(site, sel, spec, record['seed'] + 1)} --snapshot-rounds {at[0]},{at[1]}"
    commands = [run]
    if sel.protocol == DEFAULT_PROTOCOL and site.options.local_epochs is None:  # what `plot case-study` can select
        plot = ["gflbench", "plot", "case-study", "-d", spec.dataset, "--partition", spec.scheme, "--clients",
                str(spec.clients), "--seed", str(record["seed"]), "--at", f"{at[0]},{at[1]}"]  # fmt: skip
        plot += ["--rounds", str(site.options.rounds)] if site.options.rounds is not None else []
        plot += [f"--set={spec.method}.{k}={v}" for k, v in sorted(site.options.overrides.get(spec.method, {}).items())]
        commands.append(shlex.join(plot))
    folder = None if site.options.snapshots is None else site.options.snapshots / record["run_key"]
    paths = [] if folder is None else [folder / f"round{r}.pt" for r in at]
    absent = [p.name for p in paths if not p.is_file()]
    if folder is None or absent:
        reason = ("this report was built without a snapshot folder" if folder is None
                  else f"{folder} lacks {', '.join(absent)}")  # fmt: skip
        return {"src": None, "missing": f"No case-study figure: it reads FedGMC's manifolds at rounds {at[0] + 1} and {at[1] + 1} "
                           f"of run {record['run_key']} (seed {record['seed']}), which run records do not hold, and "
                           f"{reason}. These commands make the snapshots (into results/snapshots) and the figure:",
                "commands": commands}  # fmt: skip
    import torch

    before, after = (torch.load(p, weights_only=True) for p in paths)
    title = (f"FedGMC on {dataset_spec(spec.dataset).title}, {scheme_words(spec.scheme)}, {spec.clients} clients, "
             f"seed {record['seed']}: rounds {at[0] + 1} and {at[1] + 1}")  # fmt: skip
    src = site.figure(lambda out: plots.case_study(before, after, title, out, (".svg",)), f"case-study-{cell_id}")
    return {"src": src, "missing": "", "caption": f"{title}. Stars: the global anchors (top, by class) and structural templates "
            f"(bottom); dots: each client's calibrated class means (by class) and sampled local structural manifolds "
            f"(by assigned template). From {folder}/round{at[0]}.pt and round{at[1]}.pt.", "commands": commands}  # fmt: skip


def command(site: Site, sel: tables.Selection, spec: RunSpec, seeds: int) -> str:
    """The `gflbench run` command whose runs are this cell's (same configuration key, seeds 0..N-1)."""
    args = ["gflbench", "run", "-m", spec.method, "-d", spec.dataset, "--partition", spec.scheme,
            "--clients", str(spec.clients), "--seeds", str(seeds)]  # fmt: skip
    if sel.protocol != DEFAULT_PROTOCOL:
        args += ["--protocol", sel.protocol]
    args += site.options.argv()
    args += [f"--set={spec.method}.{k}={v}" for k, v in sorted(site.options.overrides.get(spec.method, {}).items())]
    return shlex.join(args)


def hyperparameters(site: Site, sel: tables.Selection, spec: RunSpec) -> list[dict[str, str]]:
    """Every resolved value of the cell's configuration with where it came from."""
    cls = method_class(spec.method)
    given = tables.rule_overrides(spec.method, sel.rule, site.options.overrides.get(spec.method, {}))
    preset = _preset_rows(cls, spec.dataset, spec.scheme, spec.clients)
    tuned_values, tuned_note = {}, ""
    if sel.protocol == "fair":
        folder = tuned_dir(site.options.tuned)
        entry = read_tuned(folder, spec.dataset, spec.scheme, spec.clients).get("methods", {}).get(spec.method, {})
        tuned_values = {k: str(v) for k, v in entry.get("values", {}).items()}
        budget, trials = entry.get("budget", {}), entry.get("trials", {})
        tuned_note = (f"tuned: {tuned_file(folder, spec.dataset, spec.scheme, spec.clients)} (trial {entry.get('trial', '?')}; "
                      f"budget {budget.get('trials', '?')} trials, {budget.get('sampler', '?')}, pruner "
                      f"{budget.get('pruner', '?')}, tuning seeds {budget.get('tuning_seeds', '?')}; trials run "
                      f"{', '.join(f'{k} {v}' for k, v in trials.items()) or '?'})")  # fmt: skip
    default = f"{cls.__name__}.Params default ({cls.__module__})"
    rows = []
    for key, value in dataclasses.asdict(spec.params).items():
        if key in given:
            source = "--set" if key in site.options.overrides.get(spec.method, {}) else f"--selection {sel.rule}"
        elif key in tuned_values:
            source = tuned_note
        elif key in preset:
            source = _preset_source(cls, preset[key])
        else:
            source = default
        rows.append({"key": key, "value": str(value), "source": source})
    data = dataset_spec(spec.dataset)
    for key, value, own in (
        ("rounds", spec.rounds, data.rounds),
        ("local_epochs", spec.local_epochs, data.local_epochs),
    ):
        if getattr(site.options, key) is not None:
            source = f"--{key.replace('_', '-')}"
        elif key in preset and sel.protocol == "paper":
            source = _preset_source(cls, preset[key])
        else:
            source = f"the dataset's schedule (gfl_bench/data/registry.py, {spec.dataset}: {own})"
        rows.append({"key": key, "value": str(value), "source": source})
    return rows


def _reading(rule: str, metric: str, clients: int) -> dict[str, str]:
    """How a cell's number was read from its runs (docs/protocol.md, "Evaluation and selection")."""
    model = "each client's own model right after its local training in that round (for FedAvg the global model plus local epochs)"
    clients_text = (f"all {clients} clients' local test nodes, plain mean over clients (a client without test nodes, or "
                    f"with one class for ROC-AUC, is left out and counted in the record's excluded_clients)")  # fmt: skip
    if rule == "global":
        long = (f"Client-mean test {metric} at the run's best client-mean validation round (the first round with the "
                f"highest mean validation {metric}); model: {model}; clients: {clients_text}. Then mean ± population "
                "std (ddof 0) over the seeds.")  # fmt: skip
        short = "client-mean test at the best client-mean validation round, after local training, all clients"
    else:
        long = (
            f"Each client's test {metric} at its own best validation round, then the plain mean over clients "
            f"(per-client selection); model: {model}; clients: {clients_text}. Then mean ± population std over the seeds."
        )
        short = "each client at its own best validation round, after local training, all clients"
    return {"long": long, "short": short}


def _preset_rows(cls: type[Method], dataset: str, scheme: str, clients: int) -> dict[str, PresetRow]:
    """The preset file's row behind each value `presets.paper_preset` gives this setting (the row that names the
    setting most closely, as gfl_bench/experiments/presets.py chooses it)."""
    if cls.paper_preset_file is None:
        return {}
    given = paper_preset(cls, dataset, scheme, clients)
    matching = [row for row in read_preset(cls, cls.paper_preset_file) if row.matches(dataset, scheme, clients)]
    return {key: max((r for r in matching if r.key == key), key=lambda r: r.rank) for key in given}


def _preset_source(cls: type[Method], row: PresetRow) -> str:
    where = ",".join("*" if v is None else str(v) for v in (row.dataset, row.scheme, row.clients))
    return f"gfl_bench/experiments/presets/{cls.paper_preset_file}, row {where},{row.key}: {row.source}"
