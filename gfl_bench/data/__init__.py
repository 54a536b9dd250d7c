"""The eleven benchmark graphs (and `tiny`), loaded through PyG's and OGB's own dataset classes.

Preprocessing follows the FED-PUB/FedIIH protocol the paper builds on (docs/protocol.md):
undirected, largest connected component, row-normalised features for Planetoid and Amazon.
Raw files come from PyG's download, or from an offline mirror in PyG's raw layout
(`GFLBENCH_RAW_MIRROR`) that is copied into the writable data directory first, because PyG writes
`processed/` next to `raw/`.

Nothing on disk is trusted for its name or size (docs/architecture.md, "Identity checks"): a raw file is
compared by sha256 with the published file where its checksum is known (`RAW_CHECKSUMS`), else with the
mirror's copy; PyG's processed file is checked against the fingerprint of its features, labels and edges
written beside it when it was built, and rebuilt from the raw files when it differs.

One job per module: `registry` (names, titles, schedules; what the CLI reads at start), `raw` (mirror copies
and published checksums), `fingerprint`, `loading` (`load_dataset`), `pyg` (PyG/OGB classes, preprocessing),
`synthetic` (`tiny_graph`), `partials` (atomic writes, used across gflbench) and `verbosity` (`--verbose`).
No module imports torch or PyG at import time: a dataset's name, title and sizes need neither.
"""

from gflbench.data.fingerprint import FINGERPRINT_FILE, data_fingerprint
from gflbench.data.loading import load_dataset
from gflbench.data.partials import partial_path, remove_stale_partials
from gflbench.data.pyg import preprocess
from gflbench.data.raw import RAW_CHECKSUMS, RawChecksum, is_available, missing_raw_files
from gflbench.data.registry import (
    DATA_DIR_ENV,
    DATASETS,
    RAW_MIRROR_ENV,
    DatasetSpec,
    dataset_spec,
    default_data_dir,
)
from gflbench.data.synthetic import tiny_graph
from gflbench.data.verbosity import VERBOSE_ENV, quiet_libraries, say_verbose

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "FINGERPRINT_FILE",
    "RAW_CHECKSUMS",
    "RAW_MIRROR_ENV",
    "VERBOSE_ENV",
    "DatasetSpec",
    "RawChecksum",
    "data_fingerprint",
    "dataset_spec",
    "default_data_dir",
    "is_available",
    "load_dataset",
    "missing_raw_files",
    "partial_path",
    "preprocess",
    "quiet_libraries",
    "remove_stale_partials",
    "say_verbose",
    "tiny_graph",
]
