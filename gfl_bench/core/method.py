"""The Method contract: a federated method is a Client, a Server and a Params dataclass.

One communication round (the engine, gfl_bench/core/rounds.py, drives it; docs/architecture.md maps every hook):

    for stage in range(server.stages(round)):
        downloads = server.configure(rnd, client_ids)      # server -> each client
        uploads   = {cid: client.fit(rnd, downloads[cid])}  # local work, client -> server
        server.aggregate(rnd, uploads)
    evaluate client.predict() for every client              # the model right after local training

Client and server share nothing but messages: dicts whose leaves are tensors. The exchange
(gfl_bench/core/exchange.py) copies every message in both directions and counts its bytes, so no method
can alias another party's state or send something unmetered. Methods with more than one exchange per round (FedSage+'s
generator training, two-stage methods) return `stages > 1`; most use one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch_geometric.data import Data

from gflbench.backbones import Backbone
from gflbench.errors import UserError

Message = dict[str, Any]  # leaves: tensors; containers: dict, list, tuple


@dataclass(frozen=True)
class Space:
    """The range `gflbench tune` searches for one hyperparameter (Optuna's distributions by name).

    kind: "log" (log-uniform float in [low, high]), "float" (uniform in [low, high]), "int" (integers
    in [low, high]) or "choice" (one of `choices`).
    """

    kind: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()

    def describe(self) -> str:
        if self.kind == "choice":
            return "{" + ", ".join(str(c) for c in self.choices) + "}"
        return f"{'log ' if self.kind == 'log' else ''}[{self.low:g}, {self.high:g}]"


def log_range(low: float, high: float) -> Space:
    return Space("log", low, high)


def float_range(low: float, high: float) -> Space:
    return Space("float", low, high)


def int_range(low: int, high: int) -> Space:
    return Space("int", low, high)


def choice(*values: Any) -> Space:
    return Space("choice", choices=tuple(values))


@dataclass(frozen=True)
class Bound:
    """The valid range of one numeric hyperparameter; `resolve_params` rejects values outside it."""

    low: float | None = None  # None: unbounded below
    high: float | None = None  # None: unbounded above
    low_open: bool = False  # True: the value must be > low (else >= low)
    high_open: bool = False  # True: the value must be < high (else <= high)

    def admits(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return " and ".join(parts) or "finite"


def positive() -> Bound:
    return Bound(0, low_open=True)


def non_negative() -> Bound:
    return Bound(0)


def at_least(low: float) -> Bound:
    return Bound(low)


def unit_interval(high_open: bool = False) -> Bound:
    return Bound(0, 1, high_open=high_open)


# The optimiser and width every method shares; the `fair` protocol tunes them for every method with
# one budget (docs/protocol.md, "fair"). Weight decay reaches 5e-4, OpenFGL's default.
SHARED_SEARCH_SPACE: Mapping[str, Space] = {
    "lr": log_range(1e-3, 1e-1),
    "weight_decay": log_range(1e-7, 1e-3),
    "dropout": float_range(0.0, 0.7),
    "hidden": choice(64, 128, 256),
}
# Generic methods run on any backbone; `fair` lets them use FedGMC's, so none is handicapped by a weaker network.
BACKBONE_SEARCH_SPACE: Mapping[str, Space] = {"backbone": choice("gcn", "h2gcn-tanh")}


@dataclass(frozen=True)
class MethodParams:
    """Hyperparameters every method has; a method extends this with its own fields.

    Defaults follow the FED-PUB protocol (hidden 128, Adam lr 0.01, weight decay 1e-6, dropout 0.5)
    and the paper's B.6 ("the same embedding dimension, optimizer settings, and learning rate").
    `search_space` is what `gflbench tune` searches: the shared keys plus the method's own.
    """

    search_space: ClassVar[Mapping[str, Space]] = SHARED_SEARCH_SPACE
    # Valid ranges; a subclass declares only its own fields' (`valid_ranges` merges them along the MRO).
    bounds: ClassVar[Mapping[str, Bound]] = {
        "hidden": at_least(1), "lr": positive(), "weight_decay": non_negative(), "dropout": unit_interval(high_open=True),
    }  # fmt: skip
    backbone: str = "gcn"
    hidden: int = 128
    lr: float = 0.01
    weight_decay: float = 1e-6
    dropout: float = 0.5


@dataclass(frozen=True)
class Setup:
    """What every party knows about the federation before it starts: public facts, no client data."""

    num_features: int
    num_classes: int
    num_clients: int
    rounds: int
    local_epochs: int
    device: torch.device
    seed: int


@dataclass(frozen=True)
class Round:
    index: int  # 0-based communication round
    stage: int = 0  # exchange within the round, for methods with `stages > 1`


class Client(ABC):
    """One federation participant. It holds its private graph; only `fit`'s return value leaves it.

    The engine builds one per client id at the run's start, each with its own graph, its own deep copy
    of the common initial model, the resolved Params and the public `Setup`; it lives for the whole run."""

    def __init__(self, cid: int, graph: Data, model: Backbone, params: MethodParams, setup: Setup) -> None:
        self.cid = cid
        self.graph = graph
        self.model = model
        self.params = params
        self.setup = setup

    @abstractmethod
    def fit(self, rnd: Round, message: Message) -> Message:
        """Receive the server's message, do the local work, return what is uploaded.

        Called by the per-client executor (gfl_bench/core/exchange.py) once per exchange (`Server.stages`), for
        every client in id order, with this client's own copy of the entry `configure` made for it: it
        may keep and change its tensors. The returned message is cloned and counted as it leaves, so it
        may hold the client's own tensors (its model's weights); tensors only, in dicts, lists, tuples.
        Whatever the server must know arrives here: a key left out is a key the server does not get."""

    @classmethod
    def _batches(cls) -> bool:
        """Whether the batched executor can compute this client's local step (a `TrainingClient`'s may)."""
        return False

    @torch.no_grad()
    def predict(self) -> Tensor:
        """Logits `[N, C]` for every local node from the model this client would deploy now.

        The per-client executor calls it once per round after the round's last exchange, clients in id
        order, with gradients off; its validation and test rows are scored. The batched executor scores
        one batched forward of the clients' models instead, so a client that overrides it runs per client
        (`Method.batchable`). Default: the client's model in eval mode on its own graph."""
        self.model.eval()
        return self.model(self.graph)


