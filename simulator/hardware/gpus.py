"""GPU specifications: dense peak FLOP/s per dtype, HBM bandwidth and capacity, power and clock.

The presets are data: one TOML file per GPU under simulator/data/hardware/gpus/, each figure with
its datasheet source in a comment, read on first use (``hardware/hwfile``). A scenario describes
its own GPU with a ``[gpu]`` table of the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from .preset_files import PresetFiles

# How much one GPU's sustained speed differs from its SKU's median under power management (manufacturing
# variability: at the same power limit a leakier die holds a lower clock). Sinha et al., "Not All GPUs Are
# Created Equal", SC22 (arXiv 2208.11035): over 90% of the GPUs of five clusters (V100 and MI60; SGEMM,
# ResNet-50, BERT, LAMMPS, PageRank) performance varies by 8% on average "regardless of application,
# cluster, GPU vendor, and cooling method", with outliers beyond. Their variation is the box plot's
# whisker range over the median, (Q3 + 1.5 IQR) - (Q1 - 1.5 IQR) = 4 IQR (the paper's artifact,
# hal-uw/gpu_variability_sc22_artifact, plot_script/plot_aggregated.py); a normal's IQR is 1.349
# standard deviations, so one standard deviation is 0.08 / (4 x 1.349) = 1.48% of the median (derived).
GPU_SPEED_SPREAD_FRAC = 0.08 / (4 * 1.349)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_flops_per_s: dict  # dtype -> dense tensor-core peak, FLOP/s
    hbm_bandwidth_Bps: float
    memory_capacity_bytes: float
    architecture: str  # "ampere" | "hopper" | "blackwell": selects efficiency tables in cost/
    tdp_W: float = 0.0  # board power limit (max TDP), watts; 0 = not stated
    boost_clock_MHz: float = 0.0  # maximum boost clock (nvidia-smi max SM clock); 0 = not stated
    # SM clock held under sustained tensor-core training load at the board power limit; the tensor-core
    # peaks scale by it over the clock the datasheet quotes them at (cost/compute); 0 = not measured:
    # the datasheet peaks hold
    sustained_clock_MHz: float = 0.0
    # power limit set below the TDP (nvidia-smi -pl; Meta's Grand Teton H100 run at 500 W): the clock
    # held under load falls with it (cost/clocks.held_clock_MHz); 0 = the TDP
    power_limit_W: float = 0.0
    # board power at idle (nvidia-smi power.draw at the idle SM clock): the part of the power a limit
    # cannot take from the SMs' clock (cost/clocks.held_clock_MHz); 0 = not measured
    idle_power_W: float = 0.0
    # standard deviation of one unit's sustained tensor-core speed across the units of the SKU, as a
    # fraction of the median (GPU_SPEED_SPREAD_FRAC); a synchronous job runs at its slowest GPU's pace
    # (cost/clocks.slowest_speed_ratio); 0 = every unit alike
    speed_spread_frac: float = GPU_SPEED_SPREAD_FRAC

    def peak(self, dtype: str) -> float:
        try:
            return self.peak_flops_per_s[dtype]
        except KeyError:
            raise ValueError(f"gpu {self.name} has no peak for dtype {dtype!r}; "
                             f"known: {', '.join(self.peak_flops_per_s)}") from None


ARCHITECTURES = ("ampere", "hopper", "blackwell")
# FP8 tensor cores came with Hopper (H100 whitepaper: the Transformer Engine's FP8); NVLink SHARP, the
# in-switch reduction NVLS uses, with its third-generation NVSwitch (same whitepaper).
FP8_ARCHITECTURES = ("hopper", "blackwell")
NVLS_ARCHITECTURES = ("hopper", "blackwell")

GPU_PRESETS: PresetFiles = PresetFiles("gpus")
