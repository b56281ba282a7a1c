"""The SM clock a GPU holds under sustained tensor-core load, and what it gives the tensor-core rate.

Datasheet peaks are quoted at one clock; a GPU at its power limit holds a lower one under training
load (``GPUSpec.sustained_clock_MHz``, measured), lower still under a power limit set below its TDP
(``GPUSpec.power_limit_W``), and a higher one when part of its SMs idle (``power_limited_boost``).
One power rule serves the three: dynamic power goes as SMs x f x V^2 with the voltage following the
clock, so at a given power the clock goes as (power / busy SMs)^(1/3), never above the boost clock.
The units of one SKU do not hold the same clock at the same power (``GPUSpec.speed_spread_frac``), and
a synchronous job waits for its slowest GPU: ``slowest_speed_ratio``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from ..hardware.gpus import GPUSpec

if TYPE_CHECKING:
    from .compute import Efficiency


def held_clock_MHz(gpu: GPUSpec, eff: Efficiency) -> float:
    """SM clock the GPU holds under sustained tensor-core load: the measured ``sustained_clock_MHz``
    at its TDP (else the clock its datasheet peaks are quoted at), lowered where a ``power_limit_W``
    below the TDP is set by the rule of ``power_limited_boost``: dynamic power goes as f x V^2 with
    the voltage following the clock, so the clock goes as the cube root of the power above the board's
    idle draw (``idle_power_W``, measured; derived rule, measured on the lent H100 for the SM-count
    case; the idle draw stands for the static and HBM power, which grow under load, and the lent
    H100's kernel-mix powers fit a smaller exponent than 3 above 1.36 GHz, scenarios/calibration/h100/
    gpu_mix.csv: a low limit's clock is an upper bound). 0 where nothing is known: the datasheet peaks."""
    if not gpu.power_limit_W or gpu.power_limit_W >= gpu.tdp_W:
        return gpu.sustained_clock_MHz
    base = gpu.sustained_clock_MHz or (quoted_clock_Hz(gpu, eff) / 1e6 if eff.dense_flops_per_clock_per_sm else 0.0)
    idle = gpu.idle_power_W
    return base * ((gpu.power_limit_W - idle) / (gpu.tdp_W - idle)) ** (1.0 / 3.0)


def quoted_clock_Hz(gpu: GPUSpec, eff: Efficiency) -> float:
    """The clock the bf16 datasheet peak is quoted at: peak / (SMs x dense FLOP per SM clock)."""
    return gpu.peak("bf16") / (eff.num_sms * eff.dense_flops_per_clock_per_sm)


def sustained_clock_ratio(gpu: GPUSpec, eff: Efficiency) -> float:
    """Tensor-core rate held under sustained training load over the datasheet peak's: the held clock
    (``held_clock_MHz``: measured at the TDP, lowered by a power limit) over the clock the bf16 peak
    is quoted at. Memory-bound kernels keep the HBM bandwidth: the power limit pulls the SM clock
    down, not the memory clock. 1 where no sustained clock is known or it is above the quoted one."""
    if not eff.dense_flops_per_clock_per_sm:
        return 1.0
    held = held_clock_MHz(gpu, eff)
    if not held:
        return 1.0
    return min(1.0, held * 1e6 / quoted_clock_Hz(gpu, eff))


def power_limited_boost(gpu: GPUSpec, sms: int, busy_sms: int, held_MHz: float) -> float:
    """Clock gain of tensor-core work on ``busy_sms`` of ``sms`` SMs of a GPU whose full-GPU tensor load
    is held below its boost clock by the power limit (at ``held_MHz``, ``held_clock_MHz``): dynamic
    power goes as SMs x f x V^2 with the voltage following the clock, so at the same power the clock
    rises as (sms / busy_sms)^(1/3), up to the boost clock. Measured on the lent H100 here
    (scenarios/calibration/h100/gpu_contention.csv): 8192^3 and 8192 x 28672 x 4096 BF16 GEMMs beside
    66 SMs held by other CTAs take 1.53x and 1.59x their time, not 2x (this rule with its waves: 1.63x,
    1.59x). 1 for GPUs with no held clock known."""
    if not held_MHz or not gpu.boost_clock_MHz or busy_sms >= sms:
        return 1.0
    return min(gpu.boost_clock_MHz / held_MHz, (sms / busy_sms) ** (1.0 / 3.0))


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals]: the integral of x n phi(x) Phi(x)^(n-1) over x
    (trapezoids of 0.01 on [-4, 9], within 1e-10 on this smooth integrand; Phi^(n-1) in logs): 0 for
    one, 1/sqrt(pi) for two, 3/(2 sqrt(pi)) for three, 3.24 for 1,000."""
    if n <= 1:
        return 0.0
    lo, step, last = -4.0, 0.01, 1300  # x from -4 to -4 + 1300 x 0.01 = 9
    total = 0.0
    for i in range(last + 1):
        x = lo + i * step
        cdf = 0.5 * math.erfc(-x / math.sqrt(2.0))
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        weight = 0.5 if i in (0, last) else 1.0
        total += weight * x * n * pdf * math.exp((n - 1) * math.log(cdf))
    return total * step


def slowest_speed_ratio(gpu: GPUSpec, num_gpus: int) -> float:
    """Tensor-core speed of the slowest of a job's ``num_gpus`` GPUs over its SKU's median: the units'
    speeds spread normally with ``gpu.speed_spread_frac`` (Sinha et al. SC22, see GPUSpec), and a
    synchronous step (TP collectives per layer, pipeline hand-offs, the gradient reduction) waits for
    the slowest; its expected speed is the median less the spread times the expected largest of
    ``num_gpus`` standard normals. Memory-bound kernels keep their pace: the power manager moves the
    SM clock, not the HBM's."""
    return 1.0 - gpu.speed_spread_frac * expected_max_normal(num_gpus)
