"""Build a method's server and clients by hand, the way the runner does, for tests that drive rounds themselves."""

from __future__ import annotations

import copy

import torch

from gflbench.backbones import build_backbone
from gflbench.core.method import Method, MethodParams, Server, Setup
from gflbench.experiments.runner import FederatedData


def build_parties(
    method: type[Method],
    params: MethodParams,
    federation: FederatedData,
    rounds: int,
    device: torch.device | None = None,
) -> tuple[Server, list]:
    """One seeded initial model on the method's backbone, copied to the server and to every client."""
    device = device or torch.device("cpu")
    graphs = federation.on_device(params, device)
    setup = Setup(federation.num_features, federation.num_classes, len(graphs), rounds, 1, device, 0)
    torch.manual_seed(0)
    template = build_backbone(params, setup.num_features, setup.num_classes).to(device)  # as the runner does
    server = method.server(copy.deepcopy(template), params, setup)
    clients = [method.client(i, g, copy.deepcopy(template), params, setup) for i, g in enumerate(graphs)]
    return server, clients
