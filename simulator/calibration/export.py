"""A simulated run written as a torch.profiler (Kineto) trace of one rank: the reference input of the
trace importer, ``calibrate compare`` and ``calibrate fit``.

Each simulated op of the rank becomes the kernels a PyTorch training step launches for it (a forward
GEMM one ``aten::mm``, its backward the input- and weight-gradient GEMMs, fused attention, norms and
vector ops), each launched from a CPU op carrying ``Input Dims`` as ``record_shapes`` records them and,
optionally, our ``sim:<microbatch>:<layer>:<op>`` annotation; collectives become NCCL (or RCCL) kernels
on a communication stream. Steps repeat the simulated iteration, each inside ``ProfilerStep#k`` on the
CPU and on the GPU timeline. Kernel times are the simulated op times, so a compare of the export
against its own scenario gives a 0% error and a fit recovers the cost model's rates.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..units import S_TO_US
from .compare import PHASE_AS_MEASURED, sim_rank_of, simulated_ops
from .kernel_names import categorize
from .kineto import ANNOTATION_PREFIX, STEP_PREFIX
from .matching import SimOp, gemm_pass_shapes

if TYPE_CHECKING:  # type-only: the simulation loads where a command runs one (cli)
    from ..pipeline import RunResult

HOST_PID, MAIN_TID, COMM_TID = 1000, 1, 2
COMPUTE_STREAM_ID, COMM_STREAM_ID = 7, 20
# Kernel names of each family (as the vendors' libraries name them; see calibration/kernel_names).
KERNELS = {
    "nvidia": {"gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1",
               "attention": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>",
               "norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
               "elementwise": "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>",
               "nccl": "ncclDevKernel_{op}_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
               "launch": "cudaLaunchKernel", "device": "NVIDIA H100 80GB HBM3"},
    "amd": {"gemm": "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1",
            "attention": "void ck_tile::kentry<256, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVS>>",
            "norm": "MIOpenLayerNormFwd",
            "elementwise": "void at::native::elementwise_kernel<128, 4, at::native::AddFunctor<float>>",
            "nccl": "ncclKernel_{op}_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)",
            "launch": "hipLaunchKernel", "device": "AMD Instinct MI300X"},
}
_NCCL_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
               "all_to_all": "SendRecv", "send_recv": "SendRecv"}
# The older Kineto schema (torch 1.8) capitalises its categories and has no GPU annotations.
LEGACY = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "user_annotation": "user_annotation"}
_VECTOR_OPS = {"norm": "aten::native_layer_norm", "softmax": "aten::_softmax", "embedding": "aten::embedding",
               "loss": "aten::cross_entropy_loss", "optimizer": "aten::_fused_adamw_"}


def launches(s: SimOp) -> list[tuple[str, tuple, float]]:
    """(ATen op, its Input Dims, share of the op's time) of each kernel a simulated op launches."""
    w = s.work
    if w is None:
        raise ValueError(f"simulated op {s.name!r} carries no work to export")
    if s.kind == "gemm" and len(w.shape) == 3:
        shapes = gemm_pass_shapes(w.shape, s.pass_)
        return [("aten::mm", ((m, k), (k, n)), 1.0 / len(shapes)) for m, n, k in shapes]
    if s.kind == "attention" and len(w.shape) == 5:
        b, h, sq, skv, hd = w.shape
        q, kv = (b, h, sq, hd), (b, h, skv, hd)
        if s.phase == "F":
            return [("aten::_scaled_dot_product_flash_attention", (q, kv, kv), 1.0)]
        return [("aten::_scaled_dot_product_flash_attention_backward", (q, q, kv, kv), 1.0)]
    op = _VECTOR_OPS.get(s.kind, "aten::add")
    return [(op + ("_backward" if s.phase == "B" and s.kind == "norm" else ""), (tuple(w.shape),), 1.0)]


class _Writer:
    """Accumulates Chrome events (times in seconds, written in microseconds)."""

    def __init__(self, schema: str, vendor: str, offset_us: float) -> None:
        self.events: list[dict] = []
        self.legacy = schema == "legacy"
        self.names = KERNELS[vendor]
        self.offset_us = offset_us
        self.corr = 0

    def x(self, cat: str, name: str, pid: int, tid: int, a_s: float, b_s: float, **args) -> None:
        if self.legacy and cat == "gpu_user_annotation":
            return
        cat = LEGACY.get(cat, cat) if self.legacy else cat
        ts, end = self.offset_us + a_s * S_TO_US, self.offset_us + b_s * S_TO_US
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                            "dur": end - ts, "args": args})

    def kernel(self, name: str, stream: int, a_s: float, b_s: float, tid: int) -> None:
        self.corr += 1
        self.x("cuda_runtime", self.names["launch"], HOST_PID, tid, a_s, a_s + (b_s - a_s) * 1e-3,
               correlation=self.corr)
        self.x("kernel", name, 0, stream, a_s, b_s, stream=stream, correlation=self.corr, device=0)


