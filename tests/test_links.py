"""Link utilization rows, the report table, the heatmap and the busbw sweep plot."""

import pytest
import simpy

from simulator.analysis.links import (link_utilization, links_markdown, plot_busbw_sweep,
                                      plot_link_heatmap)
from simulator.cost.collectives import plan_collective
from simulator.engine.network import FlowNetwork
from simulator.explore.collective import sweep_collective
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import build_topology
from simulator.tasks import Collective

A100 = CLUSTER_PRESETS["dgx-a100-80gb"]
PNG = b"\x89PNG\r\n\x1a\n"


def _run_dp_and_tp():
    topo = build_topology(A100.with_nodes(2))
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity_Bps)
    tp = plan_collective(Collective("all_reduce", 64e6, tuple(range(8)), "tp"), topo, "ring")
    dp = plan_collective(Collective("all_reduce", 64e6, (0, 8), "dp"), topo, "ring")
    env.process(net.run(tp))
    env.process(net.run(dp))
    env.run()
    return topo, net, env.now


def test_rows_name_links_kinds_bytes_and_busy_fractions():
    topo, net, end = _run_dp_and_tp()
    rows = link_utilization(net.link_stats(), topo, end)
    assert {r["kind"] for r in rows} == {"nvlink", "pcie", "nic"}
    busy = [r["busy_fraction"] for r in rows]
    assert busy == sorted(busy, reverse=True) and 0 < busy[-1] <= busy[0] <= 1.0
    by_name = {r["link"]: r for r in rows}
    # the 2-rank DP ring moves 2(n-1)/n x S = S out of each GPU, through its NIC
    assert by_name["nic0.0->leaf0.0"]["bytes"] == pytest.approx(64e6)
    assert by_name["gpu1->nvs0"]["bytes"] == pytest.approx(2 * 7 / 8 * 64e6)
    assert "nic0.1->leaf1.0" not in by_name  # idle links have no row
    with pytest.raises(ValueError, match="duration_s"):
        link_utilization(net.link_stats(), topo, 0.0)


def test_markdown_lists_the_top_links():
    topo, net, end = _run_dp_and_tp()
    rows = link_utilization(net.link_stats(), topo, end)
    md = links_markdown(rows, top=3)
    lines = md.splitlines()
    assert lines[0].startswith("| link | kind |") and len(lines) == 2 + 3
    assert rows[0]["link"] in lines[2]
    assert "(no traffic)" in links_markdown([], top=3)


def test_heatmap_and_sweep_plots_are_pngs(tmp_path):
    topo, net, end = _run_dp_and_tp()
    rows = link_utilization(net.link_stats(), topo, end)
    heat = plot_link_heatmap(rows, topo, tmp_path / "links.png")
    assert heat.read_bytes()[:8] == PNG
    sweep = sweep_collective(A100, "all_reduce", sizes=(8, 2 ** 16, 2 ** 24, 2 ** 30))
    out = plot_busbw_sweep(sweep, tmp_path / "busbw.png")
    assert out.read_bytes()[:8] == PNG