class Server(ABC):
    """The coordinator. It starts from the common initial model and sees only uploaded messages.

    Per round, the runner asks `stages` once; per stage it calls `configure`, then every client's local
    work (gfl_bench/core/exchange.py), then `aggregate`; after the last stage, `diagnostics` once and, at the
    rounds asked for, `snapshot`. Every client takes part in every exchange, unless the run samples clients
    (`--participation`): then only the round's sampled ids are configured and uploaded, the same in every stage. The server's own random
    draws happen inside the run's random streams, so a run stepped with others draws what it draws alone.
    """

    def __init__(self, model: Backbone, params: MethodParams, setup: Setup) -> None:
        self.model = model
        self.params = params
        self.setup = setup

    def stages(self, rnd_index: int) -> int:
        """How many configure/fit/aggregate exchanges round `rnd_index` (0-based) has; default 1.

        Asked once per round, before its first exchange; the stages are `Round(rnd_index, 0..n-1)`."""
        return 1

    @abstractmethod
    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        """The message each client receives at the start of this exchange, by client id.

        Called once per exchange, before any client works, with the ids taking part in ascending order
        (every id, `list(range(num_clients))`, unless the run samples clients). Every id must get an entry (one without is an error: the run stops);
        an empty dict sends nothing. Entries may share tensors, and one dict may serve every client: the
        exchange gives each client its own copy, so a client can never change the server's tensors."""

    @abstractmethod
    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        """Update the server state from the clients' uploads.

        Called once per exchange, after the local work, with one upload per client id taking part, in
        ascending id order (iterate `uploads.values()` for that order). The uploads are the server's own
        copies: it may keep them across rounds. Keys a client left out of its message are simply absent."""

    def diagnostics(self) -> dict[str, float]:
        """Scalars recorded per round in the run record (e.g. FedGMC's anchor equiangularity); default none.

        Called once per round after its last `aggregate`, before evaluation. Give the same keys every
        round: the record keeps one list per key, and a key missing in a round would misalign its list."""
        return {}

    def global_model(self, cid: int) -> dict[str, Tensor] | None:
        """The whole weights of the global (or cluster) model client `cid` would start its next round from,
        by parameter name, loadable into the client's backbone; None: the method has no such model (only
        personalised ones, or shared layers without a head). Default None.

        Called once per round after `diagnostics`, for every client id: the engine scores it on each client's
        validation and test nodes, the "global model before local training" reading (docs/protocol.md,
        "Evaluation modes"). It must not change the server."""
        return None

    def snapshot(self) -> dict[str, Any]:
        """Server state worth saving at chosen rounds for case studies (`--snapshot-rounds`); default none.

        Called after `diagnostics`, only at the rounds asked for, and written with `torch.save`, so move
        tensors to the CPU. Not called at all in runs without snapshots: it must not change the server."""
        return {}


