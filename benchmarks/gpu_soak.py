"""Hold a CUDA GPU under a training step's kernel mix for minutes and record how its speed follows its
temperature: four Llama 3.1 8B layers (``gpu_layer.py``'s, sequence 8192, BF16) forward and backward back
to back for ``--seconds``, then, hot, the sustained 8192^3 BF16 and FP8 GEMMs of ``gpu_kernels.py``.

The kernel tables and the layer timings of ``scenarios/calibration/h100`` were taken within 15-30 s of
load, from a GPU at 40-60 C; a training run holds its GPUs at load for hours. At a fixed power limit a
hotter die leaks more, so the same power buys a lower clock: this script measures whether and by how
much the step slows between the first seconds and the thermal steady state.

    python benchmarks/gpu_soak.py --out DIR [--seconds 300] [--model llama3.1-8b]

Writes ``DIR/gpu_soak.json`` (provenance, the series per window: per-layer step time, SM clock, power,
GPU and HBM temperature, NVML clock-event reasons; the hot GEMM summaries) after every window, so a run
cut short keeps what it measured, and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import torch
from gpu_kernels import Sampler, bf16_gemm, fp8_gemm, provenance, summarize, sustained  # benchmarks/ on sys.path
from gpu_layer import LAYERS, MODELS, Layer

WINDOW_S = 2.0  # one series point
HOT_GEMM_S = 20.0  # each hot GEMM after the soak
# NVML clock-event reason bits (nvml.h nvmlClocksEventReason*): SW power cap, HW slowdown, SW thermal,
# HW thermal, HW power brake.
REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


class MemoryTemp(threading.Thread):
    """HBM temperature every ``period_s`` from nvidia-smi (NVML's GPU temperature is the die's)."""

    def __init__(self, period_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.period_s, self.samples, self._stop_flag = period_s, [], threading.Event()

    def run(self) -> None:
        while shutil.which("nvidia-smi") and not self._stop_flag.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=temperature.memory", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout.strip().splitlines()
            try:
                self.samples.append((time.perf_counter(), float(out[0])))
            except (IndexError, ValueError):
                pass
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop_flag.set()

    def at(self, t: float) -> float:
        before = [v for s, v in self.samples if s <= t]
        return before[-1] if before else float("nan")


def window(step, sampler: Sampler, mem: MemoryTemp, start: float) -> dict:
    """Per-layer median step time over WINDOW_S of back-to-back steps, with the GPU's state then."""
    t0, times = time.perf_counter(), []
    while time.perf_counter() - t0 < WINDOW_S:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(4)]
        for a, b in evs:
            a.record()
            step()
            b.record()
        torch.cuda.synchronize()  # keep the host within a few steps of the GPU
        times += [a.elapsed_time(b) * 1e-3 for a, b in evs]
    t1 = time.perf_counter()
    times.sort()
    state = sampler.window(t0, t1)
    state["reasons"] = [name for bit, name in REASONS.items() if state["reasons"] & bit]
    return dict(t_s=round(t0 - start, 1), per_layer_s=times[len(times) // 2] / LAYERS, hbm_C=mem.at(t1), **state)


def soak(model: str, seconds: float, sampler: Sampler, mem: MemoryTemp, doc: dict, path: Path) -> None:
    cfg = MODELS[model]
    layers = torch.nn.Sequential(*(Layer(**cfg) for _ in range(LAYERS)))
    shape = (cfg.get("mb", 1), cfg["seq"], cfg["hidden"])
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    def step():
        layers(x).backward(g)

    series = doc["soak"]["series"]
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        series.append(window(step, sampler, mem, start))
        path.write_text(json.dumps(doc, indent=1) + "\n")
        if len(series) % 15 == 1:
            r = series[-1]
            print(f"{r['t_s']:6.1f} s {r['per_layer_s'] * 1e3:7.3f} ms/layer {r['sm_MHz']:5.0f} MHz "
                  f"{r['power_W']:4.0f} W GPU {r['temp_C']:3.0f} C HBM {r['hbm_C']:3.0f} C {r['reasons']}", flush=True)
    first, last = series[:5], series[-max(5, len(series) // 6):]
    med = lambda rows, k: sorted(r[k] for r in rows)[len(rows) // 2]  # noqa: E731
    doc["soak"]["summary"] = {f"{tag}_{k}": med(rows, k) for tag, rows in (("first10s", first), ("last", last))
                              for k in ("per_layer_s", "sm_MHz", "power_W", "temp_C", "hbm_C")}
    doc["soak"]["summary"]["last_window_s"] = round(WINDOW_S * len(last), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--model", default="llama3.1-8b", choices=sorted(MODELS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_soak.json"
    sampler, mem = Sampler(), MemoryTemp()
    sampler.start()
    mem.start()
    doc: dict = {"provenance": provenance(sampler), "soak": {"model": dict(MODELS[args.model], name=args.model,
                                                                          layers=LAYERS), "series": []}}
    soak(args.model, args.seconds, sampler, mem, doc, path)
    print(json.dumps(doc["soak"]["summary"]), flush=True)
    torch.cuda.empty_cache()
    n = 8192
    for name, fn in (("hot_bf16", bf16_gemm(n, n, n, "fwd")), ("hot_fp8", fp8_gemm(n, n, n, True))):
        series = sustained(fn, 2.0 * n**3, HOT_GEMM_S, sampler)
        doc[name] = {"summary": summarize(series), "series": series}
        print(f"{name}: {json.dumps(doc[name]['summary'])}", flush=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
    sampler.stop()
    mem.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
