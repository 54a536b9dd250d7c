"""Records of one run that disagree: two imported records, or an imported one and the stored one, that hold one
execution of a run key with different results (`RESULT_FIELDS`); timings and provenance may differ by right."""

from __future__ import annotations

from gflbench.core.execution import execution_key
from gflbench.experiments.store.database import RunStore
from gflbench.experiments.store.files import Imported
from gflbench.experiments.store.rows import _json

# What a run measured: two records under one key that differ here are two different results of one
# experiment (a conflict), while timings and provenance (host, versions, commit) may differ between machines.
RESULT_FIELDS = ("status", "metric", "best_round", "val", "test", "val_weighted", "test_weighted", "val_client_best",
                 "test_client_best", "curves", "client_curves", "excluded_clients", "diagnostics", "bytes_up",
                 "bytes_down", "partition_hash", "data_fingerprint", "error")  # fmt: skip


def _differing_results(a: dict, b: dict) -> list[str]:
    """The results (`RESULT_FIELDS`) two records of one run key hold differently, by name; none: the same
    run. A field only one of them has is no disagreement: records written before it existed lack it
    (`excluded_clients`, `data_fingerprint`). A `data_fingerprint` alone may differ: the same run key
    computed on other processed data (another data folder, a changed PyG), which is not the same run."""
    return [name for name in RESULT_FIELDS
            if a.get(name) is not None and b.get(name) is not None and _json(a[name]) != _json(b[name])]  # fmt: skip


def _fields(names: list[str]) -> str:
    """The differing fields for a one-line message, saying what a differing `data_fingerprint` means."""
    return ", ".join(f"{n} (other processed data)" if n == "data_fingerprint" else n for n in names)


def identity(record: dict) -> tuple[str, str]:
    """What the store keeps a record under: its run key and its execution key (gfl_bench/core/execution.py)."""
    return record["run_key"], execution_key(record)


def distinct(imported: list[Imported]) -> list[dict]:
    """The records of `imported`, one per identity (the first read): what `import` stores."""
    chosen: dict[tuple[str, str], dict] = {}
    for item in imported:
        chosen.setdefault(identity(item.record), item.record)
    return list(chosen.values())


def disagreements(imported: list[Imported]) -> list[str]:
    """Runs (one execution of one run key) that two imported records hold with different results, each as
    "KEY EXECUTION (WHERE vs WHERE: FIELDS)"; records repeated with the same results are no conflict, and two
    executions of one run differ by right (their spread is the execution band)."""
    first: dict[tuple[str, str], Imported] = {}
    found = []
    for item in imported:
        seen = first.setdefault(identity(item.record), item)
        if differ := _differing_results(seen.record, item.record):
            key, execution = identity(item.record)
            found.append(f"{key} {execution} ({seen.where} vs {item.where}: {_fields(differ)})")
    return found


def differing_from_stored(store: RunStore, records: list[dict]) -> list[str]:
    """Records whose run the store holds, under the same execution, with other results, each as "KEY
    (method dataset scheme-clients seed S EXECUTION: FIELDS)": `import` keeps the stored run, and says which
    differ and in what."""
    incoming = {identity(record): record for record in records}
    found = []
    for r in store.records({key for key, _ in incoming}, every_execution=True):
        other = incoming.get(identity(r))
        if other is not None and (differ := _differing_results(r, other)):
            found.append(f"{r['run_key']} ({r['method']} {r['dataset']} {r['scheme']}-{r['clients']} seed {r['seed']} "
                         f"{execution_key(r)}: {_fields(differ)})")  # fmt: skip
    return found
