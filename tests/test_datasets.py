"""Dataset loading through the real PyG/OGB loaders, on generated upstream-format files and the real mirror.

Most benchmark graphs cannot be downloaded here, so `raw_formats` writes small stand-ins in the exact
upstream layouts; the tests check the protocol's preprocessing (undirected, largest component,
row-normalised features for Planetoid/Amazon only) and the offline mirror's copy-in behaviour.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import raw_formats
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from torch_geometric.data import Data
from torch_geometric.utils import is_undirected

from gflbench import data as datasets
from gflbench.data import (
    DATA_DIR_ENV,
    DATASETS,
    RAW_MIRROR_ENV,
    VERBOSE_ENV,
    dataset_spec,
    default_data_dir,
    is_available,
    load_dataset,
    tiny_graph,
)
from gflbench.errors import UserError

ROW_NORMALISED = {"cora", "citeseer", "pubmed", "amazon-computer", "amazon-photo"}  # docs/protocol.md
REAL_MIRROR = raw_formats.real_mirror()


def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755 if writable else 0o555)
        else:
            path.chmod(0o644 if writable else 0o444)


def _listing(root: Path) -> dict[str, str]:
    """Every path under `root` with a hash of its bytes (dirs: ""), to prove the mirror is never written."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty mirror folder named by the env var; writable again afterwards so tmp_path can be removed."""
    path = tmp_path / "mirror"
    path.mkdir()
    monkeypatch.setenv(RAW_MIRROR_ENV, str(path))
    yield path
    _chmod_tree(path, writable=True)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated stand-ins carry the real files' names, not their bytes: no published checksum applies to them."""
    monkeypatch.setattr(datasets.raw, "RAW_CHECKSUMS", {})  # read where the mirror copy checks it


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every download path PyG/OGB use fail at once, as with no DNS; returns the URLs tried."""
    import ogb.nodeproppred.dataset_pyg
    import torch_geometric.datasets.amazon
    import torch_geometric.datasets.heterophilous_graph_dataset
    import torch_geometric.io.fs

    tried: list[str] = []

    def refuse(url: str, *args: object, **kwargs: object) -> None:
        tried.append(url)
        raise URLError("no network in tests")

    monkeypatch.setattr(torch_geometric.io.fs, "cp", refuse)  # Planetoid
    monkeypatch.setattr(torch_geometric.datasets.amazon, "download_url", refuse)
    monkeypatch.setattr(torch_geometric.datasets.heterophilous_graph_dataset, "download_url", refuse)
    monkeypatch.setattr(ogb.nodeproppred.dataset_pyg, "decide_download", refuse)
    return tried


def _assert_clean(data: Data, num_classes: int) -> None:
    """The protocol's invariants: undirected, one connected component, 1-D long labels using every class."""
    n = data.num_nodes
    assert data.x.dtype == torch.float and data.x.size(0) == n
    assert data.y.dtype == torch.long and data.y.shape == (n,)
    assert sorted(data.y.unique().tolist()) == list(range(num_classes))
    assert is_undirected(data.edge_index, num_nodes=n)
    row, col = data.edge_index.numpy()
    adjacency = coo_matrix((np.ones(len(row)), (row, col)), shape=(n, n))
    assert connected_components(adjacency, directed=False)[0] == 1


def test_every_benchmark_dataset_has_a_generated_stand_in() -> None:
    generated = {name for name, spec in DATASETS.items() if spec.synthetic}
    assert generated == {"tiny", "synthetic-arxiv-size"}
    assert set(raw_formats.WRITERS) | generated == set(DATASETS)
    assert len(raw_formats.WRITERS) == 11


