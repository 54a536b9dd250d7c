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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gfl_bench.errors import UserError

if TYPE_CHECKING:  # torch and PyG are imported where a graph is built: a dataset's name, title and sizes need neither
    from torch_geometric.data import Data

DATA_DIR_ENV = "GFLBENCH_DATA"
RAW_MIRROR_ENV = "GFLBENCH_RAW_MIRROR"


@dataclass(frozen=True)
class DatasetSpec:
    """What the protocol fixes for one dataset: where its raw files live, how it is split and trained."""

    name: str  # CLI name
    title: str  # name in the paper's tables
    folder: str  # folder under the data directory, as PyG/OGB name it
    raw_files: tuple[str, ...]  # paths relative to `folder` that must exist before loading offline
    metric: str  # "accuracy" or "roc_auc"
    rounds: int
    local_epochs: int
    split: tuple[float, float, float] = (0.2, 0.4, 0.4)  # train, val, test fractions
    homophilic: bool = True
    normalize_features: bool = True
    synthetic: bool = False  # generated (tiny, the arxiv-sized graph): in no paper table


_PLANETOID_RAW = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_OGB_ARXIV_RAW = (
    "RELEASE_v1.txt",
    "raw/edge.csv.gz",
    "raw/node-feat.csv.gz",
    "raw/node-label.csv.gz",
    "raw/node_year.csv.gz",
    "raw/num-node-list.csv.gz",
    "raw/num-edge-list.csv.gz",
    "split/time/train.csv.gz",
    "split/time/valid.csv.gz",
    "split/time/test.csv.gz",
)


def _planetoid(name: str, title: str, folder: str) -> DatasetSpec:
    return DatasetSpec(
        name, title, folder, tuple(f"raw/ind.{folder.lower()}.{s}" for s in _PLANETOID_RAW), "accuracy", 100, 1
    )


def _heterophilous(name: str, title: str, metric: str) -> DatasetSpec:
    folder = name.replace("-", "_")
    return DatasetSpec(
        name, title, folder, (f"raw/{folder}.npz",), metric, 100, 1, homophilic=False, normalize_features=False
    )


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        _planetoid("cora", "Cora", "Cora"),
        _planetoid("citeseer", "CiteSeer", "CiteSeer"),
        _planetoid("pubmed", "PubMed", "PubMed"),
        DatasetSpec(
            "amazon-computer",
            "Amazon-Computer",
            "Computers",
            ("raw/amazon_electronics_computers.npz",),
            "accuracy",
            200,
            3,
        ),
        DatasetSpec("amazon-photo", "Amazon-Photo", "Photo", ("raw/amazon_electronics_photo.npz",), "accuracy", 200, 2),
        DatasetSpec(
            "ogbn-arxiv",
            "ogbn-arxiv",
            "ogbn_arxiv",
            _OGB_ARXIV_RAW,
            "accuracy",
            200,
            2,
            split=(0.05, 0.475, 0.475),
            normalize_features=False,
        ),
        _heterophilous("roman-empire", "Roman-empire", "accuracy"),
        _heterophilous("amazon-ratings", "Amazon-ratings", "accuracy"),
        _heterophilous("minesweeper", "Minesweeper", "roc_auc"),
        _heterophilous("tolokers", "Tolokers", "roc_auc"),
        _heterophilous("questions", "Questions", "roc_auc"),
        DatasetSpec("tiny", "Tiny", "tiny", (), "accuracy", 100, 1, normalize_features=False, synthetic=True),
        # ogbn-arxiv's size (169,343 nodes, ~1.17 M edges, 128 features, 40 classes), generated: for cost
        # measurements only; its name and title say it is synthetic, and no paper table lists it.
        DatasetSpec(
            "synthetic-arxiv-size",
            "Synthetic (arxiv-sized)",
            "synthetic",
            (),
            "accuracy",
            200,
            2,
            split=(0.05, 0.475, 0.475),
            normalize_features=False,
            synthetic=True,
        ),
    )
}


class RawChecksum(NamedTuple):
    """What the published raw file is: its size, and its sha256 where that is known."""

    size: int
    sha256: str | None  # None: only the size is known (see `RAW_CHECKSUMS`)
    source: str


