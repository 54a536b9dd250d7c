"""The sections of the site about all its runs, not one protocol: the stored configurations no page shows, how
the shown runs were made (machines, versions, commits, inputs, the command that rebuilds the site), and the
heterogeneity of every partition they trained on."""

from __future__ import annotations

import hashlib
import shlex
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gflbench.data import dataset_spec
from gflbench.errors import UserError
from gflbench.report.options import STAMP_ENV
from gflbench.report.site import Site
from gflbench.report.text import scheme_words


def other_configurations(site: Site, shown: set[str]) -> list[str]:
    """Stored runs no page shows (another --set, schedule or selection): one line per configuration."""
    rest = site.frame[~site.frame["run_key"].isin(shown)]
    lines = []
    for (protocol, method, key), group in rest.groupby(["protocol", "method", "config_key"], sort=True):
        settings = sorted({f"{d} {s}-{c}" for d, s, c in zip(group["dataset"], group["scheme"], group["clients"])})
        lines.append(f"{protocol} · {method} · configuration {key}: {len(group)} runs ({', '.join(settings)})")
    return lines


def reproducibility(site: Site, shown: set[str]) -> dict[str, Any]:
    """What the shown runs were made with (machines, package versions, commits, executions), the inputs' hashes
    and the command that rebuilds this site from them."""
    records = site.records(sorted(shown))
    versions: dict[str, Counter] = {}
    for r in records:
        for name, version in sorted(r.get("versions", {}).items()):
            versions.setdefault(name, Counter())[version] += 1

    def count(values: Iterable[str]) -> list[tuple[str, int]]:
        return sorted(Counter(values).items())

    given = site.options.inputs
    inputs = [{"path": name, "sha256": hashlib.sha256(Path(name).read_bytes()).hexdigest()}
              for name in given] if site.options.from_records else []  # fmt: skip
    source = f"--records {' '.join(given)}" if site.options.from_records else f"--store {' '.join(given)}"
    extra = shlex.join(site.options.argv() + [f"--set={m}.{k}={v}" for m, values in sorted(site.options.overrides.items())
                                              for k, v in sorted(values.items())])  # fmt: skip
    protocol = f" --protocol {site.options.protocol}" if site.options.protocol else ""
    return {
        "machines": count(f"{r.get('device', '?')} · {r.get('device_name', '?')}" for r in records),
        "versions": {name: sorted(c.items()) for name, c in versions.items()},
        "commits": count(r.get("git_commit", "unknown") for r in records),
        "execution": count(r.get("execution", "per-client") for r in records),
        "inputs": inputs,
        "command": f"{STAMP_ENV}=<stamp> gflbench report {source}{protocol}{(' ' + extra) if extra else ''} --out SITE".replace(
            "  ", " "
        ),
        "alpha": site.options.test.alpha,
        "test": site.options.test.name,
    }


def partitions(site: Site, shown: set[str], say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every partition the shown runs trained on, with its heterogeneity (`heterogeneity.setting_summary`).
    Records hold no node assignment, so it is remade from the data (cached as `gflbench run` caches it) and
    shown only when its hash is the runs'; where the data is absent here, or the remade partition differs,
    the row says so instead of showing numbers that may not be the runs' partition, and `say` hears it."""
    from gflbench.data import default_data_dir, heterogeneity
    from gflbench.experiments.runner import DataCache

    settings = sorted({(r["dataset"], r["scheme"], int(r["clients"]), int(r["data_seed"]), r.get("partition_hash"))
                       for r in site.records(sorted(shown))})  # fmt: skip
    root = default_data_dir()
    cache = DataCache(root, root / "partitions")
    rows = []
    for dataset, scheme, clients, data_seed, digest in settings:
        row: dict[str, Any] = {"dataset": dataset_spec(dataset).title, "scheme": scheme_words(scheme),
                               "clients": clients, "data_seed": data_seed, "hash": digest or "not stored", "absent": ""}  # fmt: skip
        try:
            data = cache.federated(dataset, scheme, clients, data_seed)
        except (UserError, OSError) as error:  # the dataset is not on this machine (no download here)
            absent = f"not recomputed: {error}"
        else:
            remade = data.partition.digest()
            absent = "" if digest in (None, remade) else f"the partition remade here has hash {remade}, not the runs'"
        if absent:
            rows.append({**row, "absent": absent})
            say(f"{dataset} {scheme} {clients} clients: {absent}")
            continue
        summary = heterogeneity.setting_summary(cache.graph(dataset), data.graphs)
        rows.append({**row, **{name: f"{value:+.3f}" if name == "homophily_gap" else f"{value:.3f}"
                               for name, value in summary.items()}})  # fmt: skip
    return rows
