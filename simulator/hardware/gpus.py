"""GPU specifications: dense peak FLOP/s per dtype, HBM bandwidth and capacity, from datasheets.

Sources:
- A100: NVIDIA A100 Tensor Core GPU datasheet (2021): BF16/FP16 dense 312 TFLOP/s, TF32 156,
  HBM2e 2,039 GB/s (80GB SXM) and HBM2 1,555 GB/s (40GB SXM).
- H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet (2023): BF16/FP16 dense 989.4 TFLOP/s
  (1,979 with 2:4 sparsity), FP8 dense 1,979, TF32 494.7, HBM3 3.35 TB/s, 80 GB.
- H200 SXM: NVIDIA H200 datasheet (2024): H100 compute, HBM3e 4.8 TB/s, 141 GB.
Capacity is the usable device memory nvidia-smi reports: 81,920 MiB on A100 80GB, 81,559 MiB
on H100 80GB, 143,771 MiB on H200, 40,960 MiB on A100 40GB.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import GB, MiB, TFLOP


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_flops_per_s: dict  # dtype -> dense tensor-core peak, FLOP/s
    hbm_bandwidth_Bps: float
    memory_capacity_bytes: float
    architecture: str  # "ampere" | "hopper": selects efficiency tables in cost/

    def peak(self, dtype: str) -> float:
        try:
            return self.peak_flops_per_s[dtype]
        except KeyError:
            raise ValueError(f"gpu {self.name} has no peak for dtype {dtype!r}; "
                             f"known: {', '.join(self.peak_flops_per_s)}") from None


_A100_PEAK = {"bf16": 312 * TFLOP, "fp16": 312 * TFLOP, "fp32": 156 * TFLOP}
_H100_PEAK = {"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP, "fp8": 1978.9 * TFLOP,
              "fp32": 494.7 * TFLOP}

GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("a100-sxm4-40gb", _A100_PEAK, 1555 * GB, 40960 * MiB, "ampere"),
        GPUSpec("a100-sxm4-80gb", _A100_PEAK, 2039 * GB, 81920 * MiB, "ampere"),
        GPUSpec("h100-sxm5-80gb", _H100_PEAK, 3350 * GB, 81559 * MiB, "hopper"),
        GPUSpec("h200-sxm-141gb", _H100_PEAK, 4800 * GB, 143771 * MiB, "hopper"),
    )
}