# The raw files PyG downloads, as published. sha256 and sizes of the 27 files present in the raw mirror are
# copied from its MANIFEST.md (shared/data/MANIFEST.md), which checked each file against the upstream
# repository's git blob; we recomputed every one of them from the mirror's files. For the four files the
# mirror lacks, MANIFEST.md gives sizes (Photo's from the upstream tree, the three heterophilous ones from a
# third-party audit) and sha256 values we could not check offline: only the sizes are used. ogbn-arxiv is
# absent from both, so its files are compared with the mirror's copy only.
_PLANETOID = "kimiyoung/planetoid@af6abf4 data/ (PyG's Planetoid URL), per the raw mirror's MANIFEST.md"
_GNN_BENCHMARK = "shchur/gnn-benchmark@1e72912 data/npz/ (PyG's Amazon URL), per the raw mirror's MANIFEST.md"
_HETEROPHILOUS = "yandex-research/heterophilous-graphs@a431395 data/ (PyG's URL), per the raw mirror's MANIFEST.md"
_SIZE_ONLY = ", size only: MANIFEST.md's sha256 could not be checked offline"
RAW_CHECKSUMS: dict[str, RawChecksum] = {
    "Cora/raw/ind.cora.x": RawChecksum(22119, "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab", _PLANETOID),
    "Cora/raw/ind.cora.tx": RawChecksum(148025, "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a", _PLANETOID),
    "Cora/raw/ind.cora.allx": RawChecksum(257305, "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543", _PLANETOID),
    "Cora/raw/ind.cora.y": RawChecksum(4054, "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1", _PLANETOID),
    "Cora/raw/ind.cora.ty": RawChecksum(28135, "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad", _PLANETOID),
    "Cora/raw/ind.cora.ally": RawChecksum(47959, "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71", _PLANETOID),
    "Cora/raw/ind.cora.graph": RawChecksum(59847, "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d", _PLANETOID),
    "Cora/raw/ind.cora.test.index": RawChecksum(5000, "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.x": RawChecksum(31087, "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.tx": RawChecksum(260321, "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.allx": RawChecksum(595021, "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.y": RawChecksum(3014, "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.ty": RawChecksum(24135, "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.ally": RawChecksum(55623, "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.graph": RawChecksum(61987, "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7", _PLANETOID),
    "CiteSeer/raw/ind.citeseer.test.index": RawChecksum(5000, "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4", _PLANETOID),
    "PubMed/raw/ind.pubmed.x": RawChecksum(23172, "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33", _PLANETOID),
    "PubMed/raw/ind.pubmed.tx": RawChecksum(405505, "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d", _PLANETOID),
    "PubMed/raw/ind.pubmed.allx": RawChecksum(7578385, "508e538e2abdccdd54c4d3e9f49d638b4af7107d85845f66ddea5a5152658b7e", _PLANETOID),
    "PubMed/raw/ind.pubmed.y": RawChecksum(854, "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3", _PLANETOID),
    "PubMed/raw/ind.pubmed.ty": RawChecksum(12135, "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd", _PLANETOID),
    "PubMed/raw/ind.pubmed.ally": RawChecksum(224739, "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e", _PLANETOID),
    "PubMed/raw/ind.pubmed.graph": RawChecksum(471808, "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9", _PLANETOID),
    "PubMed/raw/ind.pubmed.test.index": RawChecksum(6000, "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5", _PLANETOID),
    "Computers/raw/amazon_electronics_computers.npz": RawChecksum(
        31921488, "736ba1d9fd85eac2da83a5ad25c463f04b0031a6ca01563f90a7099d9e8ffb2c", _GNN_BENCHMARK
    ),
    "minesweeper/raw/minesweeper.npz": RawChecksum(
        135045, "e664c8dacf1e8ac466c2c09ed4b237bd2c5541f47a6eae9c6092cb87f16412b3", _HETEROPHILOUS
    ),
    "tolokers/raw/tolokers.npz": RawChecksum(
        1329769, "dacf3ac94cec53d03cd2adb5255c08b33dee1656c33ca8164a464bd9450a1667", _HETEROPHILOUS
    ),
    "Photo/raw/amazon_electronics_photo.npz": RawChecksum(17113960, None, _GNN_BENCHMARK + _SIZE_ONLY),
    "roman_empire/raw/roman_empire.npz": RawChecksum(20401489, None, _HETEROPHILOUS + _SIZE_ONLY + " (audit)"),
    "amazon_ratings/raw/amazon_ratings.npz": RawChecksum(27744018, None, _HETEROPHILOUS + _SIZE_ONLY + " (audit)"),
    "questions/raw/questions.npz": RawChecksum(47369919, None, _HETEROPHILOUS + _SIZE_ONLY + " (audit)"),
}  # fmt: skip


def dataset_spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}") from None


def default_data_dir() -> Path:
    """`GFLBENCH_DATA`, else the user's cache folder: datasets are large and shared between checkouts."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "gflbench"


def missing_raw_files(spec: DatasetSpec, data_dir: Path) -> list[Path]:
    """Raw files the loader needs that are neither in the data directory nor loadable from the mirror."""
    _copy_from_mirror(spec, data_dir)
    return [data_dir / spec.folder / f for f in spec.raw_files if not (data_dir / spec.folder / f).exists()]


def is_available(name: str, data_dir: Path) -> bool:
    """True when the dataset can be loaded without a download."""
    spec = dataset_spec(name)
    return not spec.raw_files or not missing_raw_files(spec, data_dir)


def _copy_from_mirror(spec: DatasetSpec, data_dir: Path) -> None:
    """Copy the raw files of `spec` from the read-only mirror into the writable data directory.

    A copy stays only when it is byte for byte the file it should be: the published file where its
    sha256 is known (`RAW_CHECKSUMS`), else the mirror's file (sha256 of both: a change in place at the
    same size is found). Any other copy (truncated, changed, from a mirror fixed since) is copied again;
    `load_dataset` then rebuilds what was processed from it. A mirror file that is not the published
    one (wrong size, or wrong sha256 where that is known) is refused by name before anything is copied.
    """
    mirror = os.environ.get(RAW_MIRROR_ENV)
    if not mirror:
        return
    try:
        for rel in spec.raw_files:
            source = Path(mirror).expanduser() / spec.folder / rel
            target = data_dir / spec.folder / rel
            if not source.is_file():
                continue
            known = RAW_CHECKSUMS.get(f"{spec.folder}/{rel}")
            if target.is_file():
                wanted = known.sha256 if known is not None and known.sha256 else _sha256(source)
                if target.stat().st_size == source.stat().st_size and _sha256(target) == wanted:
                    continue
                say_verbose(f"{target} differs from the mirror's {source}; copied again")
            problem = _unpublished(source, f"{spec.folder}/{rel}")
            if problem:
                raise UserError(
                    f"dataset {spec.name!r}: the mirror's {source} is corrupted or not the published file ({problem}); "
                    f"fix the mirror ({RAW_MIRROR_ENV}); nothing was copied into {data_dir / spec.folder}"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_partials(target.parent)
            partial = partial_path(target)
            shutil.copyfile(source, partial)  # copyfile: the mirror's read-only mode must not follow
            os.replace(partial, target)
    except OSError as error:
        raise UserError(
            f"cannot copy {spec.name!r} into the data directory {data_dir}: {error.strerror or error}; "
            f"set {DATA_DIR_ENV} or --data-dir to a writable folder"
        ) from None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unpublished(path: Path, key: str, digest: str | None = None) -> str | None:
    """How the file at `path` differs from the published file `key` ("<folder>/<rel>"); None when it does
    not, or when nothing is known about that file. `digest`: its sha256, when already computed."""
    known = RAW_CHECKSUMS.get(key)
    if known is None:
        return None
    size = path.stat().st_size
    if size != known.size:
        return f"{size} bytes, the published file has {known.size}: {known.source}"
    digest = digest or (_sha256(path) if known.sha256 else None)
    if known.sha256 and digest != known.sha256:
        return f"sha256 {digest}, the published file has {known.sha256}: {known.source}"
    return None


def _raw_digests(spec: DatasetSpec, data_dir: Path) -> dict[str, str]:
    """sha256 of each raw file present in the data directory; one that is not the published file is an error."""
    digests = {}
    for rel in spec.raw_files:
        path = data_dir / spec.folder / rel
        if not path.is_file():
            continue
        digests[rel] = _sha256(path)
        problem = _unpublished(path, f"{spec.folder}/{rel}", digests[rel])
        if problem:
            raise UserError(
                f"dataset {spec.name!r}: the raw file {path} is corrupted or not the published file ({problem}); "
                f"delete it to download it again, or set {RAW_MIRROR_ENV} to a folder that holds the published file"
            )
    return digests


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


def partial_path(target: Path, hidden: bool = False) -> Path:
    """Where to write `target` before the atomic rename: named by host and process, so that
    `remove_stale_partials` can tell a dead writer's leftover from a file still being written; `hidden`
    starts the name with a dot (an export, written into a folder of the user's)."""
    return target.with_name(f"{'.' if hidden else ''}{target.name}.{_HOST}-{os.getpid()}.partial")


_HOST = socket.gethostname().replace(".", "_")


def remove_stale_partials(folder: Path, pattern: str = "*.partial") -> None:
    """Remove the `.partial` files in `folder` matching `pattern` whose writer, a process of this host, is
    gone (killed between writing and renaming).

    Files of processes still running, and of other hosts sharing the folder, are left alone, so a file
    another process is writing is never removed under it. A name with a process id but no host (written
    before hosts were named) counts as this host's. Where the folder is not gflbench's alone (an export's),
    the caller's `pattern` matches only its own names."""
    for path in folder.glob(pattern):
        tag = path.name[: -len(".partial")].rsplit(".", 1)[-1]
        host, _, pid = tag.rpartition("-")
        if not pid.isdigit() or host not in ("", _HOST) or _process_exists(int(pid)):
            continue
        with contextlib.suppress(OSError):  # another process may have removed it first
            path.unlink()


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


VERBOSE_ENV = "GFLBENCH_VERBOSE"  # set by `gflbench --verbose`; worker processes inherit it


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Hide PyG's "Processing... Done!" and library warnings unless the user asked for --verbose.

    Errors still surface: they are exceptions, not prints.
    """
    if os.environ.get(VERBOSE_ENV):
        yield
        return
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


def say_verbose(message: str) -> None:
    """One line on stderr under `gflbench --verbose`: a cache rebuilt or a copy renewed is routine repair,
    quiet otherwise, but a user who asks can see that it happened and why."""
    if os.environ.get(VERBOSE_ENV):
        print(message, file=sys.stderr, flush=True)


def load_dataset(name: str, data_dir: Path | None = None) -> Data:
    """The preprocessed global graph of `name`: undirected, largest connected component, y of shape [N].

    Raw files are checked (`_copy_from_mirror`, `_raw_digests`) and the processed file against its
    fingerprint (`_load_checked`) under a lock per dataset, so that processes sharing a data directory
    never rebuild or replace one dataset's files at the same time.
    """
    spec = dataset_spec(name)
    if spec.name == "tiny":
        return tiny_graph()
    if spec.name == "synthetic-arxiv-size":
        return tiny_graph(num_nodes=169_343, num_classes=40, num_features=128, degree=6)
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


FINGERPRINT_FILE = "gflbench-fingerprint.json"  # beside PyG's processed file: raw sha256s and data_fingerprint


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
    raw = _raw_digests(spec, data_dir)
    if not processed.exists():
        data = _read(spec, data_dir, data_dir, missing)
        _write_fingerprint(processed, _raw_digests(spec, data_dir) if missing else raw, data)
        return data
    recorded = _read_fingerprint(processed)
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
        _write_fingerprint(fresh, _raw_digests(spec, data_dir), data)
        if (folder / "processed").exists():
            os.rename(folder / "processed", scratch / "replaced")
        os.rename(fresh, folder / "processed")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return data


def _read_fingerprint(processed: Path) -> dict | None:
    try:
        recorded = json.loads((processed / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _write_fingerprint(processed: Path, raw: dict[str, str], data: Data) -> None:
    remove_stale_partials(processed)
    target = processed / FINGERPRINT_FILE
    partial = partial_path(target)
    partial.write_text(json.dumps({"raw": raw, "data": data_fingerprint(data)}, indent=1, sort_keys=True) + "\n")
    os.replace(partial, target)


def _read(spec: DatasetSpec, root: Path, data_dir: Path, missing: list[Path]) -> Data:
    """PyG's (or OGB's) data object of `spec` under `root`; any failure is one UserError naming the files
    in `data_dir` (the user's data directory, also when `root` is a scratch copy of it)."""
    try:
        with quiet_libraries():
            return _LOADERS[spec.name](spec, root)
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


def preprocess(data: Data, spec: DatasetSpec) -> Data:
    """Keep x, y and edges only; make undirected, keep the largest component, row-normalise if asked."""
    from torch_geometric.data import Data
    from torch_geometric.transforms import Compose, LargestConnectedComponents, NormalizeFeatures, ToUndirected

    graph = Data(x=data.x.float(), y=data.y.view(-1).long(), edge_index=data.edge_index)
    steps: list[Callable] = [ToUndirected(), LargestConnectedComponents()]
    if spec.normalize_features:
        steps.append(NormalizeFeatures())
    return Compose(steps)(graph)


def _load_planetoid(spec: DatasetSpec, data_dir: Path) -> Data:
    from torch_geometric.datasets import Planetoid

    return Planetoid(str(data_dir), spec.folder)[0]


def _load_amazon(spec: DatasetSpec, data_dir: Path) -> Data:
    from torch_geometric.datasets import Amazon

    return Amazon(str(data_dir), spec.folder)[0]


def _load_heterophilous(spec: DatasetSpec, data_dir: Path) -> Data:
    from torch_geometric.datasets import HeterophilousGraphDataset

    return HeterophilousGraphDataset(str(data_dir), spec.name)[0]


def _load_ogb(spec: DatasetSpec, data_dir: Path) -> Data:
    from ogb.nodeproppred import PygNodePropPredDataset

    folder = data_dir / spec.folder
    if folder.is_dir() and not (folder / "RELEASE_v1.txt").exists():
        # Without the release marker OGB asks on stdin whether to delete the folder. A failed download
        # leaves only empty folders behind: drop those, so a retry reports the missing files again.
        if any(p.is_file() for p in folder.rglob("*")):
            raise UserError(f"{folder} exists but has no RELEASE_v1.txt; remove the folder or complete it")
        shutil.rmtree(folder)
    with _ogb_processed_globals():
        return PygNodePropPredDataset(spec.name, root=str(data_dir))[0]


def _ogb_processed_globals() -> AbstractContextManager:
    """Allow the three PyG classes inside OGB's processed file, so torch>=2.6 can load it.

    OGB saves `InMemoryDataset.collate(...)` (a `Data` object) and reads it back with a bare
    `torch.load`, which now defaults to `weights_only=True`; PyG allowlists `Data` but not its storage
    and attribute classes. Naming just those (for this call only) keeps the weights-only protection
    instead of loading the file with `weights_only=False`. Before torch 2.5 there is nothing to allow.
    """
    import torch

    if not hasattr(torch.serialization, "safe_globals"):
        return nullcontext()
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return torch.serialization.safe_globals([GlobalStorage, DataEdgeAttr, DataTensorAttr])


_LOADERS: dict[str, Callable[[DatasetSpec, Path], Data]] = {
    "cora": _load_planetoid,
    "citeseer": _load_planetoid,
    "pubmed": _load_planetoid,
    "amazon-computer": _load_amazon,
    "amazon-photo": _load_amazon,
    "ogbn-arxiv": _load_ogb,
    "roman-empire": _load_heterophilous,
    "amazon-ratings": _load_heterophilous,
    "minesweeper": _load_heterophilous,
    "tolokers": _load_heterophilous,
    "questions": _load_heterophilous,
}


def tiny_graph(
    num_nodes: int = 300, num_classes: int = 4, num_features: int = 16, seed: int = 0, degree: int = 4
) -> Data:
    """A deterministic stochastic-block graph with class-informative features: `tiny` for smoke tests,
    and at ogbn-arxiv's size `synthetic-arxiv-size` for cost measurements.

    Edges fall inside a class with probability 0.8 (homophily), features are a noisy one-hot of the
    class, so a GNN can learn it in a few rounds; a ring keeps the graph connected. `degree` edges
    leave each node before symmetrisation.
    """
    import torch
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(num_nodes) % num_classes
    y = y[torch.randperm(num_nodes, generator=gen)]
    src = torch.arange(num_nodes).repeat_interleave(degree)
    same_class = torch.rand(src.numel(), generator=gen) < 0.8
    dst = torch.randint(0, num_nodes, (src.numel(),), generator=gen)
    for c in range(num_classes):  # redirect intra-class draws to a random member of the class
        members = (y == c).nonzero().view(-1)
        pick = same_class & (y[src] == c)
        dst[pick] = members[torch.randint(0, members.numel(), (int(pick.sum()),), generator=gen)]
    ring = torch.stack([torch.arange(num_nodes), (torch.arange(num_nodes) + 1) % num_nodes])
    edge_index = torch.cat([torch.stack([src, dst]), ring], dim=1)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    centers = torch.randn(num_classes, num_features, generator=gen)
    x = centers[y] + 1.5 * torch.randn(num_nodes, num_features, generator=gen)
    return preprocess(Data(x=x, y=y, edge_index=edge_index), DATASETS["tiny"])