class Method:
    """Registration record: names, hyperparameters and the two parties of one method.

    Read by the registry (`all_methods`, once per process) and by the runner, which builds one `server`
    and, per client id, one `client`, each with its own deep copy of one seeded initial model. Nothing
    here is called per round; the experiment layer reads `paper_preset_file` (gflbench.experiments.presets) and asks
    `equivalent` (tables) before or after runs."""

    name: ClassVar[str]  # CLI name
    title: ClassVar[str]  # row name in the paper's tables
    summary: ClassVar[str]  # one line: what is shared
    Params: ClassVar[type[MethodParams]] = MethodParams
    client: ClassVar[type[Client]]
    server: ClassVar[type[Server]]
    # Derived, never declared (`__init_subclass__`): True when the client's local step is made of the hooks the
    # batched executor calls (gfl_bench/core/training.py:TrainingClient._batches), so `--batched` may train all
    # clients at once (gfl_bench/core/batched.py) in every stage where their `trains_locally` says so.
    batchable: ClassVar[bool] = False
    # The file under gfl_bench/experiments/presets/ with the values its source published beyond the Params defaults
    # (gfl_bench/experiments/presets.py); None: the defaults are the whole `paper` configuration. Declared here so
    # that a missing file is an error rather than a silently empty preset.
    paper_preset_file: ClassVar[str | None] = None
    # (another method, the fields taken from its preset) for a method that borrows another's published values
    # instead of having its own file (FedSSA takes FedICI's UniFilter values); None: it borrows nothing.
    paper_preset_borrowed: ClassVar[tuple[type[Method], tuple[str, ...]] | None] = None
    # (Params field, value as `--set` text) with which the method itself keeps each client's best-validation
    # model (AdaFGL's official per-client best epoch). `--selection per-client` runs and tabulates the method
    # with this value (an explicit --set wins), so that rule applies each method's own per-client selection;
    # every other rule reads the Params as resolved. None: the method selects nothing inside itself.
    per_client_selection: ClassVar[tuple[str, str] | None] = None
    # Why the method cannot run when only some clients take part in a round (`--participation` below 1), in a
    # few words; None: it can, with a client that sits a round out keeping its state (docs/protocol.md,
    # "Partial participation", says what each method does). `make_spec` refuses such runs with this reason.
    needs_every_client: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "batchable" in vars(cls):
            raise TypeError(f"{cls.__name__}: `batchable` is derived from its client's hooks, not declared")
        client = getattr(cls, "client", None)
        cls.batchable = client is not None and client._batches()

    @classmethod
    def equivalent(cls, params: MethodParams, scheme: str, local_epochs: int) -> tuple[str, dict[str, Any]] | None:
        """(method, its full Params as a dict) whose run provably computes the same numbers, if any.

        Tables mark such rows (`≡ FedAvg`) when the other row's configuration equals this dict, so a
        reader sees that a difference between them can only be a difference of configuration.
        """
        return None


ENTRY_POINT_GROUP = "gflbench.methods"  # name = CLI name, value = "module:MethodClass"


@functools.cache
def all_methods() -> dict[str, type[Method]]:
    """Every installed method, by CLI name: the `gflbench.methods` entry points of every installed package.

    The harness knows no method: the project's own baselines and FedGMC register exactly as a
    researcher's plug-in package does (docs/architecture.md, "Write your own method").
    """
    found: dict[str, type[Method]] = {}
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            method = point.load()
        except Exception as error:
            raise UserError(f"the method plug-in {point.name!r} ({point.value}) does not load: {error}") from None
        if not (isinstance(method, type) and issubclass(method, Method)) or method.name != point.name:
            raise UserError(
                f"entry point {point.name!r} = {point.value} must name a Method subclass whose name is {point.name!r}"
            )
        if point.name in found and found[point.name] is not method:
            raise UserError(f"method name {point.name!r} is registered by two packages ({point.value})")
        found[point.name] = method
    return found


def method_class(name: str) -> type[Method]:
    methods = all_methods()
    try:
        return methods[name]
    except KeyError:
        raise UserError(f"unknown method {name!r}; choose from {', '.join(sorted(methods))}") from None


def valid_ranges(params: type[MethodParams]) -> dict[str, Bound]:
    """Every declared range of a Params class, its own and its bases'."""
    merged: dict[str, Bound] = {}
    for klass in reversed(params.__mro__):
        merged.update(vars(klass).get("bounds", {}))
    return merged


def resolve_params(method: type[Method], overrides: Mapping[str, str]) -> MethodParams:
    """The method's defaults with `key=value` overrides applied, each value parsed by its field's type.

    Every numeric value must be finite and inside its declared range: a bad value is one UserError
    naming the key, the value and the range, before any run starts.
    """
    fields = {f.name: f for f in dataclasses.fields(method.Params)}
    defaults = method.Params()
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in fields:
            raise UserError(f"{method.name} has no parameter {key!r}; it has {', '.join(fields)}")
        values[key] = _parse_value(method.name, key, raw, type(getattr(defaults, key)))
    ranges = valid_ranges(method.Params)
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        bound = ranges.get(key, Bound())
        if not math.isfinite(value):  # inf and nan pass or fail a range by accident: say what is wrong with them
            limits = "" if bound == Bound() else f" {bound.describe()}"
            raise UserError(f"{method.name}.{key}={value!r} is out of range: it must be a finite number{limits}")
        if not bound.admits(value):
            raise UserError(f"{method.name}.{key}={value!r} is out of range: it must be {bound.describe()}")
    return dataclasses.replace(defaults, **values)


def _parse_value(method: str, key: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        return kind(raw)
    except ValueError:
        raise UserError(f"{method}.{key} expects {kind.__name__}, got {raw!r}") from None
