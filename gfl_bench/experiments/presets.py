"""The `paper` protocol's per-setting values, read from one reviewable data file per method.

Where a method's source publishes values of its own (FedGSP's per-setting config blocks, FedIIH's
appendix tables, FED-PUB's scripts, the official training values of FedTAD, FedGTA and AdaFGL), they
live in `gfl_bench/experiments/presets/<file>.csv` rather than in code, each next to where it was published, so a
reviewer checks a value against its source line by line (docs/protocol.md, "The `paper` preset, value
by value"). A method names its file in `Method.paper_preset_file`; the declaration is what makes a
missing file an error instead of a silently empty preset.

Format: CSV, header `dataset,scheme,clients,key,value,source`, one value per line; lines starting with
`#` are comments (a file says what it holds and why at its top).
- dataset, scheme, clients: the setting a row applies to; `*` in a column means every value of it.
- key: a field of the method's Params, or `rounds` / `local_epochs` (the schedule; `paper` only), or `feature_norm`
  (`row` or `none`: whether the source row-normalises the node features; `paper` only).
- value: as on the command line (`--set key=value`), checked against the field's type and range.
- source: where the value was published (`owner/repo@commit file:line`, or a paper and its section),
  never empty; a value whose source was not found says "source not found" there.
Per key, of the rows that match a setting the one that names it most closely wins: a named dataset
over `*`, then a named scheme, then a named client count. Two rows for one setting and key are an error.

Every check runs when a file is first read, before any run starts: a missing or malformed file is one
UserError naming the file, the line and what is wrong (the CLI prints it and exits 2).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from gflbench.backbones import backbone_class
from gflbench.core.method import Method, resolve_params
from gflbench.data import DATASETS
from gflbench.data.partition import SCHEMES, check_clients
from gflbench.data.registry import check_feature_norm
from gflbench.errors import UserError
from gflbench.experiments.protocol import FEATURE_NORM_KEY

COLUMNS = ("dataset", "scheme", "clients", "key", "value", "source")
SCHEDULE_KEYS = ("rounds", "local_epochs")  # set RunSpec's schedule, not a Params field
RUN_KEYS = (*SCHEDULE_KEYS, FEATURE_NORM_KEY)  # every key that sets a RunSpec field rather than a Params one
EVERY = "*"
PRESET_DIR = Path(__file__).with_name("presets")  # shipped as package data (pyproject.toml)


@dataclass(frozen=True)
class PresetRow:
    """One published value: the setting it applies to (None: every), the key, the value and its source."""

    dataset: str | None
    scheme: str | None
    clients: int | None
    key: str
    value: str
    source: str

    def matches(self, dataset: str, scheme: str, clients: int) -> bool:
        return self.dataset in (None, dataset) and self.scheme in (None, scheme) and self.clients in (None, clients)

    @property
    def rank(self) -> tuple[bool, bool, bool]:
        """How closely the row names its setting; a higher rank wins (dataset before scheme before clients)."""
        return self.dataset is not None, self.scheme is not None, self.clients is not None


def preset_path(file: str) -> Path:
    return PRESET_DIR / file


def read_preset(method: type[Method], file: str) -> tuple[PresetRow, ...]:
    """Every row of a method's preset file, checked; a missing or malformed file is a UserError naming it."""
    path = preset_path(file)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise UserError(
            f"the paper preset file {path} of {method.name} is missing; reinstall gflbench (it ships as package data)"
        ) from None
    return _parse(method, str(path), stat.st_mtime_ns, stat.st_size)


def paper_preset(method: type[Method], dataset: str, scheme: str, clients: int) -> dict[str, str]:
    """The `paper` protocol's values in this setting beyond the method's Params defaults, as `key=value` strings;
    `rounds` and `local_epochs` set the schedule. Read from the method's `paper_preset_file`, or from the preset of
    the method it borrows from (`paper_preset_borrowed`), restricted to the fields it borrows."""
    if method.paper_preset_borrowed is not None:
        source, fields = method.paper_preset_borrowed
        values = paper_preset(source, dataset, scheme, clients)
        return {key: values[key] for key in fields if key in values}
    if method.paper_preset_file is None:
        return {}
    return preset_values(method, method.paper_preset_file, dataset, scheme, clients)


