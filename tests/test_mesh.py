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
