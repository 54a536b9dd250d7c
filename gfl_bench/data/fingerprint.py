"""A graph's fingerprint (its features, labels and edges), and the file beside PyG's processed file that records
it together with the raw files the processed file was built from."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gflbench.data.partials import partial_path, remove_stale_partials

if TYPE_CHECKING:  # torch and PyG are imported where a graph is built
    from torch_geometric.data import Data

FINGERPRINT_FILE = "gflbench-fingerprint.json"  # beside PyG's processed file: raw sha256s and data_fingerprint


def data_fingerprint(graph: Data) -> str:
    """sha256 of a graph's features, labels and edges (dtype, shape and bytes of each).

    Beside PyG's processed file it tells a damaged file from an intact one (torch's zip reader does not
    check CRCs, so changed bytes load as other numbers); in a run record it names the data the run saw,
    which the run key does not cover, so stores made from two data folders can be told apart.
    """
    digest = hashlib.sha256()
    for name in ("x", "y", "edge_index"):
        tensor = graph[name].detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def read_fingerprint(processed: Path) -> dict | None:
    try:
        recorded = json.loads((processed / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def write_fingerprint(processed: Path, raw: dict[str, str], data: Data) -> None:
    remove_stale_partials(processed)
    target = processed / FINGERPRINT_FILE
    partial = partial_path(target)
    partial.write_text(json.dumps({"raw": raw, "data": data_fingerprint(data)}, indent=1, sort_keys=True) + "\n")
    os.replace(partial, target)