@pytest.mark.parametrize("name", sorted(raw_formats.WRITERS))
def test_load_generated_raw_files_through_mirror(name: str, mirror: Path, tmp_path: Path, stand_ins: None) -> None:
    """The real loader reads upstream-format files copied from a read-only mirror and preprocesses them."""
    graph, files = raw_formats.WRITERS[name](mirror)
    _chmod_tree(mirror, writable=False)
    before = _listing(mirror)
    data_dir = tmp_path / "data"

    data = load_dataset(name, data_dir)

    _assert_clean(data, graph.num_classes)
    lcc = torch.from_numpy(graph.lcc)
    assert data.num_nodes == int(lcc.sum()) < graph.x.shape[0]  # the small extra component is gone
    assert torch.equal(data.y, torch.from_numpy(graph.y)[lcc])
    new_id = np.cumsum(graph.lcc) - 1
    kept = graph.edges[graph.lcc[graph.edges[:, 0]]]
    expected_edges = {(int(new_id[a]), int(new_id[b])) for a, b in kept} | {
        (int(new_id[b]), int(new_id[a])) for a, b in kept
    }
    assert data.edge_index.size(1) == len(expected_edges)
    assert set(map(tuple, data.edge_index.t().tolist())) == expected_edges

    raw_x = torch.from_numpy(graph.x)[lcc]
    row_sums = data.x.sum(dim=1)
    if name in ROW_NORMALISED:
        nonzero = raw_x.abs().sum(dim=1) > 0
        assert not nonzero.all()  # an empty row stays empty instead of dividing by zero
        assert torch.allclose(row_sums[nonzero], torch.ones(int(nonzero.sum())))
        assert torch.all(row_sums[~nonzero] == 0)
        expected_x = raw_x / raw_x.sum(dim=1, keepdim=True).clamp(min=1)
    else:
        assert not torch.allclose(row_sums, torch.ones_like(row_sums))
        expected_x = raw_x
    assert torch.allclose(data.x, expected_x, atol=1e-5)

    # the other normalisation (a `paper` source's `feature_norm`) from the same processed file: only x differs
    other = load_dataset(name, data_dir, "none" if name in ROW_NORMALISED else "row")
    assert torch.equal(other.y, data.y) and torch.equal(other.edge_index, data.edge_index)
    shifted = raw_x - raw_x.min()  # NormalizeFeatures shifts to non-negative, then divides by the row sum (min 1)
    other_x = raw_x if name in ROW_NORMALISED else shifted / shifted.sum(dim=1, keepdim=True).clamp(min=1)
    assert torch.allclose(other.x, other_x, atol=1e-5) and not torch.allclose(other.x, data.x)

    for rel in files:
        assert (data_dir / rel).read_bytes() == (mirror / rel).read_bytes()
    assert (data_dir / files[0].parts[0] / "processed").is_dir()
    assert _listing(mirror) == before


@pytest.mark.parametrize(
    ("name", "shown_file"),
    [
        ("cora", "Cora/raw/ind.cora.x"),
        ("amazon-photo", "Photo/raw/amazon_electronics_photo.npz"),
        ("roman-empire", "roman_empire/raw/roman_empire.npz"),
        ("ogbn-arxiv", "ogbn_arxiv/raw/edge.csv.gz"),
    ],
)
def test_absent_dataset_is_a_user_error_naming_file_and_env_vars(
    name: str, shown_file: str, mirror: Path, offline: list[str], tmp_path: Path
) -> None:
    """Offline and not in the mirror: a one-line UserError, also on a retry after the failed download."""
    data_dir = tmp_path / "data"
    for _attempt in range(2):
        with pytest.raises(UserError) as error:
            load_dataset(name, data_dir)
        message = str(error.value)
        assert str(data_dir / shown_file) in message
        assert RAW_MIRROR_ENV in message and DATA_DIR_ENV in message
    assert len(offline) == 2  # each attempt really tried the (stubbed) download


