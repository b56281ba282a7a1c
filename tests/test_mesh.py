"""DeviceMesh: rank placement (Megatron's tp-cp-ep-dp-pp order) and the process groups of every axis."""

import itertools

import pytest

from simulator.strategy.mesh import DeviceMesh

MESH = DeviceMesh(pp=2, dp=4, cp=2, tp=2, ep=4)


def test_rank_and_coords_are_inverse():
    seen = set()
    for pp, dp, cp, tp in itertools.product(range(2), range(4), range(2), range(2)):
        r = MESH.rank(pp, dp, cp, tp)
        assert MESH.coords(r) == (pp, dp, cp, tp)
        seen.add(r)
    assert seen == set(range(MESH.size)) and MESH.size == 32


def test_tp_is_the_fastest_axis_and_pp_the_slowest():
    # a TP group of 8 ranks fills one DGX node; pipeline stages are the outermost blocks
    mesh = DeviceMesh(pp=4, dp=2, cp=1, tp=8)
    assert mesh.group("tp", 13) == tuple(range(8, 16))
    assert mesh.group("pp", 3) == (3, 19, 35, 51)
    assert [mesh.stage_of(r) for r in (0, 15, 16, 63)] == [0, 0, 1, 3]
    assert mesh.representatives == (0, 16, 32, 48)


@pytest.mark.parametrize("axis,size", [("tp", 2), ("cp", 2), ("dp", 4), ("pp", 2), ("dp_cp", 8), ("ep", 4),
                                       ("edp", 2)])
def test_groups_partition_the_ranks(axis, size):
    groups = {MESH.group(axis, r) for r in range(MESH.size)}
    assert all(len(g) == size for g in groups)
    assert sorted(r for g in groups for r in g) == list(range(MESH.size))  # disjoint and covering
    for r in range(MESH.size):
        assert r in MESH.group(axis, r)


def test_cp_joins_dp_for_the_gradient_group():
    g = MESH.group("dp_cp", 0)
    assert set(g) == {r for d in MESH.group("dp", 0) for r in MESH.group("cp", d)}


def test_ep_and_edp_split_the_data_parallel_ranks():
    # Expert parallelism is carved out of dp x cp: an EP group and an expert-data-parallel group
    # meet in exactly one rank, and together they span the rank's dp_cp group.
    for r in range(MESH.size):
        ep, edp, dpcp = set(MESH.group("ep", r)), set(MESH.group("edp", r)), set(MESH.group("dp_cp", r))
        assert ep & edp == {r}
        assert ep <= dpcp and edp <= dpcp and len(ep) * len(edp) == len(dpcp)
        # same stage and TP rank throughout
        assert {MESH.coords(x)[0] for x in ep | edp} == {MESH.coords(r)[0]}
        assert {MESH.coords(x)[3] for x in ep | edp} == {MESH.coords(r)[3]}


def test_unknown_axis_is_rejected():
    with pytest.raises(ValueError, match="unknown mesh axis 'xp'"):
        MESH.group("xp", 0)


# ---- MoE parallel folding (Megatron-Core parallel_state.py: expert RankGenerator tp=etp, ep, dp=edp, cp=1) ----
@pytest.mark.parametrize("pp,dp,cp,tp,ep,etp", [(16, 32, 1, 2, 64, 1), (2, 4, 2, 2, 4, 2), (2, 4, 2, 2, 8, 1),
                                                (3, 8, 1, 4, 4, 2), (2, 2, 2, 2, 2, 4), (4, 6, 1, 2, 3, 1)])
def test_folded_expert_groups_partition_each_stage_and_never_span_two(pp, dp, cp, tp, ep, etp):
    mesh = DeviceMesh(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep, etp=etp)
    edp = tp * cp * dp // (ep * etp)
    assert mesh.edp == edp
    for axis, size in (("ep", ep), ("etp", etp), ("edp", edp)):
        groups = {mesh.group(axis, r) for r in range(mesh.size)}
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(mesh.size))  # a partition of all ranks
        assert all(len({mesh.stage_of(r) for r in g}) == 1 for g in groups)  # inside one pipeline stage
    # an EP x ETP x EDP rank of the stage is exactly one local rank: etp_i + etp·(ep_i + ep·edp_i)
    for r in range(mesh.size):
        local = r % mesh.stage_size
        assert mesh.group("etp", r)[local % etp] == r
        assert mesh.group("ep", r)[local // etp % ep] == r
        assert mesh.group("edp", r)[local // (etp * ep)] == r


def test_deepseek_v3_plan_folds_ep64_over_tp2_dp32_and_leaves_no_expert_data_parallelism():
    # dgxc-benchmarking DeepSeek-V3 plan: TP2 PP16 EP64 ETP1 DP32 on 1,024 H100: EDP = 2·32/64 = 1
    mesh = DeviceMesh(pp=16, dp=32, cp=1, tp=2, ep=64, etp=1)
    assert mesh.group("ep", 0) == tuple(range(64)) and mesh.group("ep", 64) == tuple(range(64, 128))
    assert mesh.group("edp", 5) == (5,) and mesh.group("etp", 5) == (5,)
    # both TP ranks of a DP replica are in the EP group: experts are spread over TP x DP
    assert {mesh.coords(r)[3] for r in mesh.group("ep", 0)} == {0, 1}


def test_expert_tp_equal_to_tp_keeps_the_unfolded_groups():
    # etp = tp (Megatron's default): EP = ep consecutive (dp, cp) indices at one TP index, as before folding
    mesh = DeviceMesh(pp=2, dp=4, cp=2, tp=2, ep=4)
    flat = lambda r: mesh.coords(r)[1] * mesh.cp + mesh.coords(r)[2]  # noqa: E731
    for r in range(mesh.size):
        g = mesh.group("ep", r)
        assert [flat(x) for x in g] == list(range(flat(r) - flat(r) % 4, flat(r) - flat(r) % 4 + 4))
        assert {mesh.coords(x)[3] for x in g} == {mesh.coords(r)[3]}
        assert mesh.group("etp", r) == mesh.group("tp", r)
