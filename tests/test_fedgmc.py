"""FedGMC: the geometry of its manifolds (paper §4, Lemmas A.5-A.6), its ablations, and determinism."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import ot
import pytest
import torch
from parties import build_parties

from gflbench.core.method import Round, Setup, method_class, resolve_params
from gflbench.errors import UserError
from gflbench.methods.fedgmc import (
    FedGMCClient,
    FedGMCParams,
    class_means,
    equiangular_deviation,
    procrustes,
    radial_sequences,
    random_templates,
    refine_anchors,
    refine_templates,
    simplex_etf,
    sinkhorn_assignment,
    sinkhorn_assignments,
    two_point_wasserstein,
)


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def complete(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """A full orthogonal R = U_k V_kᵀ + U_⊥ V_⊥ᵀ from procrustes' thin factors (any completion is optimal)."""
    d, k = left.shape
    extra = torch.randn(d, d - k, generator=generator(7), dtype=left.dtype)
    u_full, _ = torch.linalg.qr(torch.cat([left, extra], 1))
    v_full, _ = torch.linalg.qr(torch.cat([right, extra], 1))
    # QR may flip the signs of the first k columns; restore them so that they equal the given factors
    u_full[:, :k], v_full[:, :k] = left, right
    return u_full @ v_full.T


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator(seed), dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


# ----------------------------------------------------------------------------- global semantic manifold


@pytest.mark.parametrize(("d", "c"), [(16, 7), (6, 7), (3, 2), (128, 40)])
def test_etf_gram_and_unit_norm(d: int, c: int) -> None:
    anchors = simplex_etf(d, c, generator()).double()  # rows δ_i
    expected = (c / (c - 1)) * torch.eye(c, dtype=torch.float64) - 1.0 / (c - 1)
    assert torch.allclose(anchors @ anchors.T, expected, atol=1e-5)
    assert torch.allclose(anchors.norm(dim=1), torch.ones(c, dtype=torch.float64), atol=1e-6)
    assert float(equiangular_deviation(anchors)) < 1e-5


def test_etf_needs_d_at_least_c_minus_1() -> None:
    with pytest.raises(UserError, match="d >= C-1"):
        simplex_etf(5, 7, generator())


def test_etf_is_seeded() -> None:
    assert torch.equal(simplex_etf(16, 5, generator(3)), simplex_etf(16, 5, generator(3)))
    assert not torch.equal(simplex_etf(16, 5, generator(3)), simplex_etf(16, 5, generator(4)))


# ----------------------------------------------------------------------------- local semantic calibration


