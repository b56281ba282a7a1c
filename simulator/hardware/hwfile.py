"""Hardware as data: GPU and cluster descriptions from TOML tables, checked field by field.

A GPU table (a file under data/hardware/gpus/, or a scenario's ``[gpu]``) and a cluster table (a file
under data/hardware/clusters/, the file a scenario names with ``cluster.hardware``, or the scenario's
``[cluster]`` overrides) become GPUSpec / ClusterSpec. Every bad value is a ValueError whose one-line
message names the field and the value (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path

from ..units import GB, MiB, TFLOP, gbit_per_s_to_bytes_per_s
from .clusters import CLUSTER_PRESETS, FABRICS, TOPOLOGIES, ClusterSpec
from .gpus import ARCHITECTURES, GPU_PRESETS, NVLS_ARCHITECTURES, GPUSpec
from .nccl_vars import parse_nccl_env

DTYPES = ("fp32", "bf16", "fp16", "fp8", "fp4")
_GPU_KEYS = ("preset", "name", "architecture", "peak_tflops", "hbm_bandwidth_GBps", "memory_capacity_MiB",
             "memory_capacity_GB", "tdp_W", "boost_clock_MHz", "sustained_clock_MHz",
             "power_limit_W", "idle_power_W", "speed_spread_frac")
# A spread of one SKU's speeds beyond this is not manufacturing variability (Sinha et al. SC22's largest
# cluster-average variation, 22%, is 4 IQR = 5.4 standard deviations: 4%); it is a mixed fleet.
MAX_SPEED_SPREAD_FRAC = 0.1
# [cluster] key -> (ClusterSpec field, converter to SI); counts and choices are handled apart.
_CLUSTER_RATES = {"nvlink_bandwidth_GBps": ("nvlink_bandwidth_Bps", lambda v: v * GB),
                  "nic_bandwidth_Gbps": ("nic_bandwidth_Bps", gbit_per_s_to_bytes_per_s),
                  "pcie_bandwidth_GBps": ("pcie_bandwidth_Bps", lambda v: v * GB)}
_CLUSTER_COUNTS = ("num_nodes", "gpus_per_node", "nics_per_node")
CLUSTER_KEYS = ("preset", "name", "gpu", *_CLUSTER_COUNTS, *_CLUSTER_RATES, "fabric", "nvls",
                "topology", "oversubscription", "nccl_env")


# No hardware quantity in these files' units (Gbps, GB/s, GB, MiB, TFLOP/s, MHz, W, ratios) comes near
# 1e9: a larger value is a typo, and would overflow once scaled to bytes or FLOP/s
MAX_QUANTITY = 1e9


def _number(where: str, key: str, value, minimum: float = 0.0, strict: bool = True) -> float:
    """A finite float > minimum (>= when not strict) and <= MAX_QUANTITY; ints are accepted, bools and
    text are not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}.{key} must be a number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > minimum if strict else v >= minimum)
    if not ok:
        rel = ">" if strict else ">="
        raise ValueError(f"{where}.{key} must be a finite number {rel} {minimum:g}, got {value!r}")
    if v > MAX_QUANTITY:
        raise ValueError(f"{where}.{key} = {value!r} is out of range (at most {MAX_QUANTITY:g} in its unit)")
    return v


def _count(where: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}.{key} must be a positive integer, got {value!r}")
    return value


def _choice(where: str, key: str, value, known: tuple[str, ...]) -> str:
    if value not in known:
        raise ValueError(f"{where}.{key} {value!r} is unknown; known: {', '.join(known)}")
    return value


def _check_keys(where: str, table: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"[{where}] unknown key(s) {unknown}; known: {', '.join(known)}")


def _peaks(where: str, table) -> dict:
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{where}.peak_tflops must be a table of dtype = TFLOP/s, got {table!r}")
    out = {}
    for dtype, value in table.items():
        _choice(f"{where}.peak_tflops", "dtype", dtype, DTYPES)
        out[dtype] = _number(f"{where}.peak_tflops", dtype, value) * TFLOP
    return out


def _table_base(where: str, table, known: tuple[str, ...], presets, base):
    """The checks every hardware table opens with: a table, only ``known`` keys, the ``preset`` it
    names (else ``base``); returns (base, fields holding the checked ``name``)."""
    if not isinstance(table, dict):
        raise ValueError(f"[{where}] must be a table, got {table!r}")
    _check_keys(where, table, known)
    if "preset" in table:
        base = presets.get(table["preset"]) if isinstance(table["preset"], str) else None
        if base is None:
            raise ValueError(f"{where}.preset {table['preset']!r} is unknown; known: {', '.join(presets)}")
    fields: dict = {}
    if "name" in table:
        if not isinstance(table["name"], str) or not table["name"]:
            raise ValueError(f"{where}.name must be a non-empty string, got {table['name']!r}")
        fields["name"] = table["name"]
    return base, fields


