"""`gflbench datasets`, `partitions` and `methods`: what the package holds, and what a partition looks like."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gflbench.commands.common import (
    DataDirOption,
    DataSeedOption,
    DatasetOption,
    PartitionOption,
    ProtocolOption,
    SchemeAlphaOption,
    TunedOption,
    _show,
    console,
    friendly,
)
from gflbench.data import dataset_spec, default_data_dir
from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, PROTOCOLS, check_protocol


@friendly
def datasets(data_dir: DataDirOption = None) -> None:
    """The paper's Table 3 computed from the loaded data; datasets not present locally are marked absent."""
    from gflbench.paper import tables

    _show(tables.render(tables.dataset_table(data_dir or default_data_dir()), tables.CAPTIONS[3], "terminal"))


@friendly
def partitions(
    dataset: DatasetOption,
    scheme: PartitionOption = "metis",
    alpha: SchemeAlphaOption = None,
    clients: Annotated[int, typer.Option(help="Number of clients.")] = 10,
    export: Annotated[
        Path | None,
        typer.Option(help="Write the partition's split manifest (gzip JSON with its sha256) to this file."),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format", "-f", help="terminal, or csv: the heterogeneity statistics per client and summarised."
        ),
    ] = "terminal",
    data_seed: DataSeedOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Per-client nodes, edges, split counts, labels and heterogeneity of one partition (docs/protocol.md)."""
    import pandas as pd
    import torch

    from gflbench.data import heterogeneity
    from gflbench.data.partition import DEFAULT_DATA_SEED, check_clients, scheme_label
    from gflbench.experiments.runner import DataCache

    data_seed = DEFAULT_DATA_SEED if data_seed is None else data_seed  # its value lives with the partitions
    if fmt not in ("terminal", "csv"):
        raise UserError(f"unknown format {fmt!r}; choose terminal or csv")
    dataset_spec(dataset)
    scheme = scheme_label(scheme, alpha)
    check_clients(scheme, clients)
    root = data_dir or default_data_dir()
    cache = DataCache(root, root / "partitions")
    data = cache.federated(dataset, scheme, clients, data_seed)
    if export is not None:
        from gflbench.data.manifest import manifest_of, write_manifest

        manifest = manifest_of(data.partition, dataset, cache.graph(dataset))
        write_manifest(manifest, export)
        console.print(f"wrote {export} ({export.stat().st_size:,} bytes, sha256 {manifest['sha256']})", soft_wrap=True)
    graph = cache.graph(dataset)
    stats = heterogeneity.client_statistics(graph, data.graphs)
    summary = heterogeneity.summary(stats)
    imbalance = heterogeneity.quantity_imbalance(stats)
    if fmt == "csv":
        rows = stats.assign(scope="client", client=range(len(stats)))
        rows = pd.concat([rows, summary.assign(scope=summary.index, client="")], ignore_index=True)
        rows["quantity_imbalance"] = [""] * len(stats) + [f"{imbalance:.6g}"] * len(summary)
        sys.stdout.write(rows[["scope", "client", *heterogeneity.COLUMNS, "quantity_imbalance"]].to_csv(index=False))
        return
    t = Table("client", "nodes", "edges", "train", "val", "test", "labels (count per class)", "JS div.", "homophily",
              "gap", "missing", title=f"{dataset} {scheme} {clients} clients, data seed {data_seed}, hash "
              f"{data.partition.digest()}")  # fmt: skip
    for cid, g in enumerate(data.graphs):
        counts = torch.bincount(g.y, minlength=data.num_classes).tolist()
        row = stats.iloc[cid]
        t.add_row(
            str(cid), str(g.num_nodes), str(g.num_edges // 2), str(int(g.train_mask.sum())),
            str(int(g.val_mask.sum())), str(int(g.test_mask.sum())), " ".join(map(str, counts)),
            f"{row['js']:.3f}", _or_dash(row["homophily"], ".3f"), _or_dash(row["homophily_gap"], "+.3f"), f"{row['missing']:.3f}",
        )  # fmt: skip
    console.print(t)
    for name, values in summary.iterrows():
        console.print(f"{name}: nodes {values['nodes']:.1f}, edges {values['edges']:.1f}, training labels "
                      f"{values['train_labels']:.1f}, JS divergence {values['js']:.3f}, homophily {values['homophily']:.3f} "
                      f"(gap {values['homophily_gap']:+.3f}), missing neighbours {values['missing']:.3f}", soft_wrap=True)  # fmt: skip
    console.print(f"quantity imbalance (CV of client sizes) {imbalance:.3f}; global edge homophily "
                  f"{heterogeneity.edge_homophily(graph.edge_index, graph.y):.3f}", soft_wrap=True)  # fmt: skip


def _or_dash(value: float, spec: str) -> str:
    """A statistic that has no value for this client (homophily of a client without edges: NaN) shows as "-"."""
    return "-" if value != value else format(value, spec)


@friendly
def methods(
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Setting the values are resolved for.")] = "cora",
    partition: PartitionOption = "metis",
    clients: Annotated[int, typer.Option(help="Client count of that setting.")] = 10,
    tuned_dir: TunedOption = None,
) -> None:
    """The registered methods with the backbone and hyperparameters a protocol resolves, and what `tune` searches.

    Switches are listed apart from the hyperparameters (gfl_bench/core/switches.py): fidelity switches choose a
    reading of the method's source (paper or released code, an interpretation), execution switches the
    arithmetic of the same math; `--set method.name=value` sets either."""
    from gflbench.core.method import all_methods
    from gflbench.core.switches import EXECUTION, FIDELITY, switches
    from gflbench.data.partition import check_clients
    from gflbench.experiments.execute import per_client_fallbacks
    from gflbench.experiments.protocol import MissingTuning
    from gflbench.experiments.spec import make_spec
    from gflbench.paper import tables

    check_protocol(protocol)
    dataset_spec(dataset)
    check_clients(partition, clients)
    registered = all_methods()
    t = Table("name", "paper row", "backbone", "batched", "shares", "resolved values", "switches", "tune searches",
              title=f"Methods under protocol {protocol} ({PROTOCOLS[protocol]}), resolved for {dataset} {partition}-{clients}")  # fmt: skip
    for name in tables.method_order(list(registered)):
        cls = registered[name]
        try:
            spec = make_spec(name, dataset, partition, clients, 0, None, protocol=protocol, tuned=tuned_dir)
        except MissingTuning:
            t.add_row(name, cls.title, "", "yes" if cls.batchable else "no", cls.summary,
                      "not tuned yet: gflbench tune -m " + name, "", "")  # fmt: skip
            continue
        values = dataclasses.asdict(spec.params)
        backbone = values.pop("backbone")
        kinds = {kind: [n for n in switches(cls.Params, kind) if n != "backbone"] for kind in (FIDELITY, EXECUTION)}
        shown = " ".join(f"{k}={v}" for k, v in values.items() if not any(k in names for names in kinds.values()))
        toggles = "; ".join(f"{kind}: " + " ".join(f"{k}={values[k]}" for k in names)
                            for kind, names in kinds.items() if names)  # fmt: skip
        space = " ".join(f"{k}∈{s.describe()}" for k, s in cls.Params.search_space.items())
        batched = "no" if per_client_fallbacks([spec]) else "yes"  # `--batched` / `--stack-seeds` batch it
        t.add_row(name, cls.title, backbone, batched, cls.summary, shown, toggles, space)
    _show(t)
