"""The cluster's links by name, and tables of a per-link value filled in when a link is first used.

Links are named by their end points (``topology``): ``gpu{r}``, ``nvs{node}`` (the node's NVSwitch),
``pcie{r}`` (the GPU's PCIe switch), ``host{node}``, ``nic{node}.{rail}``, the leaf switches
(``leaf{rail}.{k}`` rail-optimized, ``leaf{j}`` fat tree) and ``spine``. ``LinkLayout`` says which
(u, v) pairs are links and of what kind, from the names alone, and lists every link in the order the
topology has always inserted them. ``LinkTable`` is a dict of one value per link (capacity, latency)
that makes an entry from its link's kind on first lookup: a 16,384-GPU cluster has 163,840 directed
links, of which a step's routes touch ~13k, and building both tables up front was ~0.1 s and ~680M
instructions of a GPT-3 175B DP 128 step. Iterating, sizing or comparing a table fills in every link
first, in that order, so it then equals the table built eagerly (its repr shows the entries made so
far).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

SPINE = "spine"
PREFIXES = ("gpu", "nvs", "pcie", "host", "nic", "leaf", "spine")  # end-point kinds, in link order


_NAME = re.compile(f"({'|'.join(PREFIXES)})" + r"((?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*)?")


def _split(name: object) -> tuple[str, tuple[int, ...]] | None:
    """("nic", (3, 1)) for "nic3.1": a known prefix and its decimal indices, or None for any other
    string (leading zeros or signs included: a name is a link's end only as the topology writes it)."""
    m = _NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        return None
    prefix, digits = m.groups()
    return prefix, tuple(map(int, digits.split("."))) if digits else ()


@dataclass(frozen=True)
class LinkLayout:
    """Which links a cluster has: GPUs per node, NICs per node, nodes, and the leaf layer."""

    num_nodes: int
    gpus_per_node: int
    nics_per_node: int
    rail_optimized: bool
    leaf_down_ports: int  # NIC-facing ports per leaf

    def leaf_name(self, node: int, rail: int) -> str:
        if self.rail_optimized:
            return f"leaf{rail}.{node // self.leaf_down_ports}"
        return f"leaf{(node * self.nics_per_node + rail) // self.leaf_down_ports}"

    def rail(self, rank: int) -> int:
        """The NIC (rail) of GPU ``rank``'s node that it uses: local index x NICs // GPUs per node."""
        g = self.gpus_per_node
        return rank % g * self.nics_per_node // g

    def leaves(self) -> dict[str, int]:
        """Leaf name -> NICs attached, in the order of their first NIC (none on one node)."""
        out: dict[str, int] = {}
        if self.num_nodes > 1:
            for node in range(self.num_nodes):
                for rail in range(self.nics_per_node):
                    leaf = self.leaf_name(node, rail)
                    out[leaf] = out.get(leaf, 0) + 1
        return out

    def has_spine(self) -> bool:
        """Whether the leaves have trunks to a spine (more than one leaf)."""
        return self._num_leaves() > 1

    def _num_leaves(self) -> int:
        if self.num_nodes <= 1:
            return 0
        d = self.leaf_down_ports
        if self.rail_optimized:
            return self.nics_per_node * -(-self.num_nodes // d)
        return -(-self.num_nodes * self.nics_per_node // d)

    def _is_leaf(self, idx: tuple[int, ...]) -> bool:
        if self.num_nodes <= 1:
            return False
        if self.rail_optimized:
            return len(idx) == 2 and idx[0] < self.nics_per_node and idx[1] * self.leaf_down_ports < self.num_nodes
        return len(idx) == 1 and idx[0] * self.leaf_down_ports < self.num_nodes * self.nics_per_node

    def kind(self, link: object) -> str | None:
        """"nvlink", "pcie", "nic" or "leaf-spine" for a link of this cluster (either direction), else None."""
        if not (isinstance(link, tuple) and len(link) == 2):
            return None
        a, b = _split(link[0]), _split(link[1])
        if a is None or b is None:
            return None
        if PREFIXES.index(a[0]) > PREFIXES.index(b[0]):
            a, b = b, a
        (pa, ia), (pb, ib) = a, b
        g, gpus = self.gpus_per_node, self.num_nodes * self.gpus_per_node
        if pa in ("gpu", "pcie") and (len(ia) != 1 or ia[0] >= gpus):
            return None
        if (pa, pb) == ("gpu", "nvs"):
            return "nvlink" if ib == (ia[0] // g,) else None
        if (pa, pb) == ("gpu", "pcie"):
            return "pcie" if ib == ia else None
        if (pa, pb) == ("pcie", "host"):
            return "pcie" if ib == (ia[0] // g,) else None
        if (pa, pb) == ("pcie", "nic"):
            return "pcie" if ib == (ia[0] // g, self.rail(ia[0])) else None
        if (pa, pb) == ("nic", "leaf"):
            leaf = link[0] if link[0].startswith("leaf") else link[1]
            ok = (self.num_nodes > 1 and len(ia) == 2 and ia[0] < self.num_nodes and ia[1] < self.nics_per_node
                  and leaf == self.leaf_name(*ia))
            return "nic" if ok else None
        if (pa, pb) == ("leaf", "spine"):
            return "leaf-spine" if not ib and self._is_leaf(ia) and self.has_spine() else None
        return None

    def links(self) -> Iterator[tuple[tuple[str, str], str]]:
        """Every directed link and its kind, in the topology's order: per GPU its NVSwitch, PCIe-switch,
        host and NIC links both ways; per node and rail the NIC's leaf link both ways; per leaf (sorted)
        its trunk to the spine both ways."""
        g = self.gpus_per_node
        for r in range(self.num_nodes * g):
            node = r // g
            gpu, nvs, pcie, host, nic = f"gpu{r}", f"nvs{node}", f"pcie{r}", f"host{node}", f"nic{node}.{self.rail(r)}"
            yield from (((gpu, nvs), "nvlink"), ((nvs, gpu), "nvlink"), ((gpu, pcie), "pcie"), ((pcie, gpu), "pcie"),
                        ((pcie, host), "pcie"), ((host, pcie), "pcie"), ((pcie, nic), "pcie"), ((nic, pcie), "pcie"))
        if self.num_nodes > 1:
            for node in range(self.num_nodes):
                for rail in range(self.nics_per_node):
                    nic, leaf = f"nic{node}.{rail}", self.leaf_name(node, rail)
                    yield from (((nic, leaf), "nic"), ((leaf, nic), "nic"))
            leaves = sorted(self.leaves())
            if len(leaves) > 1:
                for leaf in leaves:
                    yield from (((leaf, SPINE), "leaf-spine"), ((SPINE, leaf), "leaf-spine"))


class LinkTable(dict):
    """LinkId -> ``values[kind]`` for every link of ``layout``; an entry is made on its first lookup
    (``__missing__``; a KeyError for a pair that is no link) or membership test; iterating,
    sizing, comparing, copying or pickling fills in every link first, in ``LinkLayout.links`` order."""

    def __init__(self, layout: LinkLayout, values: Mapping[str, float]) -> None:
        super().__init__()
        self.layout, self.values_by_kind = layout, dict(values)
        self._complete = False

    def __missing__(self, link: object) -> float:
        kind = self.layout.kind(link)
        if kind is None:
            raise KeyError(link)
        value = self[link] = self.values_by_kind[kind]
        return value

    def __contains__(self, link: object) -> bool:
        """Whether ``link`` is a link of the cluster (its entry is made on the way: it is about to be used)."""
        if dict.__contains__(self, link):
            return True
        kind = self.layout.kind(link)
        if kind is None:
            return False
        self[link] = self.values_by_kind[kind]
        return True

    def enter(self, known: list[tuple[tuple[str, str], str]]) -> None:
        """Make the entries of links whose kinds the caller knows (a route's links, by construction)."""
        values = self.values_by_kind
        for link, kind in known:
            if not dict.__contains__(self, link):
                dict.__setitem__(self, link, values[kind])

    def get(self, link: object, default: float | None = None) -> float | None:  # type: ignore[override]
        try:
            return self[link]
        except KeyError:
            return default

    def fill(self) -> "LinkTable":
        """Every link's entry, re-inserted in the layout's order (once)."""
        if not self._complete:
            values = self.values_by_kind
            entries = [(link, values[kind]) for link, kind in self.layout.links()]
            dict.clear(self)
            dict.update(self, entries)
            self._complete = True
        return self

    def __iter__(self):
        return dict.__iter__(self.fill())

    def __len__(self) -> int:
        return dict.__len__(self.fill())

    def __bool__(self) -> bool:
        return True  # every GPU has links (build_topology refuses a cluster without GPUs)

    def __eq__(self, other: object) -> bool:
        return dict.__eq__(self.fill(), other.fill() if isinstance(other, LinkTable) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __reversed__(self):
        return dict.__reversed__(self.fill())

    def keys(self):  # type: ignore[override]
        return dict.keys(self.fill())

    def values(self):  # type: ignore[override]
        return dict.values(self.fill())

    def items(self):  # type: ignore[override]
        return dict.items(self.fill())

    def copy(self) -> dict:  # type: ignore[override]
        return dict(dict.items(self.fill()))

    def __reduce__(self):
        return dict, (self.copy(),)
