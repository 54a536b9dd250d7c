"""Local: every client trains on its own subgraph and nothing is exchanged (paper B.5).

Default backbone the 2-layer GCN + classifier of FED-PUB's code. Paper B.6 says Local shares FedGMC's
backbone, but the paper's Local row equals FED-PUB's Table 1, produced on the GCN (docs/protocol.md,
"Where the paper contradicts its numbers"); `--set local.backbone=h2gcn-tanh` gives B.6's reading.
Training runs on the same round schedule as the federated methods, so the best-validation-round rule
selects over the same checkpoints (protocol §1.3; research notes §2.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gflbench.core.method import (
    BACKBONE_SEARCH_SPACE,
    SHARED_SEARCH_SPACE,
    Message,
    Method,
    MethodParams,
    Round,
    Server,
)
from gflbench.core.training import TrainingClient


@dataclass(frozen=True)
class LocalParams(MethodParams):
    search_space = {**SHARED_SEARCH_SPACE, **BACKBONE_SEARCH_SPACE}

    backbone: str = "gcn"  # FED-PUB's GCN, on which the paper's Local row was produced


class LocalClient(TrainingClient):
    """Trains alone: receives nothing, uploads nothing (TrainingClient's defaults)."""


class LocalServer(Server):
    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        return {cid: {} for cid in client_ids}

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        """Nothing arrives and nothing is kept."""


class Local(Method):
    name = "local"
    title = "Local"
    summary = "no communication; each client trains alone"
    Params = LocalParams
    client = LocalClient
    server = LocalServer
