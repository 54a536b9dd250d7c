"""Protocols: named presets that resolve every method's full configuration in one setting.

A table is honest only when it says how each row was configured, so every run belongs to exactly one
protocol, its record stores the name, and its configuration key includes it: a table of one protocol
can never pick up a run of another (docs/protocol.md, "Protocols").

- `paper`: each method configured as its published numbers were produced. The rows the paper inherits
  from FED-PUB's Table 1 run FED-PUB's code family (2-layer GCN, plain-mean aggregation, regularisers as
  the released code behaves), FedGMC as the paper describes it: their Params defaults. Every other
  baseline runs what its source published (official code or scripts, per dataset where they say so):
  `presets.paper_preset`, read from a data file with each value's source (gfl_bench/experiments/presets.py), which
  may also set the rounds and local epochs.
- `fair`: equal effort. Every method's `search_space` is searched on validation with the same trial
  budget (`gflbench tune`, tuning seeds disjoint from the reporting seeds); the chosen values are read
  from a reviewable JSON file per (dataset, scheme, clients) under the tuned folder.

`--set` values apply on top of either protocol and are part of the resolved configuration.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gflbench.data import partial_path, remove_stale_partials
from gflbench.errors import UserError

PROTOCOLS = {
    "paper": "each method as the paper's numbers were produced, with its source's code and defaults",
    "fair": "every method tuned on validation with the same trial budget",
}
DEFAULT_PROTOCOL = "paper"
FEATURE_NORM_KEY = "feature_norm"  # a preset's (or `--set`'s) feature normalisation, RunSpec.feature_norm
TUNED_ENV = "GFLBENCH_TUNED"
DEFAULT_TUNED_DIR = Path("results") / "tuned"


class MissingTuning(UserError):
    """`fair` asked for a setting that `gflbench tune` has not chosen values for."""


def check_protocol(name: str) -> str:
    if name not in PROTOCOLS:
        raise UserError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    return name


def tuned_dir(path: Path | None = None) -> Path:
    """Where `fair`'s chosen values live: the given folder, else $GFLBENCH_TUNED, else results/tuned."""
    if path is not None:
        return Path(path)
    return Path(os.environ[TUNED_ENV]) if os.environ.get(TUNED_ENV) else DEFAULT_TUNED_DIR


def tuned_file(folder: Path, dataset: str, scheme: str, clients: int) -> Path:
    return Path(folder) / f"{dataset}-{scheme}-{clients}.json"


def read_tuned(folder: Path, dataset: str, scheme: str, clients: int) -> dict[str, Any]:
    """The tuned file of one setting ({} when absent); a damaged file, or one made for another setting
    (copied or renamed from another setting's name), is an error naming it."""
    path = tuned_file(folder, dataset, scheme, clients)
    if not path.exists():
        return {}
    return copy.deepcopy(_tuned_version(path, dataset, scheme, clients)[0])


def _tuned_version(path: Path, dataset: str, scheme: str, clients: int) -> tuple[dict[str, Any], str]:
    """The parsed file and its sha256, after checking that the setting it names is the one asked for."""
    stat = path.stat()
    content, sha256 = _parse_tuned(str(path), stat.st_mtime_ns, stat.st_size)
    claimed = (content.get("dataset"), content.get("scheme"), content.get("clients"))
    if claimed != (dataset, scheme, clients):
        raise UserError(
            f"{path} holds tuned values for {claimed[0]} {claimed[1]}-{claimed[2]}, not {dataset} {scheme}-{clients}: "
            f"tuned values hold for their own setting only; run `gflbench tune` for this one"
        )
    return content, sha256


@functools.lru_cache(maxsize=64)
def _parse_tuned(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], str]:
    """Parsed once per file version: a table resolves every cell's configuration through this file.
    The sha256 is of the bytes parsed, so a record names exactly the version its values came from."""
    try:
        raw = Path(path).read_bytes()
        content = json.loads(raw)
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read the tuned values {path}: {error}; rerun `gflbench tune` for it") from None
    if not isinstance(content, dict) or not isinstance(content.get("methods"), dict):
        raise UserError(f"{path} is not a gflbench tuned-values file; rerun `gflbench tune` for it")
    return content, hashlib.sha256(raw).hexdigest()


def tuned_source(
    protocol: str, dataset: str, scheme: str, clients: int, folder: Path | None = None
) -> tuple[str | None, str | None]:
    """The tuned file a protocol's values came from and its sha256, for the run record; (None, None) under
    `paper`, which reads no tuned file."""
    if protocol != "fair":
        return None, None
    path = tuned_file(tuned_dir(folder), dataset, scheme, clients)
    return str(path), _tuned_version(path, dataset, scheme, clients)[1]


