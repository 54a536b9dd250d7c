"""Records stored before a hyperparameter existed, brought up to the keys today's code computes.

A run key hashes every field of a method's Params (`RunSpec.config`). When a field is added after runs of its
method were stored, those runs' configurations lack it, so their keys are not the keys today's specs give: the
stored runs would be orphaned, or worse, read at today's default when they ran with another value. Each such
field is listed here with the value every earlier run computed with; `upgrade_record` fills it into a record that
lacks it and recomputes the record's config and run keys. The store does it once to every stored run (schema 4,
gfl_bench/experiments/store/schema.py), `gflbench import` to every record it reads, and the committed record files
were rewritten with it, so a key always includes every field. Plain values only (no torch): the importer uses it.

A field belongs here only when its listed value computes exactly what the earlier runs computed. Adding an entry
needs a new store schema version (`store.schema.SCHEMA_VERSION`), so that every store is upgraded again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gflbench.experiments.records import config_key_of, run_key_of_record

# method -> {field: the value every run stored before the field existed computed with}
FIELDS_ADDED: Mapping[str, Mapping[str, Any]] = {
    # the routing kernel became a switch after the Planetoid cells were run, all with the gather
    # (docs/baselines/fediih.md, "Kernel check")
    "fediih": {"routing_kernel": "gather"},
    # every AdaFGL run before the selection switch kept each client's best stage-2 epoch (docs/baselines/adafgl.md)
    "adafgl": {"keep_best_epoch": True},
}

# The store schema whose migration applies FIELDS_ADDED as it stands; written into each upgraded record's history.
UPGRADE_SCHEMA = 4


def upgrade_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` with every field of FIELDS_ADDED it lacks filled in at the value its run had, and its config key and
    run key recomputed; the keys it had are kept in its `upgrades` list (with the fields filled and the schema), so
    a reader can follow an old file's key to the new one. A record that lacks none is returned as it is (a copy)."""
    params = record["config"]["params"]
    filled = {name: value for name, value in FIELDS_ADDED.get(record["method"], {}).items() if name not in params}
    if not filled:
        return dict(record)
    config = {**record["config"], "params": {**params, **filled}}
    config_key = config_key_of(config)
    run_key = run_key_of_record(record, config_key)
    history = {"schema": UPGRADE_SCHEMA, "filled": filled, "run_key": record["run_key"],
               "config_key": record["config_key"]}  # fmt: skip
    return {**record, "config": config, "config_key": config_key, "run_key": run_key,
            "upgrades": [*record.get("upgrades", []), history]}  # fmt: skip