def gpu_from_table(table: dict, where: str = "gpu", base: GPUSpec | None = None) -> GPUSpec:
    """A GPU from a table of datasheet fields; ``preset`` (or ``base``) gives the fields not set."""
    base, fields = _table_base(where, table, _GPU_KEYS, GPU_PRESETS, base)
    if "memory_capacity_MiB" in table and "memory_capacity_GB" in table:
        raise ValueError(f"{where}: give memory_capacity_MiB or memory_capacity_GB, not both")
    if "architecture" in table:
        fields["architecture"] = _choice(where, "architecture", table["architecture"], ARCHITECTURES)
    if "peak_tflops" in table:
        fields["peak_flops_per_s"] = {**(base.peak_flops_per_s if base else {}),
                                      **_peaks(where, table["peak_tflops"])}
    if "hbm_bandwidth_GBps" in table:
        fields["hbm_bandwidth_Bps"] = _number(where, "hbm_bandwidth_GBps", table["hbm_bandwidth_GBps"]) * GB
    for key, unit in (("memory_capacity_MiB", MiB), ("memory_capacity_GB", GB)):
        if key in table:
            fields["memory_capacity_bytes"] = _number(where, key, table[key]) * unit
    for key in ("tdp_W", "boost_clock_MHz", "sustained_clock_MHz", "power_limit_W", "idle_power_W"):
        if key in table:
            fields[key] = _number(where, key, table[key], strict=False)
    if "speed_spread_frac" in table:
        spread = fields["speed_spread_frac"] = _number(where, "speed_spread_frac", table["speed_spread_frac"],
                                                       strict=False)
        if spread > MAX_SPEED_SPREAD_FRAC:
            raise ValueError(f"{where}.speed_spread_frac = {spread:g} is above {MAX_SPEED_SPREAD_FRAC:g} "
                             f"(a standard deviation of one SKU's speeds, as a fraction of the median)")
    if base is not None:
        return _check_clocks(where, replace(base, **fields))
    missing = [k for k, f in (("name", "name"), ("architecture", "architecture"), ("peak_tflops", "peak_flops_per_s"),
                              ("hbm_bandwidth_GBps", "hbm_bandwidth_Bps"),
                              ("memory_capacity_MiB or memory_capacity_GB", "memory_capacity_bytes")) if f not in fields]
    if missing:
        raise ValueError(f"[{where}] needs {', '.join(missing)} (or a preset)")
    if "bf16" not in fields["peak_flops_per_s"]:
        raise ValueError(f"{where}.peak_tflops needs bf16; got {', '.join(fields['peak_flops_per_s'])}")
    return _check_clocks(where, GPUSpec(**fields))


def _check_clocks(where: str, gpu: GPUSpec) -> GPUSpec:
    """A sustained clock above the boost clock is a typo (the boost clock is the most the SMs run at);
    a power limit needs the TDP it lowers and cannot exceed it."""
    if gpu.boost_clock_MHz and gpu.sustained_clock_MHz > gpu.boost_clock_MHz:
        raise ValueError(f"{where}.sustained_clock_MHz = {gpu.sustained_clock_MHz:g} exceeds boost_clock_MHz = "
                         f"{gpu.boost_clock_MHz:g}")
    if gpu.power_limit_W and not gpu.tdp_W:
        raise ValueError(f"{where}.power_limit_W = {gpu.power_limit_W:g} needs the GPU's tdp_W")
    if gpu.power_limit_W > gpu.tdp_W:
        raise ValueError(f"{where}.power_limit_W = {gpu.power_limit_W:g} exceeds tdp_W = {gpu.tdp_W:g}")
    if gpu.idle_power_W and not gpu.tdp_W:
        raise ValueError(f"{where}.idle_power_W = {gpu.idle_power_W:g} needs the GPU's tdp_W")
    limit = gpu.power_limit_W or gpu.tdp_W  # a limit is at most the TDP (checked above)
    if gpu.idle_power_W and gpu.idle_power_W >= limit:
        raise ValueError(f"{where}.idle_power_W = {gpu.idle_power_W:g} must be below the power limit "
                         f"({limit:g} W; tdp_W and power_limit_W)")
    return gpu


