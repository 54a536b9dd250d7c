"""FedGNN: who matches whom, what travels, and that it is FedAvg when nothing matches."""

from __future__ import annotations

import pytest
import torch
from parties import build_parties

from gflbench.baselines.fedgnn import FedGNN, match_nodes, node_hashes
from gflbench.core.exchange import clone_message
from gflbench.core.method import Round, resolve_params
from gflbench.errors import UserError
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec

KEY = b"test-key"


@pytest.fixture(scope="module")
def overlap():
    return DataCache(None, None).federated("tiny", "overlap", 10, 1234)


def neighbour_ids(graph) -> list[frozenset[int]]:
    row, col = graph.edge_index
    sets: list[set[int]] = [set() for _ in range(graph.num_nodes)]
    for r, c in zip(row.tolist(), col.tolist()):
        if r != c:
            sets[r].add(int(graph.global_id[c]))
    return [frozenset(s) for s in sets]


def all_pairs(graphs) -> set[tuple[int, int, int, int]]:
    uploads = {cid: node_hashes(g.global_id, g.edge_index, KEY) for cid, g in enumerate(graphs)}
    return match_nodes(uploads)


def test_copies_of_a_global_node_match_and_every_match_is_justified(overlap):
    graphs = overlap.graphs
    pairs = all_pairs(graphs)
    neighbours = [neighbour_ids(g) for g in graphs]
    gid = [g.global_id.tolist() for g in graphs]
    copies = {
        (c, v, c2, u)
        for c in range(len(graphs)) for c2 in range(len(graphs)) if c != c2
        for v, a in enumerate(gid[c]) for u, b in enumerate(gid[c2]) if a == b
    }  # fmt: skip
    assert copies and copies <= pairs  # the overlapping scheme holds nodes twice; every copy pair matches
    for c, v, c2, u in pairs - copies:  # the rest share one non-empty neighbour set
        assert neighbours[c][v] and neighbours[c][v] == neighbours[c2][u]
    assert all(c != c2 for c, _, c2, _ in pairs)


def test_disjoint_partitions_never_match(tiny_federation):
    assert all_pairs(tiny_federation.graphs) == set()


def test_same_neighbourhood_matches_without_sharing_the_node():
    gid_a, gid_b = torch.tensor([10, 11, 12]), torch.tensor([20, 11, 12])
    ring = torch.tensor([[0, 1, 0, 2], [1, 0, 2, 0]])  # node 0 linked to 1 and 2
    uploads = {0: node_hashes(gid_a, ring, KEY), 1: node_hashes(gid_b, ring, KEY)}
    pairs = match_nodes(uploads)
    assert (0, 0, 1, 0) in pairs  # nodes 10 and 20 both have neighbours {11, 12}
    assert (0, 1, 1, 1) in pairs and (0, 2, 1, 2) in pairs  # copies of 11 and 12
    other_key = {0: node_hashes(gid_a, ring, KEY), 1: node_hashes(gid_b, ring, b"another key")}
    assert match_nodes(other_key) == set()  # hashes only match under the clients' common key


def drive(federation, rounds: int):
    """Run FedGNN's parties by hand; yield each exchange's round, downloads and uploads."""
    server, clients = build_parties(FedGNN, resolve_params(FedGNN, {}), federation, rounds)
    for index in range(rounds):
        for stage in range(server.stages(index)):
            rnd = Round(index, stage)
            downloads = server.configure(rnd, list(range(len(clients))))
            uploads = {c.cid: clone_message(c.fit(rnd, clone_message(downloads[c.cid])[0]))[0] for c in clients}
            yield rnd, downloads, uploads, clients, server
            server.aggregate(rnd, uploads)


def test_embeddings_travel_only_for_matching_nodes_and_reach_their_partners(overlap):
    pairs = all_pairs(overlap.graphs)
    needed = {c: sorted({u for _, _, c2, u in pairs if c2 == c}) for c in range(len(overlap.graphs))}
    previous = None
    for rnd, downloads, uploads, clients, _ in drive(overlap, rounds=3):
        if rnd == Round(0, 0):
            assert all("weights" not in u and "embeddings" not in u for u in uploads.values())
            continue
        for cid, upload in uploads.items():
            assert downloads[cid]["share"].tolist() == needed[cid]
            assert upload["embeddings"].shape == (len(needed[cid]), clients[cid].params.hidden)
        if previous is not None:  # rows received now are the partners' embeddings uploaded last round
            for cid, down in downloads.items():
                mine = sorted(p for p in pairs if p[0] == cid)
                assert down["anchors"].tolist() == [v for _, v, _, _ in mine]
                for row, (_, _, c2, u) in zip(down["remote"], mine):
                    assert torch.equal(row, previous[c2]["embeddings"][needed[c2].index(u)])
        else:
            assert all(d["remote"].numel() == 0 for d in downloads.values())  # nothing computed yet
        previous = uploads


def test_received_embeddings_change_the_prediction(overlap):
    *_, (_, _, _, clients, _) = drive(overlap, rounds=2)
    client = next(c for c in clients if c.remote is not None)
    expanded = client.predict()
    remote, client.remote = client.remote, None
    plain = client.predict()
    client.remote = remote
    assert expanded.shape == plain.shape == (client.graph.num_nodes, overlap.num_classes)
    assert not torch.allclose(expanded, plain)


def test_without_matches_fedgnn_is_fedavg_on_the_gcn(tiny_federation, cpu):
    fedgnn = run(make_spec("fedgnn", "tiny", "metis", 5, 0, rounds=4), tiny_federation, cpu)
    fedavg = run(make_spec("fedavg", "tiny", "metis", 5, 0, {"backbone": "gcn"}, rounds=4), tiny_federation, cpu)
    assert fedgnn["curves"] == fedavg["curves"]
    assert fedgnn["diagnostics"]["matched_pairs"] == [0.0] * 4


def test_overlap_runs_match_nodes_and_are_deterministic(overlap, cpu):
    a = run(make_spec("fedgnn", "tiny", "overlap", 10, 3, rounds=4), overlap, cpu)
    b = run(make_spec("fedgnn", "tiny", "overlap", 10, 3, rounds=4), overlap, cpu)
    c = run(make_spec("fedgnn", "tiny", "overlap", 10, 4, rounds=4), overlap, cpu)
    assert a["curves"] == b["curves"] and a["curves"] != c["curves"]
    assert a["diagnostics"]["matched_pairs"][0] == len(all_pairs(overlap.graphs)) > 0
    assert a["bytes_up"][0] > a["bytes_up"][1] == a["bytes_up"][2]  # round 0 also carries the node hashes


def test_fedgnn_needs_the_gcn_backbone():
    with pytest.raises(UserError):
        resolve_params(FedGNN, {"backbone": "sage"})
