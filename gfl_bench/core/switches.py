"""The kinds of switch a method's Params may declare, so that each is handled, and listed, by its kind.

A plain field is a hyperparameter: it changes what is computed, enters the run key, and `gflbench tune` may
search it. Two kinds of field are switches instead, declared with the constructors below:

- `execution_switch`: the same math with another float rounding (FedIIH's `routing_kernel`: edge gathers or
  CSR products). Execution settings belong in gfl_bench/core/execution.py, out of the run key; a switch of this
  kind stays a field only because stored runs were keyed with it (their keys must not change). `gflbench
  table` spans its values in a cell's execution band, as it spans per-client and batched runs.
- `fidelity_switch`: which reading of a source a run follows (the paper's equations or the released code's
  behaviour, an interpretation of an unclear passage). It changes the method computed, so it is in the run
  key like any hyperparameter, but it is no knob to tune: `gflbench methods` lists it apart, with its readings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

KIND = "switch"  # the metadata entry that holds a field's kind
EXECUTION, FIDELITY = "execution", "fidelity"


def execution_switch(default: str, values: Sequence[str]) -> Any:
    """A Params field that picks one of `values`, computations equal up to float rounding."""
    return dataclasses.field(default=default, metadata={KIND: EXECUTION, "values": tuple(values)})


def fidelity_switch(default: Any, readings: str) -> Any:
    """A Params field that picks a reading of the method's source; `readings` says what each value follows."""
    return dataclasses.field(default=default, metadata={KIND: FIDELITY, "readings": readings})


def switches(params: Any, kind: str) -> dict[str, dataclasses.Field[Any]]:
    """The fields of a Params class (or instance) declared as switches of `kind`, by name, in field order."""
    return {f.name: f for f in dataclasses.fields(params) if f.metadata.get(KIND) == kind}