def _cluster_gpu(where: str, value, base: GPUSpec | None) -> GPUSpec:
    if isinstance(value, str):
        if value not in GPU_PRESETS:
            raise ValueError(f"{where}.gpu {value!r} is unknown; known: {', '.join(GPU_PRESETS)}")
        return GPU_PRESETS[value]
    return gpu_from_table(value, f"{where}.gpu", base)


def cluster_from_table(table: dict, where: str = "cluster", base: ClusterSpec | None = None) -> ClusterSpec:
    """A cluster from its fields; ``preset`` (or ``base``) gives the fields not set. ``gpu`` is a GPU
    preset name or a GPU table. Checks every value and the NIC/GPU ratio."""
    base, f = _table_base(where, table, CLUSTER_KEYS, CLUSTER_PRESETS, base)
    if "gpu" in table:
        f["gpu"] = _cluster_gpu(where, table["gpu"], base.gpu if base else None)
    for key in _CLUSTER_COUNTS:
        if key in table:
            f[key] = _count(where, key, table[key])
    for key, (name, conv) in _CLUSTER_RATES.items():
        if key in table:
            f[name] = conv(_number(where, key, table[key]))
    if "oversubscription" in table:
        f["oversubscription"] = _number(where, "oversubscription", table["oversubscription"], 1.0, strict=False)
    if "fabric" in table:
        f["fabric"] = _choice(where, "fabric", table["fabric"], FABRICS)
    if "topology" in table:
        f["topology"] = _choice(where, "topology", table["topology"], TOPOLOGIES)
    if "nvls" in table:
        if not isinstance(table["nvls"], bool):
            raise ValueError(f"{where}.nvls must be true or false, got {table['nvls']!r}")
        f["nvls"] = table["nvls"]
    if "nccl_env" in table:
        f["nccl_env"] = parse_nccl_env(where, table["nccl_env"])
    if base is not None and "gpus_per_node" in f and "nics_per_node" not in f:
        # a preset node cut to fewer GPUs keeps at most one NIC per GPU (the default rule)
        f["nics_per_node"] = min(base.nics_per_node, f["gpus_per_node"])
    spec = replace(base, **f) if base is not None else _new_cluster(where, f)
    if spec.nics_per_node > spec.gpus_per_node:
        raise ValueError(f"{where}.nics_per_node ({spec.nics_per_node}) exceeds gpus_per_node "
                         f"({spec.gpus_per_node}); each NIC serves at least one GPU")
    if spec.nvls and spec.gpu.architecture not in NVLS_ARCHITECTURES:
        raise ValueError(f"{where}.nvls = true needs NVLink SHARP (third-generation NVSwitch, Hopper and "
                         f"later); gpu {spec.gpu.name} is {spec.gpu.architecture}")
    return spec


def _new_cluster(where: str, f: dict) -> ClusterSpec:
    required = {"name": "name", "gpu": "gpu", "gpus_per_node": "gpus_per_node",
                "nvlink_bandwidth_GBps": "nvlink_bandwidth_Bps", "nics_per_node": "nics_per_node",
                "nic_bandwidth_Gbps": "nic_bandwidth_Bps", "pcie_bandwidth_GBps": "pcie_bandwidth_Bps",
                "nvls": "nvls"}
    missing = [k for k, name in required.items() if name not in f]
    if missing:
        raise ValueError(f"[{where}] needs {', '.join(missing)} (or a preset)")
    f.setdefault("num_nodes", 1)
    return ClusterSpec(**f)


def read_text(path: str | Path, what: str) -> str:
    """A user's text file (scenario, hardware file, validation CSV): one-line errors naming ``what``
    and the path when it is missing, a folder, or not UTF-8 text."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what} {str(p)!r} is a folder, not a file")
    if not p.is_file():
        raise ValueError(f"{what} {str(p)!r} does not exist")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {str(p)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _read_toml(path: Path) -> dict:
    p = Path(path)
    text = read_text(p, "hardware file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"hardware file {p}: malformed TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ValueError(f"hardware file {p}: malformed TOML: arrays or tables nested too deeply") from None


def read_gpu_file(path: str | Path) -> GPUSpec:
    return gpu_from_table(_read_toml(Path(path)), f"{Path(path).name}: gpu")


def read_cluster_file(path: str | Path) -> ClusterSpec:
    """A cluster file: the fields of ``cluster_from_table``, ``gpu`` a preset name or a [gpu] table."""
    return cluster_from_table(_read_toml(Path(path)), f"{Path(path).name}: cluster")
