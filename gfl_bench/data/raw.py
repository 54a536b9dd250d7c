"""Raw files: copied from the offline mirror (`GFLBENCH_RAW_MIRROR`, PyG's raw layout) into the writable data
directory, and checked against the published files.

Nothing on disk is trusted for its name or size (docs/architecture.md, "Identity checks"): a raw file is
compared by sha256 with the published file where its checksum is known (`RAW_CHECKSUMS`), else with the
mirror's copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import NamedTuple

from gflbench.data.partials import partial_path, remove_stale_partials
from gflbench.data.registry import DATA_DIR_ENV, RAW_MIRROR_ENV, DatasetSpec, dataset_spec
from gflbench.data.verbosity import say_verbose
from gflbench.errors import UserError


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


def raw_digests(spec: DatasetSpec, data_dir: Path) -> dict[str, str]:
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
