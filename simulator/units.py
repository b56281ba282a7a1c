"""Units and conversion constants: the only module that spells out 1e9, 2**30 or dtype sizes.

Everything inside the simulator is in seconds, bytes and FLOP/s; microseconds appear only at
the Chrome-trace boundary (``S_TO_US``).
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

TFLOP = 1e12
GFLOP = 1e9

S_TO_US = 1e6
US = 1e-6
NS = 1e-9
MS = 1e-3

BITS_PER_BYTE = 8

# Bytes per element of each training dtype (IEEE 754 / bfloat16 / OCP FP8 formats).
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Network line rates are quoted in Gb/s (10^9 bits per second)."""
    return gbit_per_s * 1e9 / BITS_PER_BYTE


def gbyte_per_s_to_bytes_per_s(gbyte_per_s: float) -> float:
    """Memory and NVLink bandwidths are quoted in GB/s (10^9 bytes per second)."""
    return gbyte_per_s * GB


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None