def _write_op(w: _Writer, s: SimOp, annotate: bool) -> None:
    a, b = s.start_s, s.end_s
    if b <= a:
        return
    if s.phase == "B":
        w.x("cpu_op", f"autograd::engine::evaluate_function: {s.name}Backward0", HOST_PID, MAIN_TID, a, b)
    if annotate:
        w.x("user_annotation", f"{ANNOTATION_PREFIX}{s.microbatch}:{s.layer}:{s.name}", HOST_PID, MAIN_TID, a, b)
    span = b - a
    for op, dims, share in launches(s):
        e = a + span * share
        w.x("cpu_op", op, HOST_PID, MAIN_TID, a, e, **{"Input Dims": [list(d) for d in dims]})
        cls = categorize(op) if categorize(op) in ("gemm", "attention", "norm") else "elementwise"
        w.kernel(w.names[cls], COMPUTE_STREAM_ID, a, e, MAIN_TID)
        a = e


def _write_comm(w: _Writer, result: RunResult, rank: int) -> None:
    sim = result.sim
    for t in result.graph.tasks:
        if t.rank != rank or t.comm is None or t.comm.axis == "host":
            continue
        a, b = sim.start_s[t.id], sim.end_s[t.id]
        if b <= a:
            continue
        phase = PHASE_AS_MEASURED.get(t.phase, "B") or "B"
        w.x("user_annotation", {"F": "## forward ##", "B": "## backward ##", "O": "## optimizer ##"}[phase],
            HOST_PID, COMM_TID, a, b)
        w.x("user_annotation", f"nccl:{t.comm.op}", HOST_PID, COMM_TID, a, b)
        w.kernel(w.names["nccl"].format(op=_NCCL_NAMES.get(t.comm.op, "SendRecv")), COMM_STREAM_ID, a, b, COMM_TID)


def kineto_doc(result: RunResult, rank: int = 0, steps: int = 3, annotate: bool = True, schema: str = "current",
               vendor: str = "nvidia") -> dict:
    """The simulated run's rank ``rank`` (its pipeline stage's representative) as a Kineto trace dict."""
    if schema not in ("current", "legacy") or vendor not in KERNELS or steps < 1:
        raise ValueError(f"schema {schema!r} (current | legacy), vendor {vendor!r} ({' | '.join(KERNELS)}), "
                         f"steps {steps} (>= 1)")
    sim_rank, _ = sim_rank_of(result.plan, rank)
    _, ops = simulated_ops(result, sim_rank)
    period_s = result.metrics["iteration_time_s"]
    w = _Writer(schema, vendor, offset_us=1.0e6)
    for k in range(steps):
        if k:  # the next step starts exactly where the last one's span ends (ts + dur, same float sum)
            w.offset_us += period_s * S_TO_US
        w.x("user_annotation", f"{STEP_PREFIX}{k}", HOST_PID, MAIN_TID, 0.0, period_s)
        w.x("gpu_user_annotation", f"{STEP_PREFIX}{k}", 0, COMPUTE_STREAM_ID, 0.0, period_s)
        opt = [s for s in ops if s.phase == "O"]
        if opt:
            w.x("cpu_op", "Optimizer.step#AdamW.step", HOST_PID, MAIN_TID, opt[0].start_s, opt[-1].end_s)
        for s in ops:
            _write_op(w, s, annotate)
        _write_comm(w, result, sim_rank)
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank,
                                                    "world_size": result.plan.mesh.size},
            "deviceProperties": [{"id": 0, "name": KERNELS[vendor]["device"]}],
            "traceName": f"{result.scenario.name} (simulated, exported by simulator.calibration.export)",
            "traceEvents": w.events}


def write_kineto(doc: dict, path: str | Path) -> Path:
    """Write a trace dict as JSON (gzip-compressed when the name ends with .gz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    return path
