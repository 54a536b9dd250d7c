"""`load_dataset`: a benchmark graph from the data directory, its raw files checked and its processed file
checked against its fingerprint, rebuilt from the raw files where it differs.

PyG writes `processed/` next to `raw/`, so raw files from the read-only mirror are copied into the writable
data directory first (`raw.missing_raw_files`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gflbench.data.fingerprint import data_fingerprint, read_fingerprint, write_fingerprint
from gflbench.data.pyg import LOADERS, preprocess
from gflbench.data.raw import missing_raw_files, raw_digests
from gflbench.data.registry import (
    DATA_DIR_ENV,
    RAW_MIRROR_ENV,
    DatasetSpec,
    check_feature_norm,
    dataset_spec,
    default_data_dir,
)
from gflbench.data.synthetic import tiny_graph
from gflbench.data.verbosity import quiet_libraries, say_verbose
from gflbench.errors import UserError

if TYPE_CHECKING:
    from torch_geometric.data import Data


def load_dataset(name: str, data_dir: Path | None = None, feature_norm: str | None = None) -> Data:
    """The preprocessed global graph of `name`: undirected, largest connected component, y of shape [N], its
    features normalised as `feature_norm` asks (registry.FEATURE_NORMS; None: the dataset's own,
    `DatasetSpec.feature_norm`).

    Raw files are checked (`raw.missing_raw_files`, `raw.raw_digests`) and the processed file against its
    fingerprint (`_load_checked`) under a lock per dataset, so that processes sharing a data directory
    never rebuild or replace one dataset's files at the same time. PyG's processed file holds the features as
    read, so both preprocessings come from the same file.
    """
    spec = dataset_spec(name)
    if feature_norm is not None:
        check_feature_norm(feature_norm)
        spec = dataclasses.replace(spec, normalize_features=feature_norm == "row")
    if spec.synthetic:
        graph = tiny_graph() if spec.name == "tiny" else tiny_graph(num_nodes=169_343, num_classes=40,
                                                                    num_features=128, degree=6)  # fmt: skip
        if spec.normalize_features:
            from torch_geometric.transforms import NormalizeFeatures

            return NormalizeFeatures()(graph)
        return graph
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    with _dataset_lock(spec, data_dir):
        try:
            raw = _load_checked(spec, data_dir, missing_raw_files(spec, data_dir))
        except OSError as error:  # writing the fingerprint or swapping a rebuilt folder in
            raise UserError(
                f"cannot write into {data_dir / spec.folder}: {error.strerror or error}; "
                f"set {DATA_DIR_ENV} or --data-dir to a writable folder"
            ) from None
    return preprocess(raw, spec)


@contextlib.contextmanager
def _dataset_lock(spec: DatasetSpec, data_dir: Path) -> Iterator[None]:
    """An OS lock on `<data dir>/.<folder>.lock` (outside the dataset folder, which OGB wants to itself),
    released with the handle or by the kernel when the process dies. Rebuild folders that a killed
    process left are removed once the lock is held: no other process can be using them."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(data_dir / f".{spec.folder}.lock", "a")
    except OSError as error:
        raise UserError(
            f"cannot write into the data directory {data_dir}: {error.strerror or error}; "
            f"set {DATA_DIR_ENV} or --data-dir to a writable folder"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        for leftover in data_dir.glob(f".{spec.folder}.rebuild-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        yield


def _load_checked(spec: DatasetSpec, data_dir: Path, missing: list[Path]) -> Data:
    """PyG's data object, from a processed file that is the one built from these raw files, intact.

    No processed file yet: PyG builds it, and its fingerprint (the raw files' sha256 and
    `data_fingerprint` of what was built) is written beside it. A processed file is used only when its
    fingerprint names the raw files present and its loaded content matches; one without a fingerprint
    (built by an older gflbench), built from other raw files, that does not load, or whose content
    changed, is rebuilt from the raw files and replaces it; `--verbose` says so.
    """
    processed = data_dir / spec.folder / "processed"
    raw = raw_digests(spec, data_dir)
    if not processed.exists():
        data = _read(spec, data_dir, data_dir, missing)
        write_fingerprint(processed, raw_digests(spec, data_dir) if missing else raw, data)
        return data
    recorded = read_fingerprint(processed)
    if recorded is None:
        problem = "has no fingerprint (built by an older gflbench)"
    elif recorded.get("raw") != raw:
        problem = "was built from other raw files"
    else:
        try:
            data = _read(spec, data_dir, data_dir, missing)
        except UserError:
            problem = "does not load"
        else:
            if data_fingerprint(data) == recorded.get("data"):
                return data
            problem = "no longer matches its fingerprint (changed on disk)"
    say_verbose(f"{processed} {problem}; rebuilt from the raw files")
    return _rebuild(spec, data_dir, missing)


def _rebuild(spec: DatasetSpec, data_dir: Path, missing: list[Path]) -> Data:
    """Process the raw files again in a scratch root beside the dataset, then swap the new processed
    folder in by rename: a reader of the old one (an older gflbench that takes no lock) never finds a
    half-written file, only the old folder or the new one."""
    folder = data_dir / spec.folder
    scratch = Path(tempfile.mkdtemp(prefix=f".{spec.folder}.rebuild-", dir=data_dir))
    try:
        (scratch / spec.folder).mkdir()
        for entry in folder.iterdir():
            if entry.name != "processed":
                (scratch / spec.folder / entry.name).symlink_to(entry.resolve())
        data = _read(spec, scratch, data_dir, missing)
        fresh = scratch / spec.folder / "processed"
        write_fingerprint(fresh, raw_digests(spec, data_dir), data)
        if (folder / "processed").exists():
            os.rename(folder / "processed", scratch / "replaced")
        os.rename(fresh, folder / "processed")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return data


def _read(spec: DatasetSpec, root: Path, data_dir: Path, missing: list[Path]) -> Data:
    """PyG's (or OGB's) data object of `spec` under `root`; any failure is one UserError naming the files
    in `data_dir` (the user's data directory, also when `root` is a scratch copy of it)."""
    try:
        with quiet_libraries():
            return LOADERS[spec.name](spec, root)
    except UserError:
        raise
    except Exception as error:  # a failed download surfaces as many exception types
        if not missing:  # the files are there but do not parse: name them and say what to do
            raise UserError(
                f"dataset {spec.name!r}: the files in {data_dir / spec.folder} could not be read ({type(error).__name__}: "
                f"{error}); a raw or processed file is truncated or corrupted: fix the mirror ({RAW_MIRROR_ENV}) or "
                f"delete {data_dir / spec.folder} to copy or download it again"
            ) from None
        shown = ", ".join(str(p) for p in missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
        raise UserError(
            f"dataset {spec.name!r} is not available offline and could not be downloaded ({type(error).__name__}); "
            f"missing {shown}; set {RAW_MIRROR_ENV} to a folder in PyG raw layout or {DATA_DIR_ENV} "
            f"to a data directory that holds it"
        ) from None
