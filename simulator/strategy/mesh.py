"""DeviceMesh: rank placement over the (pp, dp, cp, tp) axes and the process groups of each axis.

Megatron-LM's default order "tp-cp-ep-dp-pp": TP varies fastest, so a TP group of <= 8 ranks sits
inside one DGX node, and pipeline stages are the slowest axis (Narayanan et al. 2021 §3.3:
tensor parallelism inside a node, pipeline across nodes). Expert parallelism is carved out of the
tp x cp x dp ranks of a stage as Megatron-Core's MoE parallel folding forms its groups
(megatron/core/parallel_state.py initialize_model_parallel: a second RankGenerator with tp = etp,
ep, dp = expert-data-parallel, cp = 1, the same "tp-cp-ep-dp-pp" order and the same pipeline
axis): a stage's local rank l = etp_i + etp·(ep_i + ep·edp_i), so EP groups stride etp, the
expert-data-parallel groups (EDP = tp·cp·dp / (ep·etp), the expert gradients' reduction) stride
etp·ep, and no expert group leaves its pipeline stage. With etp = tp (Megatron's default) EP groups
are ``ep`` consecutive (dp, cp) indices at one TP index.
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
    etp: int = 0  # expert tensor parallelism; 0 -> tp (Megatron-Core's expert_tensor_parallel_size default)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def stage_size(self) -> int:
        return self.dp * self.cp * self.tp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: tp·cp·dp / (ep·etp)."""
        return self.stage_size // (self.ep * self.expert_tp)

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
        if axis == "tp_dp_cp":  # every rank of the stage: Megatron-Core's FP8 amax reduction group
            return tuple(self.rank(pp, d, c, t) for d in range(self.dp) for c in range(self.cp) for t in range(self.tp))
        if axis in ("ep", "edp", "etp"):
            return self._expert_group(axis, rank)
        raise ValueError(f"unknown mesh axis {axis!r}; known: tp, cp, dp, pp, dp_cp, tp_dp_cp, ep, edp, etp")

    def _expert_group(self, axis: str, rank: int) -> tuple[int, ...]:
        """Megatron-Core's expert groups inside the rank's stage (module doc)."""
        s = self.stage_size
        base, local = rank - rank % s, rank % s
        etp, ep = self.expert_tp, self.ep
        t, e, d = local % etp, local // etp % ep, local // (etp * ep)
        if axis == "ep":
            return tuple(base + t + etp * (i + ep * d) for i in range(ep))
        if axis == "edp":
            return tuple(base + t + etp * (e + ep * i) for i in range(self.edp))
        return tuple(base + i + etp * (e + ep * d) for i in range(etp))

    @cached_property
    def representatives(self) -> tuple[int, ...]:
        return tuple(self.representative(s) for s in range(self.pp))


@cache
def _group(mesh: DeviceMesh, axis: str, rank: int) -> tuple[int, ...]:
    return mesh._build_group(axis, rank)