def procrustes_case(d: int = 12, c: int = 5, absent: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
    anchors = simplex_etf(d, c, generator(1)).double()
    means = torch.rand(c, d, generator=generator(2), dtype=torch.float64)
    present = torch.ones(c, dtype=torch.bool)
    present[list(absent)] = False
    return anchors, means, present


@pytest.mark.parametrize("absent", [(), (1, 3)])
def test_procrustes_orthogonal_and_lemma_a5(absent: tuple[int, ...]) -> None:
    anchors, means, present = procrustes_case(absent=absent)
    rotation = complete(*procrustes(means, anchors, present))
    d = anchors.shape[1]
    assert torch.allclose(rotation.T @ rotation, torch.eye(d, dtype=torch.float64), atol=1e-10)
    p_s, delta_s = means[present].T, anchors[present].T  # columns, as in the paper
    error = ((rotation @ p_s - delta_s) ** 2).sum()
    sigma = torch.linalg.svdvals(delta_s @ p_s.T)
    assert torch.allclose(error, (p_s**2).sum() + (delta_s**2).sum() - 2 * sigma.sum(), atol=1e-9)
    for seed in range(200):
        other = random_orthogonal(d, seed)
        assert ((other @ p_s - delta_s) ** 2).sum() >= error - 1e-9


def test_procrustes_ignores_absent_classes() -> None:
    anchors, means, present = procrustes_case(absent=(0, 2))
    moved = means.clone()
    moved[[0, 2]] = torch.rand(2, means.shape[1], generator=generator(9), dtype=torch.float64) * 50
    left, right = procrustes(means, anchors, present)
    left2, right2 = procrustes(moved, anchors, present)
    assert torch.allclose(left @ right.T, left2 @ right2.T, atol=1e-10)


def test_procrustes_batches_over_clients() -> None:
    """Stacked problems (the batched path's `group_step`) give each problem's own rotation, on the part of R
    that is determined: R p_c and Rᵀ δ_c of the present classes, which is all FedGMC computes with it.

    With absent classes the singular vectors of zero singular value are any basis of their complement,
    and which one LAPACK returns depends on the call (batched or not) and the CPU's kernels; a CI machine
    with other kernels gave another U_k V_kᵀ on those columns while every R p_c agreed. So the full
    product is not compared."""
    cases = [procrustes_case(absent=absent) for absent in [(), (1, 3), (0,)]]
    cases[1] = (cases[1][0], cases[1][1] * 3 + 1, cases[1][2])  # not the same means in every problem
    lefts, rights = procrustes(*(torch.stack([case[i] for case in cases]) for i in (1, 0, 2)))
    for (anchors, means, present), left, right in zip(cases, lefts, rights):
        alone_left, alone_right = procrustes(means, anchors, present)
        p, delta = means[present], anchors[present]  # rows
        assert torch.allclose(p @ right @ left.T, p @ alone_right @ alone_left.T, atol=1e-10)  # (R p_c)ᵀ
        assert torch.allclose(delta @ left @ right.T, delta @ alone_left @ alone_right.T, atol=1e-10)  # (Rᵀ δ_c)ᵀ


def test_procrustes_preserves_pairwise_distances_lemma_a6() -> None:
    anchors, means, present = procrustes_case()
    rotation = complete(*procrustes(means, anchors, present))
    calibrated = means @ rotation.T  # rows R p_i
    assert torch.allclose(torch.cdist(calibrated, calibrated), torch.cdist(means, means), atol=1e-10)


def test_semantic_loss_is_eq3_with_the_orthogonal_r() -> None:
    """The client's loss (through R's thin factors) equals mean_v ‖R h_v − δ_{y_v}‖² for the full R."""
    d, c = 10, 4
    anchors = simplex_etf(d, c, generator(1)).double()
    ego = torch.rand(30, d, generator=generator(2), dtype=torch.float64)
    labels = torch.arange(30) % 3  # class 3 absent
    counts = torch.bincount(labels, minlength=c)
    means, present = class_means(ego, labels, counts), counts > 0
    rotation = complete(*procrustes(means, anchors, present))
    expected = ((ego @ rotation.T - anchors[labels]) ** 2).sum(1).mean()
    client = object.__new__(FedGMCClient)
    client.setup = dataclasses.replace(tiny_setup(), num_classes=c)
    client.train_labels, client.anchors, client.state = labels, anchors, {}
    client.class_counts, client.present, client.rotation = counts, present, None
    assert torch.allclose(client.semantic_loss(ego), expected, atol=1e-10)
    assert torch.allclose(client.state["calibrated"][present], means[present] @ rotation.T, atol=1e-10)


# ----------------------------------------------------------------------------- structural calibration


def unit_rows(*shape: int, seed: int) -> torch.Tensor:
    gaussian = torch.randn(*shape, generator=generator(seed), dtype=torch.float64)
    return torch.nn.functional.normalize(gaussian, dim=-1)


def test_two_point_wasserstein_matches_pot_emd2() -> None:
    measures = unit_rows(9, 2, 6, seed=1)
    templates = torch.randn(5, 2, 6, generator=generator(2), dtype=torch.float64)  # not unit: general case
    closed = two_point_wasserstein(measures, templates)
    half = np.full(2, 0.5)
    for b in range(9):
        for q in range(5):
            cost = ot.dist(measures[b].numpy(), templates[q].numpy())  # squared Euclidean
            assert closed[b, q].item() == pytest.approx(ot.emd2(half, half, cost), abs=1e-10)


def test_sinkhorn_plan_marginals() -> None:
    costs = two_point_wasserstein(unit_rows(40, 2, 8, seed=3), random_templates(6, 8, generator(4)).double())
    assignment = sinkhorn_assignment(costs, reg=0.05)
    assert assignment.shape == (40, 6)
    assert torch.allclose(assignment.sum(1), torch.ones(40, dtype=costs.dtype), atol=1e-8)  # F_b· sums to 1
    assert torch.allclose(assignment.sum(0), torch.full((6,), 40 / 6, dtype=costs.dtype), atol=1e-4)
    assert (assignment >= 0).all()
    standardised = ((costs - costs.mean()) / costs.std(unbiased=False)).numpy()
    plan = ot.sinkhorn(np.full(40, 1 / 40), np.full(6, 1 / 6), standardised, 0.05, stopThr=1e-6)
    assert np.allclose(assignment.numpy(), 40 * plan, atol=1e-10)  # it is POT's Sinkhorn-Knopp plan


def test_batched_sinkhorn_gives_each_problem_its_own_plan() -> None:
    """Three problems of different cost scales in one `ot.solve_batch`: each plan is the one
    `sinkhorn_assignment` solves alone, to within the shared stopping tolerance."""
    templates = random_templates(6, 8, generator(4)).double()
    costs = torch.stack(
        [
            two_point_wasserstein(unit_rows(40, 2, 8, seed=s), templates) * scale
            for s, scale in ((3, 1.0), (5, 7.0), (9, 0.2))
        ]
    )
    together = sinkhorn_assignments(costs, reg=0.05)
    assert together.shape == (3, 40, 6)
    for problem, plan in zip(costs.unbind(0), together.unbind(0)):
        alone = sinkhorn_assignment(problem, reg=0.05)
        assert (plan - alone).abs().max() < 1e-3  # entries of a row-stochastic F; the marginals agree to 1e-6 · 40
        assert torch.allclose(plan.sum(0), torch.full((6,), 40 / 6, dtype=plan.dtype), atol=1e-4)
    first = sinkhorn_assignments(costs[:1], reg=0.05)[0]
    assert (first - together[0]).abs().max() < 1e-3  # a companion problem changes a plan only below the tolerance


def test_batched_path_solves_a_rounds_plans_together(tiny_federation, cpu, monkeypatch) -> None:
    """In the batched path FedGMC's clients get their F_m from one batched solve per round (none solves
    its own); the unbalanced solver, which POT has no batched form of, stays per client."""
    import gflbench.methods.fedgmc as fedgmc
    from gflbench.experiments.runner import run
    from gflbench.experiments.spec import make_spec

    calls = {"alone": 0, "together": 0}
    alone, together = fedgmc.sinkhorn_assignment, fedgmc.sinkhorn_assignments

    def count(name, solver):
        def counted(*args, **kwargs):
            calls[name] += 1
            return solver(*args, **kwargs)

        return counted

    monkeypatch.setattr(fedgmc, "sinkhorn_assignment", count("alone", alone))
    monkeypatch.setattr(fedgmc, "sinkhorn_assignments", count("together", together))
    record = run(
        make_spec("fedgmc", "tiny", "metis", 5, 0, rounds=3, local_epochs=2), tiny_federation, cpu, batched=True
    )
    assert record["execution"] == "batched"
    assert calls == {"alone": 0, "together": 3}  # one per round; the second epoch keeps the round's plans
    calls.update(alone=0, together=0)
    run(
        make_spec("fedgmc", "tiny", "metis", 5, 0, {"sinkhorn_marginal": "0.5"}, rounds=3),
        tiny_federation,
        cpu,
        batched=True,
    )
    assert calls == {"alone": 15, "together": 0}


def test_unbalanced_sinkhorn_is_row_stochastic_and_lets_templates_differ_in_mass() -> None:
    """`sinkhorn_marginal` > 0: POT's unbalanced plan with rows renormalised to 1. A large marginal
    weight approaches the balanced plan; a small one lets the cheap templates take more measures."""
    costs = two_point_wasserstein(unit_rows(40, 2, 8, seed=3), random_templates(6, 8, generator(4)).double())
    balanced = sinkhorn_assignment(costs, reg=0.05)
    loose = sinkhorn_assignment(costs, reg=0.05, marginal=0.05)
    assert torch.allclose(loose.sum(1), torch.ones(40, dtype=costs.dtype), atol=1e-8)
    assert (loose >= 0).all()
    assert loose.sum(0).std() > balanced.sum(0).std() + 0.5  # column masses are no longer forced equal
    tight = sinkhorn_assignment(costs, reg=0.05, marginal=1e4)
    assert (tight - balanced).abs().max() < 0.05


def test_renormalised_templates_lie_on_the_sphere(tiny_federation) -> None:
    params = FedGMCParams(hidden=16, renormalize_templates=True)
    server, clients = build_parties(method_class("fedgmc"), params, tiny_federation, rounds=2)
    rnd = Round(0, 0)
    downloads = server.configure(rnd, [c.cid for c in clients])
    server.aggregate(rnd, {c.cid: c.fit(rnd, downloads[c.cid]) for c in clients})
    assert torch.allclose(server.templates.norm(dim=2), torch.ones(params.Q, 2), atol=1e-6)
    plain = FedGMCParams(hidden=16)
    server, clients = build_parties(method_class("fedgmc"), plain, tiny_federation, rounds=2)
    downloads = server.configure(rnd, [c.cid for c in clients])
    server.aggregate(rnd, {c.cid: c.fit(rnd, downloads[c.cid]) for c in clients})
    assert (server.templates.norm(dim=2) < 1 - 1e-3).any()  # weighted means of unit rows sit inside


def test_relative_sinkhorn_ignores_the_cost_scale() -> None:
    """Relative: F is the same for W and a·W + b. Absolute: gathered embeddings (costs that differ by
    little) get an almost uniform F, the degenerate case the relative temperature avoids."""
    costs = two_point_wasserstein(unit_rows(40, 2, 8, seed=3), random_templates(6, 8, generator(4)).double())
    relative = sinkhorn_assignment(costs, reg=0.05)
    assert torch.allclose(sinkhorn_assignment(0.01 * costs + 3.0, reg=0.05), relative, atol=1e-8)
    assert relative.max(1).values.mean() > 0.5
    absolute = sinkhorn_assignment(0.001 * costs, reg=0.05, relative=False)
    assert torch.allclose(absolute, torch.full_like(absolute, 1 / 6), atol=0.01)


def test_radial_sequences_are_normalised_hops() -> None:
    from gflbench.backbones import H2GCNRepresentations

    hop1, hop2 = torch.randn(6, 4, generator=generator(1)), torch.randn(6, 4, generator=generator(2))
    reps = H2GCNRepresentations(ego=hop1, hop1=hop1, hop2=hop2, combined=hop1)
    nodes = torch.tensor([4, 1])
    summed = radial_sequences(reps, nodes, "sum")
    assert torch.allclose(summed[:, 0], torch.nn.functional.normalize(hop1[nodes], dim=1))
    assert torch.allclose(summed[:, 1], torch.nn.functional.normalize(hop1[nodes] + hop2[nodes], dim=1))
    ring = radial_sequences(reps, nodes, "ring")
    assert torch.allclose(ring[:, 1], torch.nn.functional.normalize(hop2[nodes], dim=1))


# ----------------------------------------------------------------------------- server refinement


@pytest.mark.parametrize("scale", [3.0, 0.0])
def test_anchor_refinement_keeps_unit_norm_and_step_bound(scale: float) -> None:
    """Unit norm after the projection; no anchor moves farther than η.

    scale 3: class means far away, every step is clipped to η and ends outside the unit ball, where the
    projection cannot lengthen it. scale 0: all means at the origin, so the data pull points inwards; a
    clipped step that ends inside the ball can be lengthened by the projection, by at most the factor
    that turns sin θ ≤ η into the chord 2 sin(θ/2), i.e. 1 + O(η²) (1.00125 for η = 0.1).
    """
    d, c, m, eta = 16, 6, 4, 0.1
    anchors = simplex_etf(d, c, generator(1))
    anchors = torch.nn.functional.normalize(anchors + 0.2 * torch.randn(c, d, generator=generator(5)), dim=1)
    calibrated = torch.randn(m, c, d, generator=generator(2)) * scale
    present = torch.rand(m, c, generator=generator(3)) > 0.3
    class_loss = torch.rand(m, c, generator=generator(4)) * 5
    refined = refine_anchors(anchors, calibrated, present, class_loss, tau=0.5, eta=eta)
    assert torch.allclose(refined.norm(dim=1), torch.ones(c), atol=1e-6)
    moved = (refined - anchors).norm(dim=1)
    assert (moved <= 2 * math.sin(math.asin(eta) / 2) + 1e-6).all()
    assert moved.max() > 0.5 * eta  # and the anchors do move


def test_anchor_refinement_step_is_the_papers() -> None:
    """δ̂_i = normalise(δ_i + t_i (γ_i v_i + s_i)) with the paper's v, γ, s, t, written out per class."""
    d, c, m, tau, eta = 8, 4, 3, 0.7, 0.05
    anchors = simplex_etf(d, c, generator(1)).double()
    noise = torch.randn(c, d, generator=generator(5), dtype=torch.float64)
    anchors = torch.nn.functional.normalize(anchors + 0.1 * noise, dim=1)
    calibrated = torch.randn(m, c, d, generator=generator(2), dtype=torch.float64)
    present = torch.ones(m, c, dtype=torch.bool)
    class_loss = torch.rand(m, c, generator=generator(4), dtype=torch.float64)
    refined = refine_anchors(anchors, calibrated, present, class_loss, tau=tau, eta=eta, eps=1e-8)
    gamma = torch.softmax(class_loss.mean(0) / tau, 0)
    for i in range(c):
        v = (calibrated[:, i] - anchors[i]).mean(0)
        s = -sum(anchors[j] / ((anchors[i] - anchors[j]) ** 2).sum() for j in range(c) if j != i)
        candidate = anchors[i] + gamma[i] * v + s
        t = min(1.0, eta / (float((candidate - anchors[i]).norm()) + 1e-8))
        expected = anchors[i] + t * (candidate - anchors[i])
        assert torch.allclose(refined[i], expected / expected.norm(), atol=1e-10)


def test_template_refinement_equals_pot_fgw_barycenter() -> None:
    s, q, d = 30, 3, 5
    measures = unit_rows(s, 2, d, seed=1)
    templates = unit_rows(q, 2, d, seed=2)
    assignment = torch.rand(s, q, generator=generator(3), dtype=torch.float64)
    refined, distances = refine_templates(templates, measures, assignment)
    half = np.full(2, 0.5)
    for k in range(q):
        lambdas = (assignment[:, k] / assignment[:, k].sum()).tolist()
        ys = [measures[i].numpy() for i in range(s)]
        cs = [ot.dist(y, y, metric="euclidean") for y in ys]
        init = templates[k].numpy()
        x, c = ot.gromov.fgw_barycenters(
            2, ys, cs, ps=[half] * s, lambdas=lambdas, alpha=0.5, p=half, init_X=init.copy(),
            init_C=ot.dist(init, init, metric="euclidean"), stop_criterion="loss", tol=0.0,
        )  # fmt: skip
        assert np.allclose(refined[k].numpy(), x, atol=1e-10)
        assert distances[k].item() == pytest.approx(c[0, 1], abs=1e-10)


# ----------------------------------------------------------------------------- parameters and ablations


def test_params_resolve_from_strings() -> None:
    overrides = {"Q": "20", "B": "32", "tau": "0.5", "eta": "0.2", "share": "all"}
    params = resolve_params(method_class("fedgmc"), overrides)
    assert (params.Q, params.B, params.tau, params.eta, params.share) == (20, 32, 0.5, 0.2, "all")
    with pytest.raises(UserError):
        resolve_params(method_class("fedgmc"), {"share": "some"})
    with pytest.raises(UserError, match="h2gcn-tanh"):
        resolve_params(method_class("fedgmc"), {"backbone": "gcn"})
    assert resolve_params(method_class("fedgmc"), {"backbone": "h2gcn-tanh"}).backbone == "h2gcn-tanh"


def test_variants_differ_from_fedgmc_in_exactly_one_switch() -> None:
    base = dataclasses.asdict(FedGMCParams())
    for name, switch in [("fedgmc-wo-semantic", "semantic"), ("fedgmc-wo-structural", "structural"),
                         ("fedgmc-wo-refinement", "refine")]:  # fmt: skip
        method = method_class(name)
        params = dataclasses.asdict(method.Params())
        assert {k for k in base if base[k] != params[k]} == {switch}
        assert params[switch] is False
        assert method.title.startswith("FedGMC (w/o ")


def tiny_setup() -> Setup:
    cpu = torch.device("cpu")
    return Setup(num_features=0, num_classes=0, num_clients=5, rounds=2, local_epochs=1, device=cpu, seed=0)


def tiny_federation(method: str):
    """A server and clients of `method` on the tiny dataset, as the runner builds them."""
    from gflbench.experiments.runner import DataCache

    data = DataCache(None, None).federated("tiny", "metis", 5, 1234)
    return build_parties(method_class(method), method_class(method).Params(), data, tiny_setup().rounds)


def loss_terms(method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ce, total) of client 0's first local step under `method`, from one shared initial state."""
    server, clients = tiny_federation(method)
    client = clients[0]
    client.model.load_state_dict(server.model.state_dict())
    message = server.configure(Round(0), [0])[0]
    client.anchors, client.templates = message["anchors"], message["templates"]
    client.order, client.sample, client.assignment = client.draw_order(), None, None
    client.model.eval()  # no dropout: the CE term is the same in every variant
    total = client.loss()
    return client.state["losses"], total.detach()


def test_node_sampling_has_its_own_seeded_generator() -> None:
    """The B nodes depend on (run seed, client id) only, not on the global RNG that dropout draws from."""
    _, clients = tiny_federation("fedgmc")
    torch.manual_seed(1)
    first = clients[0].draw_order()
    _, again = tiny_federation("fedgmc")
    torch.manual_seed(2)
    assert torch.equal(again[0].draw_order(), first)
    assert not torch.equal(again[0].draw_order(), first)  # the next round draws anew
    assert len(first) == min(FedGMCParams().B, clients[0].num_candidates)


def test_each_ablation_lacks_exactly_its_term() -> None:
    full_losses, full_total = loss_terms("fedgmc")
    ce, semantic, structural = full_losses
    assert semantic > 0 and structural > 0
    assert torch.allclose(full_total, ce + semantic + structural)
    wo_sem_losses, wo_sem_total = loss_terms("fedgmc-wo-semantic")
    assert torch.allclose(wo_sem_total, ce + structural)
    assert torch.allclose(wo_sem_losses, torch.stack([ce, structural]))
    wo_str_losses, wo_str_total = loss_terms("fedgmc-wo-structural")
    assert torch.allclose(wo_str_total, ce + semantic)
    assert torch.allclose(wo_str_losses, torch.stack([ce, semantic]))
    wo_ref_losses, wo_ref_total = loss_terms("fedgmc-wo-refinement")
    assert torch.allclose(wo_ref_total, full_total) and torch.allclose(wo_ref_losses, full_losses)


def test_without_refinement_the_server_keeps_its_manifolds() -> None:
    for method, changes in [("fedgmc", True), ("fedgmc-wo-refinement", False)]:
        server, clients = tiny_federation(method)
        anchors, templates = server.anchors.clone(), server.templates.clone()
        downloads = server.configure(Round(0), list(range(len(clients))))
        server.aggregate(Round(0), {c.cid: c.fit(Round(0), downloads[c.cid]) for c in clients})
        assert (not torch.equal(anchors, server.anchors)) is changes
        assert (not torch.equal(templates, server.templates)) is changes


def test_hidden_smaller_than_classes_minus_one_is_a_user_error() -> None:
    from gflbench.backbones import H2GCN

    params = resolve_params(method_class("fedgmc"), {"hidden": "2"})
    setup = dataclasses.replace(tiny_setup(), num_features=4, num_classes=5)
    with pytest.raises(UserError, match="d >= C-1"):
        method_class("fedgmc").server(H2GCN(4, 2, 5, 0.5), params, setup)


# ----------------------------------------------------------------------------- end to end


def tiny_run(seed: int) -> dict:
    from gflbench.experiments.runner import DataCache, run
    from gflbench.experiments.spec import make_spec

    spec = make_spec("fedgmc", "tiny", "metis", 5, seed=seed, rounds=5)
    return run(spec, DataCache(None, None).federated("tiny", "metis", 5, spec.data_seed), torch.device("cpu"))


def test_tiny_run_is_deterministic_and_records_diagnostics() -> None:
    first, second = tiny_run(0), tiny_run(0)
    assert first["curves"] == second["curves"]
    assert first["diagnostics"] == second["diagnostics"]
    assert (first["val"], first["test"]) == (second["val"], second["test"])
    names = {"equiangular_deviation", "ce_loss", "semantic_loss", "structural_loss"}
    assert set(first["diagnostics"]) == names
    assert all(len(v) == 5 and all(math.isfinite(x) for x in v) for v in first["diagnostics"].values())
    assert first["diagnostics"]["equiangular_deviation"][0] > 0  # refinement moved the anchors
    assert first["config"]["params"]["Q"] == FedGMCParams().Q
    assert tiny_run(1)["curves"] != first["curves"]


def test_snapshot_holds_the_case_study_manifolds() -> None:
    server, clients = tiny_federation("fedgmc")
    downloads = server.configure(Round(0), list(range(len(clients))))
    server.aggregate(Round(0), {c.cid: c.fit(Round(0), downloads[c.cid]) for c in clients})
    snap = server.snapshot()
    params = FedGMCParams()
    assert snap["anchors"].shape == (server.setup.num_classes, params.hidden)
    assert snap["templates"].shape == (params.Q, 2, params.hidden)
    assert snap["calibrated_means"].shape == (len(clients), server.setup.num_classes, params.hidden)
    assert len(snap["local_structural"]) == len(clients)
    assert all(m.shape[1:] == (2, params.hidden) for m in snap["local_structural"])
    assert all(torch.allclose(f.sum(1), torch.ones(len(f))) for f in snap["assignment"])


@pytest.mark.parametrize("term", ["semantic", "structural"])
def test_each_calibration_loss_sends_gradient_into_the_ego_weights(tiny_federation, term):
    """The ablations barely move the numbers: check the terms are wired into the ego layer at all."""
    params = resolve_params(method_class("fedgmc"), {})
    server, clients = build_parties(method_class("fedgmc"), params, tiny_federation, rounds=2)
    client = clients[0]
    message = server.configure(Round(0), [0])[0]
    client.anchors, client.templates = message["anchors"], message["templates"]
    client.order, client.sample = client.draw_order(), None
    client.model.train()
    reps = client.model.representations(client.graph)
    loss = client.semantic_loss(reps.ego[client.train_index]) if term == "semantic" else client.structural_loss(reps)
    client.model.zero_grad()
    loss.backward()
    grad = client.model.ego.weight.grad
    assert loss.item() > 0 and grad is not None and grad.abs().sum().item() > 0
    assert client.model.classifier.weight.grad is None  # the calibration acts on embeddings, not the head


def test_fedgmc_runs_on_overlapping_partitions(cpu):
    from gflbench.experiments.runner import DataCache, run
    from gflbench.experiments.spec import make_spec

    federation = DataCache(None, None).federated("tiny", "overlap", 10, 1234)
    record = run(make_spec("fedgmc", "tiny", "overlap", 10, 0, rounds=3), federation, cpu)
    assert record["status"] == "ok" and len(record["client_curves"]["test"][0]) == 10
    assert all(math.isfinite(v) for v in record["curves"]["val"])
