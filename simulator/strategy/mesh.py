"""DeviceMesh: rank placement over the (pp, dp, cp, tp) axes and the process groups of each axis.

Megatron-LM's default order "tp-cp-ep-dp-pp": TP varies fastest, so a TP group of <= 8 ranks sits
inside one DGX node, and pipeline stages are the slowest axis (Narayanan et al. 2021 §3.3:
tensor parallelism inside a node, pipeline across nodes). Expert parallelism is carved out of the
dp x cp ranks of a stage (Megatron-Core MoE): EP groups are ``ep`` consecutive (dp, cp) indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property


@dataclass(frozen=True)
class DeviceMesh:
    pp: int
    dp: int
    cp: int
    tp: int
    ep: int = 1

    @property
    def size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp) indices of a global rank."""
        tp = rank % self.tp
        rest = rank // self.tp
        cp = rest % self.cp
        rest //= self.cp
        dp = rest % self.dp
        return rest // self.dp, dp, cp, tp

    def stage_of(self, rank: int) -> int:
        return self.coords(rank)[0]

    def representative(self, stage: int) -> int:
        """The rank simulated for a pipeline stage in symmetric mode: dp = cp = tp = 0."""
        return self.rank(pp=stage)

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """Ranks of ``rank``'s group along one axis, in ring order (memoised: lowering asks often)."""
        return _group(self, axis, rank)

    def _build_group(self, axis: str, rank: int) -> tuple[int, ...]:
        pp, dp, cp, tp = self.coords(rank)
        if axis == "tp":
            return tuple(self.rank(pp, dp, cp, t) for t in range(self.tp))
        if axis == "cp":
            return tuple(self.rank(pp, dp, c, tp) for c in range(self.cp))
        if axis == "dp":
            return tuple(self.rank(pp, d, cp, tp) for d in range(self.dp))
        if axis == "pp":
            return tuple(self.rank(p, dp, cp, tp) for p in range(self.pp))
        if axis == "dp_cp":  # gradient reduction of dense parameters: CP joins DP
            return tuple(self.rank(pp, d, c, tp) for d in range(self.dp) for c in range(self.cp))
        flat = dp * self.cp + cp  # index along the combined dp x cp axis
        if axis == "ep":
            first = flat - flat % self.ep
            return tuple(self._dpcp_rank(pp, i, tp) for i in range(first, first + self.ep))
        if axis == "edp":  # expert-data-parallel: same experts, reduced together
            return tuple(self._dpcp_rank(pp, i, tp) for i in range(flat % self.ep, self.dp * self.cp, self.ep))
        raise ValueError(f"unknown mesh axis {axis!r}; known: tp, cp, dp, pp, dp_cp, ep, edp")

    def _dpcp_rank(self, pp: int, flat: int, tp: int) -> int:
        return self.rank(pp, flat // self.cp, flat % self.cp, tp)

    @cached_property
    def representatives(self) -> tuple[int, ...]:
        return tuple(self.representative(s) for s in range(self.pp))


@cache
def _group(mesh: DeviceMesh, axis: str, rank: int) -> tuple[int, ...]:
    return mesh._build_group(axis, rank)