def test_is_available_sees_mirror_and_data_dir(
    mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    data_dir = tmp_path / "data"
    assert is_available("tiny", data_dir)
    assert not is_available("roman-empire", data_dir)
    raw_formats.WRITERS["roman-empire"](mirror)
    assert is_available("roman-empire", data_dir)
    monkeypatch.delenv(RAW_MIRROR_ENV)  # the copy in the data directory now suffices on its own
    assert is_available("roman-empire", data_dir)
    assert not is_available("questions", data_dir)
    with pytest.raises(UserError, match="unknown dataset"):
        is_available("karate", data_dir)


def test_default_data_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    assert default_data_dir() == tmp_path / "data"
    monkeypatch.delenv(DATA_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_data_dir() == tmp_path / "cache" / "gflbench"


def test_tiny_graph_is_deterministic_and_learnable(tmp_path: Path) -> None:
    first, second = tiny_graph(), tiny_graph()
    for key in ("x", "y", "edge_index"):
        assert torch.equal(first[key], second[key])
    assert not torch.equal(tiny_graph(seed=1).y, first.y)
    _assert_clean(first, 4)
    src, dst = first.edge_index
    assert (first.y[src] == first.y[dst]).float().mean() > 0.5  # homophilous, so a GNN can beat an MLP
    loaded = load_dataset("tiny", tmp_path / "data")
    assert torch.equal(loaded.x, first.x) and torch.equal(loaded.edge_index, first.edge_index)
    assert not (tmp_path / "data").exists()  # tiny is built in memory, no files


@pytest.mark.skipif(not (REAL_MIRROR / "Cora" / "raw").is_dir(), reason=f"no real mirror at {REAL_MIRROR}")
def test_real_cora(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RAW_MIRROR_ENV, str(REAL_MIRROR))
    data = load_dataset("cora", tmp_path)
    _assert_clean(data, 7)
    assert data.num_nodes == 2485 and data.x.size(1) == 1433  # 2708 nodes before the LCC
    assert torch.allclose(data.x.sum(dim=1), torch.ones(data.num_nodes))


@pytest.mark.skipif(not (REAL_MIRROR / "minesweeper" / "raw").is_dir(), reason=f"no real mirror at {REAL_MIRROR}")
def test_real_minesweeper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RAW_MIRROR_ENV, str(REAL_MIRROR))
    data = load_dataset("minesweeper", tmp_path)
    _assert_clean(data, 2)
    assert data.num_nodes == 10000 and data.x.size(1) == 7
    assert dataset_spec("minesweeper").metric == "roc_auc"


def _manifest_rows() -> dict[str, tuple[int, str]]:
    """path -> (bytes, sha256) of every file the mirror's MANIFEST.md lists with its sha256."""
    manifest = REAL_MIRROR / "MANIFEST.md"
    if not manifest.is_file():
        pytest.skip(f"no MANIFEST.md in {REAL_MIRROR}")
    rows = {}
    for line in manifest.read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 5 and len(cells[4]) == 64 and cells[3].isdigit():
            rows[cells[2]] = (int(cells[3]), cells[4])
    return rows


def test_known_checksums_are_the_mirror_manifests() -> None:
    """The table of published raw files is the MANIFEST's, file for file, and covers every dataset in it."""
    rows = _manifest_rows()
    assert len(rows) == 27  # Cora, CiteSeer, PubMed (8 files each), Computers, minesweeper, tolokers
    for path, (size, sha256) in rows.items():
        known = datasets.RAW_CHECKSUMS[path]
        assert (known.size, known.sha256) == (size, sha256), path
    for name in ("cora", "citeseer", "pubmed", "amazon-computer", "amazon-photo", "roman-empire", "amazon-ratings",
                 "minesweeper", "tolokers", "questions"):  # fmt: skip
        spec = dataset_spec(name)
        assert all(f"{spec.folder}/{rel}" in datasets.RAW_CHECKSUMS for rel in spec.raw_files), name


def _change_one_digit(path: Path) -> bytes:
    """One digit changed in place, same size (the issue's probe on ind.cora.test.index); returns the old bytes."""
    good = path.read_bytes()
    at = next(i for i, byte in enumerate(good) if chr(byte).isdigit())
    path.write_bytes(good[:at] + (b"1" if good[at : at + 1] != b"1" else b"2") + good[at + 1 :])
    assert path.stat().st_size == len(good)
    return good


@pytest.mark.skipif(not (REAL_MIRROR / "Cora" / "raw").is_dir(), reason=f"no real mirror at {REAL_MIRROR}")
def test_a_raw_copy_changed_in_place_is_copied_again_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RAW_MIRROR_ENV, str(REAL_MIRROR))
    first = load_dataset("cora", tmp_path)
    copy = tmp_path / "Cora" / "raw" / "ind.cora.test.index"
    good = _change_one_digit(copy)
    again = load_dataset("cora", tmp_path)
    assert copy.read_bytes() == good  # copied again from the intact mirror
    for key in ("x", "y", "edge_index"):
        assert torch.equal(again[key], first[key])
    _change_one_digit(copy)
    monkeypatch.delenv(RAW_MIRROR_ENV)  # no mirror to copy from: the published checksum refuses it by name
    with pytest.raises(UserError) as error:
        load_dataset("cora", tmp_path)
    assert str(copy) in str(error.value) and "sha256" in str(error.value)


