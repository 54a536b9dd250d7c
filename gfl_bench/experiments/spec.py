"""RunSpec: everything that determines one run's numbers, and the keys derived from it.

The run key is a hash of the method, the protocol, its fully resolved hyperparameters, the schedule,
the data seed, the dataset, the partition and the run seed. Equal keys mean "the same experiment", so
the store skips a run whose key it holds and `gflbench table` finds exactly the runs that `gflbench
run` with the same options produces. The protocol name is part of the key, so tables of one protocol
never mix in another's runs. HARNESS_VERSION enters every key: bump it when a change to the harness
changes numbers, and old records stop matching instead of being mixed in silently.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gflbench.backbones import backbone_class
from gflbench.core.method import MethodParams, method_class, resolve_params
from gflbench.core.switches import EXECUTION, switches
from gflbench.data import dataset_spec
from gflbench.data.partition import DEFAULT_DATA_SEED, check_clients, check_data_seed
from gflbench.data.registry import check_feature_norm
from gflbench.errors import UserError
from gflbench.experiments.protocol import (
    DEFAULT_PROTOCOL,
    FEATURE_NORM_KEY,
    protocol_feature_norm,
    protocol_schedule,
    protocol_values,
    tuned_source,
)
from gflbench.experiments.records import config_key_of, run_key_of
from gflbench.experiments.upgrades import upgrade_record

HARNESS_VERSION = 2  # 2: protocols (paper defaults: GCN baselines, plain mean, FED-PUB code regularisers)


@dataclass(frozen=True)
class RunSpec:
    method: str
    params: MethodParams
    dataset: str
    scheme: str
    clients: int
    seed: int
    rounds: int
    local_epochs: int
    data_seed: int = DEFAULT_DATA_SEED
    protocol: str = DEFAULT_PROTOCOL
    # The fraction F of clients taking part in each round (docs/protocol.md, "Partial participation"); in the
    # run key, as the partition is, only when below 1.
    participation: float = 1.0
    # The features' normalisation when not the dataset's own ("none" where a `paper` source reads them unnormalised;
    # docs/protocol.md, "Feature normalisation"); None: the dataset's. In the configuration only when set, so the
    # keys of every run on the dataset's own features stay what they were before the field existed.
    feature_norm: str | None = None
    # Where `fair`'s values came from (the tuned file and its sha256), for the record: not in any key.
    tuned_file: str | None = field(default=None, compare=False)
    tuned_sha256: str | None = field(default=None, compare=False)

    def config(self) -> dict[str, Any]:
        """The resolved configuration shared by every seed and partition of this method on this dataset."""
        config = {
            "method": self.method,
            "params": dataclasses.asdict(self.params),  # every field: records stored before one existed are upgraded
            "rounds": self.rounds,
            "local_epochs": self.local_epochs,
            "data_seed": self.data_seed,
            "protocol": self.protocol,
            "harness": HARNESS_VERSION,
        }
        return config if self.feature_norm is None else {**config, FEATURE_NORM_KEY: self.feature_norm}

    @property
    def config_key(self) -> str:
        return config_key_of(self.config())

    @property
    def run_key(self) -> str:
        return run_key_of(self.config_key, self.dataset, self.scheme, self.clients, self.seed, self.participation)


def spec_of_record(record: Mapping[str, Any]) -> RunSpec:
    """The spec a stored record was computed from: its configuration's values, a field the record predates at the
    value its run had (`upgrades.upgrade_record`; the store and `gflbench import` have already applied it), and any
    other field it lacks at its default.

    Its run key is the (upgraded) record's: tests/test_spec_keys.py holds every committed record to that, so a
    change to how keys are computed that would orphan stored runs fails there. A record of another harness
    version, or of a method or field this package lacks, is a UserError."""
    record = upgrade_record(record)
    config = record["config"]
    if config.get("harness") != HARNESS_VERSION:
        raise UserError(f"run {record['run_key']} was computed by harness version {config.get('harness')}, "
                        f"this one is {HARNESS_VERSION}")  # fmt: skip
    method_cls = method_class(record["method"])
    try:
        params = method_cls.Params(**config["params"])
    except TypeError as error:
        raise UserError(f"run {record['run_key']}: its parameters do not fit {record['method']}'s ({error})") from None
    return RunSpec(record["method"], params, record["dataset"], record["scheme"], record["clients"], record["seed"],
                   config["rounds"], config["local_epochs"], config["data_seed"], config["protocol"],
                   record.get("participation", 1.0), config.get(FEATURE_NORM_KEY))  # fmt: skip


def execution_variants(spec: RunSpec) -> dict[str, str]:
    """Config key -> label of every configuration that computes `spec`'s run with other execution switches
    (gfl_bench/core/switches.py: FedIIH's routing kernel), `spec`'s own included: the same experiment up to float
    rounding, under another run key only because stored runs were keyed with the switch. The label names
    the switches' values (`routing_kernel=sparse`); empty for a method without such switches."""
    fields = switches(spec.params, EXECUTION)
    choices = [[(name, value) for value in field.metadata["values"]] for name, field in fields.items()]
    variants = {}
    for chosen in itertools.product(*choices):
        params = dataclasses.replace(spec.params, **dict(chosen))
        label = " ".join(f"{name}={value}" for name, value in chosen)
        variants[dataclasses.replace(spec, params=params).config_key] = label
    return variants


def make_spec(
    method: str,
    dataset: str,
    scheme: str,
    clients: int,
    seed: int,
    overrides: Mapping[str, str] | None = None,
    rounds: int | None = None,
    local_epochs: int | None = None,
    data_seed: int = DEFAULT_DATA_SEED,
    protocol: str = DEFAULT_PROTOCOL,
    tuned: Path | None = None,
    shared_schedule: bool = False,
    participation: float = 1.0,
) -> RunSpec:
    """Resolve names, the protocol's values and `overrides` (on top) into a RunSpec.

    Rounds and local epochs: `rounds` / `local_epochs` if given, else the protocol's for this method
    (`paper` runs a source's own schedule, FedTAD's 3 local epochs), else the dataset's; `shared_schedule`
    skips the protocol's (the trials of `gflbench tune`, which run at `fair`'s schedule, the dataset's).
    Feature normalisation likewise: `feature_norm=...` among `overrides` (`--set feature_norm=none`), else the
    protocol's (FedTAD's `paper` source reads features unnormalised), else the dataset's; the dataset's is None.
    Every bad input raises UserError here, before any work; so does `fair` without tuned values, and a
    `participation` outside (0, 1].
    """
    method_cls = method_class(method)
    data = dataset_spec(dataset)
    check_clients(scheme, clients)
    check_data_seed(data_seed)
    preset = protocol_values(protocol, method_cls, dataset, scheme, clients, tuned)
    tuned_file, tuned_sha256 = tuned_source(protocol, dataset, scheme, clients, tuned)
    schedule = {} if shared_schedule else protocol_schedule(protocol, method_cls, dataset, scheme, clients)
    params_overrides = dict(overrides or {})
    if FEATURE_NORM_KEY in params_overrides:
        feature_norm: str | None = params_overrides.pop(FEATURE_NORM_KEY)
    else:
        feature_norm = (
            None if shared_schedule else protocol_feature_norm(protocol, method_cls, dataset, scheme, clients)
        )
    if feature_norm is not None:
        check_feature_norm(feature_norm)
    params = resolve_params(method_cls, {**preset, **params_overrides})
    backbone_class(params.backbone)
    for name, value in (("rounds", rounds), ("local epochs", local_epochs)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    spec = RunSpec(
        method=method,
        params=params,
        dataset=dataset,
        scheme=scheme,
        clients=clients,
        seed=seed,
        rounds=rounds or schedule.get("rounds", data.rounds),
        local_epochs=local_epochs or schedule.get("local_epochs", data.local_epochs),
        data_seed=data_seed,
        protocol=protocol,
        feature_norm=None if feature_norm == data.feature_norm else feature_norm,
        tuned_file=tuned_file,
        tuned_sha256=tuned_sha256,
    )
    return at_participation(spec, participation)


def at_participation(spec: RunSpec, participation: float) -> RunSpec:
    """`spec` with `participation` clients per round, checked: in (0, 1], and, below 1, a method that can run
    with absent clients (`Method.needs_every_client`); a UserError otherwise. Commands that plan their specs
    elsewhere (`gflbench sweep`'s grids) set the fraction with it."""
    check_participation(participation)
    reason = method_class(spec.method).needs_every_client
    if participation < 1 and reason:
        raise UserError(f"{spec.method} cannot run with --participation below 1: {reason}")
    return dataclasses.replace(spec, participation=participation)


def check_participation(participation: float) -> None:
    """A fraction of clients per round must be in (0, 1]; NaN is not."""
    if not 0 < participation <= 1:
        raise UserError(f"--participation must be in (0, 1], got {participation}")


def parse_overrides(items: list[str], methods: list[str]) -> dict[str, dict[str, str]]:
    """`--set method.key=value` (or `key=value` for every chosen method) into per-method dicts."""
    result: dict[str, dict[str, str]] = {m: {} for m in methods}
    for item in items:
        target, sep, value = item.partition("=")
        if not sep or not target:
            raise UserError(f"--set expects method.key=value or key=value, got {item!r}")
        name, dot, key = target.rpartition(".")
        chosen = [name] if dot else methods
        if dot and name not in result:
            raise UserError(f"--set {item!r} names method {name!r}, which is not among {', '.join(methods)}")
        for m in chosen:
            result[m][key] = value
    return result