def write_tuned(folder: Path, dataset: str, scheme: str, clients: int, method: str, entry: Mapping[str, Any]) -> Path:
    """Set one method's entry in the setting's file, atomically (a kill leaves the old file or the new one).

    Several `gflbench tune` processes may tune methods of one setting at once: the read-modify-write
    holds an OS lock on the folder, so no process writes over an entry another has just added."""
    path = tuned_file(folder, dataset, scheme, clients)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder_handle = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder_handle, fcntl.LOCK_EX)  # released with the handle, or by the kernel if the process dies
        content = read_tuned(folder, dataset, scheme, clients) or {
            "dataset": dataset, "scheme": scheme, "clients": clients, "methods": {},
        }  # fmt: skip
        content["methods"][method] = dict(entry)
        content["methods"] = dict(sorted(content["methods"].items()))
        remove_stale_partials(path.parent)  # what a `tune` killed while writing left behind
        partial = partial_path(path)
        partial.write_text(json.dumps(content, indent=2, sort_keys=False) + "\n")
        os.replace(partial, path)
    finally:
        os.close(folder_handle)
    return path


def tune_command(method: str, dataset: str, scheme: str, clients: int) -> str:
    return f"gflbench tune --method {method} --dataset {dataset} --partition {scheme} --clients {clients}"


def protocol_values(
    protocol: str, method: type, dataset: str, scheme: str, clients: int, folder: Path | None = None
) -> dict[str, str]:
    """The `key=value` settings a protocol gives one method's Params in one setting, as `--set` strings."""
    from gflbench.core.method import resolve_params  # here, not above: the CLI reads this module's names without torch
    from gflbench.experiments.presets import RUN_KEYS, paper_preset

    check_protocol(protocol)
    preset = {
        key: value for key, value in paper_preset(method, dataset, scheme, clients).items() if key not in RUN_KEYS
    }
    if protocol == "paper":
        return preset
    entry = read_tuned(tuned_dir(folder), dataset, scheme, clients).get("methods", {}).get(method.name)
    if entry is None:
        raise MissingTuning(
            f"protocol fair has no tuned values for {method.name} on {dataset} {scheme}-{clients}; "
            f"run `{tune_command(method.name, dataset, scheme, clients)}` first"
        )
    path = tuned_file(tuned_dir(folder), dataset, scheme, clients)
    values = entry.get("values") if isinstance(entry, dict) else None
    if not isinstance(values, dict) or not all(isinstance(v, (str, int, float)) for v in values.values()):
        raise UserError(
            f"{path}: the entry of {method.name} needs a 'values' object of numbers and names, not "
            f"{json.dumps(entry)[:80]}; run `{tune_command(method.name, dataset, scheme, clients)}` again"
        )
    tuned = {key: str(value) for key, value in values.items()}
    try:
        resolve_params(method, tuned)
    except UserError as error:
        raise UserError(f"{path}: {error}; run `{tune_command(method.name, dataset, scheme, clients)}` again") from None
    return {**preset, **tuned}  # trials ran on the paper preset


def protocol_schedule(protocol: str, method: type, dataset: str, scheme: str, clients: int) -> dict[str, int]:
    """The rounds and local epochs a protocol sets for one method in one setting ({}: the dataset's schedule).

    Only `paper` sets any, where a method's source trains on its own schedule (FedTAD's and FedGTA's 3 local
    epochs); under `fair` every method runs the dataset's schedule, the same training budget for all."""
    from gflbench.experiments.presets import SCHEDULE_KEYS, paper_preset

    check_protocol(protocol)
    if protocol != "paper":
        return {}
    preset = paper_preset(method, dataset, scheme, clients)
    return {key: int(preset[key]) for key in SCHEDULE_KEYS if key in preset}


def protocol_feature_norm(protocol: str, method: type, dataset: str, scheme: str, clients: int) -> str | None:
    """The feature normalisation a protocol gives one method in one setting (None: the dataset's own).

    Only `paper` sets one, where a source reads the graph without the protocol's row normalisation (FedTAD's code
    loads Planetoid and Amazon with no transform); `fair` runs every method on the same data."""
    from gflbench.experiments.presets import paper_preset

    check_protocol(protocol)
    if protocol != "paper":
        return None
    return paper_preset(method, dataset, scheme, clients).get(FEATURE_NORM_KEY)


def hyperparameter_source(protocol: str, folder: Path | None = None) -> str:
    """One line for a table caption: where the hyperparameters of its rows came from."""
    if protocol == "paper":
        return "hyperparameters: each method's paper or official-code defaults (docs/protocol.md)"
    return (
        f"hyperparameters: tuned on validation with the same trial budget per method "
        f"(`gflbench tune`, tuning seeds disjoint from the reporting seeds; values in {tuned_dir(folder)})"
    )
