"""Provenance of a calibration run: device name, driver, torch / CUDA / cuDNN versions, clocks, threads,
date and the command, written as the header of every table."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path


def _cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_clock() -> str:
    freq = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
    if freq.is_file():
        return f"{int(freq.read_text()) / 1000:.0f} MHz (cpu0 scaling_cur_freq)"
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("cpu MHz"):
                return f"{float(line.split(':', 1)[1]):.0f} MHz (/proc/cpuinfo)"
    return "unknown"


def _nvidia_smi(index: int) -> dict:
    """Driver and clocks as nvidia-smi reports them (empty when it is not installed)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    fields = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit"
    try:
        out = subprocess.run([exe, f"--id={index}", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    vals = [v.strip() for v in out.split(",")]
    if len(vals) != 6:
        return {}
    return {"driver": vals[0], "clocks": f"sm {vals[1]}, mem {vals[2]} (max sm {vals[3]}, mem {vals[4]})",
            "power_limit": vals[5]}


def device_provenance(device: str, command: str) -> dict:
    """The provenance header of a table written on ``device``."""
    import torch

    prov: dict = {}
    if device.startswith("cuda"):
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        prov["device"] = torch.cuda.get_device_name(idx)
        prov["device_count"] = torch.cuda.device_count()
        prov["sm_count"] = props.multi_processor_count
        prov["memory_bytes"] = props.total_memory
        smi = _nvidia_smi(idx)
        prov["driver"] = smi.get("driver", "unknown (nvidia-smi not found)")
        prov["clocks"] = smi.get("clocks", "unknown")
        prov["cuda"] = torch.version.cuda
        prov["cudnn"] = torch.backends.cudnn.version()
        nccl = torch.cuda.nccl.version()  # a tuple (2, 21, 5); an int (2708) in old releases
        prov["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        prov["timing"] = ("3 warm-up calls, then 5 batches queued behind torch.cuda._sleep, CUDA events around"
                          " each batch; median of the per-call batch means")
    else:
        prov["device"] = f"cpu: {_cpu_name()}"
        prov["driver"] = platform.platform()
        prov["clocks"] = _cpu_clock()
        prov["cuda"] = "none"
        prov["timing"] = "time.perf_counter per call after 3 warm-up calls; median"
    prov["torch"] = torch.__version__
    prov["threads"] = torch.get_num_threads()
    prov["python"] = platform.python_version()
    prov["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    prov["command"] = command
    return prov


def device_slug(device: str) -> str:
    """A folder name for the device's tables: "nvidia-h100-80gb-hbm3", "cpu"."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.cuda.current_device())
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return "cpu"
