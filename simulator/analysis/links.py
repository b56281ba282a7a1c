"""Per-link utilization of a simulated run (table, markdown, heatmap) and the busbw-vs-size plot.

Reads ``FlowNetwork.link_stats()``: bytes and busy time per directed link; busy fraction is the
share of the run a link carried traffic, utilization the share of its capacity it delivered.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..hardware.topology import Topology
from ..units import GB

HEATMAP_COLUMNS = ("nvlink tx", "nvlink rx", "pcie", "nic tx", "nic rx", "leaf up", "leaf down")
_NUM = re.compile(r"\d+")


def _link_name(link: tuple) -> str:
    return f"{link[0]}->{link[1]}"


def link_utilization(link_stats: dict, topo: Topology, duration_s: float) -> list[dict]:
    """Rows {link, kind, bytes, busy_fraction, utilization}, busiest first."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    rows = []
    for link, (sent, busy) in link_stats.items():
        cap = topo.capacity_Bps[link]
        rows.append({"link": _link_name(link), "kind": topo.link_kind(link), "bytes": sent,
                     "busy_fraction": min(busy / duration_s, 1.0),
                     "utilization": min(sent / (cap * duration_s), 1.0)})
    rows.sort(key=lambda r: (-r["busy_fraction"], -r["bytes"], r["link"]))
    return rows


def links_markdown(rows: list[dict], top: int = 10) -> str:
    """The ``top`` busiest links as a markdown table (for report.md)."""
    lines = ["| link | kind | GB moved | busy | utilization |", "|---|---|---:|---:|---:|"]
    for r in rows[:top]:
        lines.append(f"| {r['link']} | {r['kind']} | {r['bytes'] / GB:.2f} | "
                     f"{r['busy_fraction']:.1%} | {r.get('utilization', 0.0):.1%} |")
    if not rows:
        lines.append("| (no traffic) | | | | |")
    return "\n".join(lines)


def _column(u: str, v: str) -> str:
    if u.startswith("gpu") and v.startswith("nvs"):
        return "nvlink tx"
    if u.startswith("nvs"):
        return "nvlink rx"
    if u.startswith("nic") and v.startswith("leaf"):
        return "nic tx"
    if u.startswith("leaf") and v.startswith("nic"):
        return "nic rx"
    if u.startswith("leaf"):
        return "leaf up"
    if u.startswith("spine"):
        return "leaf down"
    return "pcie"


def _nodes_of(name: str, topo: Topology, leaf_nodes: dict) -> list[int]:
    if name.startswith("leaf"):
        return leaf_nodes.get(name, [])
    found = _NUM.search(name)
    if found is None:
        raise ValueError(f"topology node name {name!r} has no number")
    num = int(found.group())
    if name.startswith(("gpu", "pcie")):
        return [num // topo.cluster.gpus_per_node]
    return [num]  # nvs{m}, nic{m}.{k}, host{m}


def plot_link_heatmap(rows: list[dict], topo: Topology, path: str | Path) -> Path:
    """Heatmap of the busiest link's busy fraction per node (rows) and link type (columns);
    leaf up/down show the uplinks of the leaves the node's NICs attach to."""
    c = topo.cluster
    leaf_nodes: dict = {}
    if c.num_nodes > 1:
        for node in range(c.num_nodes):
            for rail in range(c.nics_per_node):
                leaf_nodes.setdefault(topo.leaf_name(node, rail), []).append(node)
    grid = np.zeros((c.num_nodes, len(HEATMAP_COLUMNS)))
    col = {name: i for i, name in enumerate(HEATMAP_COLUMNS)}
    for r in rows:
        u, v = r["link"].split("->")
        j = col[_column(u, v)]
        end = v if u.startswith("spine") else u
        for node in _nodes_of(end, topo, leaf_nodes):
            grid[node, j] = max(grid[node, j], r["busy_fraction"])
    fig = Figure(figsize=(7, min(2 + 0.25 * c.num_nodes, 40)))
    ax = fig.add_subplot()
    im = ax.imshow(grid, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis",
                   interpolation="nearest")
    ax.set_xticks(range(len(HEATMAP_COLUMNS)), HEATMAP_COLUMNS, rotation=30, ha="right")
    ax.set_ylabel("node")
    ax.set_title(f"Link busy fraction, {c.num_nodes} x {c.name}")
    fig.colorbar(im, ax=ax, label="busy fraction (busiest link)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_busbw_sweep(rows: list[dict], path: str | Path) -> Path:
    """busbw vs message size (log2 x axis) per op, as nccl-tests users read it; the marker shows
    the algorithm/protocol the tuner picked at each size."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    markers = "os^vD<>pP*hX"
    seen: dict = {}  # label -> style index; each label enters the legend once
    for op in dict.fromkeys(r["op"] for r in rows):
        pts = sorted((r for r in rows if r["op"] == op), key=lambda r: r["size_bytes"])
        ax.plot([r["size_bytes"] for r in pts], [r["busbw_GBps"] for r in pts], "-",
                color="0.6", linewidth=1)
        for r in pts:
            label = f"{op} {r['algorithm']}"
            first = label not in seen
            k = seen.setdefault(label, len(seen))
            ax.plot(r["size_bytes"], r["busbw_GBps"], markers[k % len(markers)], markersize=5,
                    color=f"C{k % 10}", label=label if first else None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes, nccl-tests convention)")
    ax.set_ylabel("busbw (GB/s)")
    n = rows[0]["num_gpus"] if rows else 0
    ax.set_title(f"Bus bandwidth vs message size, {n} GPUs")
    ax.grid(True, which="major", alpha=0.3)
    if rows:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