@pytest.mark.parametrize(
    ("name", "named"), [("cora", "Cora/raw/ind.cora.x"), ("amazon-photo", "Photo/raw/amazon_electronics_photo.npz")]
)
def test_a_mirror_file_that_is_not_the_published_one_is_refused(
    name: str, named: str, mirror: Path, tmp_path: Path
) -> None:
    """Stand-ins under the real names: by sha256 where it is known (Cora), by size where only that is (Photo)."""
    raw_formats.WRITERS[name](mirror)
    data_dir = tmp_path / "data"
    with pytest.raises(UserError) as error:
        load_dataset(name, data_dir)
    message = str(error.value)
    assert str(mirror / named) in message and "corrupted" in message
    assert not (data_dir / named).exists()  # nothing was copied


def test_a_copy_that_differs_from_the_mirror_is_copied_again_without_a_known_checksum(
    mirror: Path, tmp_path: Path, stand_ins: None
) -> None:
    _graph, files = raw_formats.WRITERS["roman-empire"](mirror)
    data_dir = tmp_path / "data"
    first = load_dataset("roman-empire", data_dir)
    (rel,) = files
    copy = bytearray((data_dir / rel).read_bytes())
    copy[len(copy) // 2] ^= 0xFF
    (data_dir / rel).write_bytes(bytes(copy))
    again = load_dataset("roman-empire", data_dir)
    assert (data_dir / rel).read_bytes() == (mirror / rel).read_bytes()
    assert torch.equal(again.x, first.x) and torch.equal(again.edge_index, first.edge_index)


def test_a_processed_file_changed_inside_is_rebuilt(
    mirror: Path, tmp_path: Path, stand_ins: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """64 bytes of the features overwritten inside processed/data.pt: torch's zip reader does not check CRCs,
    so the file loads with other numbers; its fingerprint no longer matches, and it is rebuilt from raw."""
    graph, _ = raw_formats.WRITERS["cora"](mirror)
    data_dir = tmp_path / "data"
    first = load_dataset("cora", data_dir)
    processed = data_dir / "Cora" / "processed" / "data.pt"
    raw_formats.overwrite_tensor_bytes(
        processed, graph.x.size * 4, b"\x00\x00\x00\x40" * 16
    )  # 2.0: never a bag-of-words value
    monkeypatch.setenv(VERBOSE_ENV, "1")
    capsys.readouterr()
    again = load_dataset("cora", data_dir)
    for key in ("x", "y", "edge_index"):
        assert torch.equal(again[key], first[key])
    said = capsys.readouterr().err
    assert str(data_dir / "Cora" / "processed") in said and "rebuilt" in said
