"""Whether a record about to be imported is a run record consistent with itself: its fields, its keys against
its configuration, its values against its curves (the rules of `gfl_bench/experiments/records.py`, recomputed)."""

from __future__ import annotations

import math

from gflbench.experiments.store.rows import finite

# What a record must hold to be stored by `import`: the key, the configuration it was computed from, the
# cell it belongs to, its outcome, and when it finished; a finished run also its values and curves.
REQUIRED_FIELDS = ("run_key", "config_key", "config", "method", "dataset", "scheme", "clients", "data_seed", "seed",
                   "metric", "status", "finished_at")  # fmt: skip
_OK_FIELDS = ("best_round", "val", "test", "val_weighted", "test_weighted", "curves", "client_curves")
# How far a client mean recomputed from a record's client curves may be from its stored value: the run
# averages float32 values on its device, the check in float64.
_MEAN_TOLERANCE = 1e-5


def check_record(record: object) -> str | None:
    """What is wrong with a record about to be imported, or None: required fields missing, keys that do
    not follow from its configuration and seed, or values that are not its curves' at its best round."""
    from gflbench.experiments.records import best_round, config_key_of, per_client_best, run_key_of_record

    if not isinstance(record, dict):
        return "not a run record (not a JSON object)"
    missing = [f for f in REQUIRED_FIELDS if record.get(f) is None]
    if missing:
        return f"not a run record (no {', '.join(missing)})"
    config = record["config"]
    if not isinstance(config, dict) or record["status"] not in ("ok", "failed"):
        return "not a run record (its config is not an object, or its status is neither ok nor failed)"
    for name in ("method", "data_seed", "protocol"):
        if name in config and name in record and config[name] != record[name]:
            return f"its {name} {record[name]!r} is not its config's {config[name]!r}"
    if config_key_of(config) != record["config_key"]:
        return f"its config key {record['config_key']} is not the key of its config ({config_key_of(config)})"
    key = run_key_of_record(record, record["config_key"])
    if key != record["run_key"]:
        where = f"{record['dataset']} {record['scheme']}-{record['clients']} and seed {record['seed']}"
        return f"its run key {record['run_key']} does not follow from its config, {where} (that run's key is {key})"
    if record["status"] == "failed":
        return None if record.get("error") else "a failed run without its error"
    missing = [f for f in _OK_FIELDS if record.get(f) is None]
    if missing:
        return f"a finished run without {', '.join(missing)}"
    curves, clients = record["curves"], record["client_curves"]
    try:
        best = best_round([math.nan if v is None else v for v in curves["val"]])
        if best != record["best_round"]:
            return f"its best round {record['best_round']} is not its validation curve's best round ({best})"
        for name in ("val", "test", "val_weighted", "test_weighted"):
            if curves[name][best] != record[name]:
                return (
                    f"its {name} {record[name]} is not its curve's value at its best round {best} "
                    f"({curves[name][best]})"
                )
        for name in ("val", "test"):
            defined = [v for v in clients[name][best] if v is not None]
            mean = sum(defined) / len(defined) if defined else None
            if mean is None or abs(mean - record[name]) > _MEAN_TOLERANCE:
                return f"its {name} {record[name]} is not the mean of its client curves at round {best} ({mean})"
        nan = [[math.nan if v is None else v for v in row] for row in clients["val"]]
        chosen = per_client_best(nan, [[math.nan if v is None else v for v in row] for row in clients["test"]])
        for name, value in zip(("val_client_best", "test_client_best"), finite(list(chosen)), strict=True):
            if record.get(name) is not None and record[name] != value:
                return f"its {name} {record[name]} is not what its client curves give ({value})"
    except (KeyError, IndexError, TypeError, ValueError) as error:
        return f"its curves are malformed ({type(error).__name__}: {error})"
    return None