def preset_values(method: type[Method], file: str, dataset: str, scheme: str, clients: int) -> dict[str, str]:
    """The values a method's preset file gives one setting, as `key=value` strings (schedule keys included)."""
    chosen: dict[str, PresetRow] = {}
    for row in read_preset(method, file):
        if row.matches(dataset, scheme, clients) and (row.key not in chosen or row.rank > chosen[row.key].rank):
            chosen[row.key] = row
    return {key: row.value for key, row in chosen.items()}


@functools.lru_cache(maxsize=64)
def _parse(method: type[Method], path: str, mtime_ns: int, size: int) -> tuple[PresetRow, ...]:
    """Parsed and checked once per file version: a table resolves every cell's configuration through it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read the paper preset file {path}: {error}") from None
    lines = [
        (number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")
    ]
    if not lines:
        raise UserError(f"paper preset file {path} has no header; it must start with {','.join(COLUMNS)}")
    (header_line, header), *body = lines
    if tuple(next(csv.reader([header]))) != COLUMNS:
        raise UserError(
            f"paper preset file {path}, line {header_line}: the header must be {','.join(COLUMNS)}, got {header!r}"
        )
    rows: list[PresetRow] = []
    seen: dict[tuple[str | None, str | None, int | None, str], int] = {}
    for number, line in body:
        try:
            row = _row(method, next(csv.reader([line])))
        except UserError as error:
            raise UserError(f"paper preset file {path}, line {number}: {error}") from None
        where = (row.dataset, row.scheme, row.clients, row.key)
        if where in seen:
            raise UserError(
                f"paper preset file {path}, line {number}: {row.key} is set for this setting on line {seen[where]} too"
            )
        seen[where] = number
        rows.append(row)
    return tuple(rows)


def _row(method: type[Method], fields: list[str]) -> PresetRow:
    """One checked row: known setting, known key, a value the key's field accepts, a source."""
    if len(fields) != len(COLUMNS):
        raise UserError(f"{len(fields)} fields, expected {len(COLUMNS)} ({','.join(COLUMNS)})")
    dataset, scheme, clients, key, value, source = (field.strip() for field in fields)
    for name, given in zip(COLUMNS, (dataset, scheme, clients, key, value, source)):
        if not given:
            raise UserError(f"the {name} field is empty")
    if dataset != EVERY and dataset not in DATASETS:
        raise UserError(f"unknown dataset {dataset!r}")
    if scheme != EVERY and scheme not in SCHEMES:
        raise UserError(f"unknown partition scheme {scheme!r}; choose from {', '.join(SCHEMES)} or {EVERY}")
    count = None if clients == EVERY else _positive_int("clients", clients)
    if count is not None and scheme != EVERY:
        check_clients(scheme, count)
    _check_value(method, key, value)
    return PresetRow(
        None if dataset == EVERY else dataset, None if scheme == EVERY else scheme, count, key, value, source
    )


def _check_value(method: type[Method], key: str, value: str) -> None:
    if key in SCHEDULE_KEYS:
        _positive_int(key, value)
        return
    if key == FEATURE_NORM_KEY:
        check_feature_norm(value)
        return
    if key not in {field.name for field in dataclasses.fields(method.Params)}:
        raise UserError(f"{method.name} has no parameter {key!r} (nor is it one of {', '.join(RUN_KEYS)})")
    resolve_params(method, {key: value})  # the field's type and declared range, as `--set` checks them
    if key == "backbone":
        backbone_class(value)


def _positive_int(name: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise UserError(f"{name} must be a whole number, got {text!r}") from None
    if number < 1:
        raise UserError(f"{name} must be at least 1, got {number}")
    return number
