"""Measure, on a CUDA GPU, the kernels whose rates the cost model assumes: sustained BF16 and FP8 GEMM
throughput with the SM clock and power they run at, GEMM shapes of today's layers in the three
layouts training runs (forward, input gradient, weight gradient), fused attention (FlashAttention and cuDNN
via torch's SDPA), memory-bound kernels (copy, add, RMSNorm, LayerNorm, SwiGLU, the FP8 cast), host launches.

    python benchmarks/gpu_kernels.py --out DIR [--sections gemm,attention,...] [--attn-seqs 16384,65536]

Writes ``DIR/gpu_kernels.csv`` (one row per measurement) and ``DIR/gpu_kernels.json`` (provenance,
the sustained-load time series, errors) and prints a summary. Needs torch with CUDA; clocks and power
come from NVML (nvidia-ml-py) or nvidia-smi. Each kernel runs back to back for at least
``MIN_TIME_S`` after its warm-up, after a sustained GEMM load: the clock a training step holds.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MIN_TIME_S = 0.15  # back-to-back measurement per kernel (median of per-call CUDA-event times)
# Each batch of 8 calls waits behind a sleep kernel (1 ms at 2 GHz) so kernels shorter than their launch
# run back to back and are timed as kernels (as calibration/profile.queued_cuda_times; the committed
# first run did not: its GEMMs under ~50 us are launch-bound).
QUEUE_SLEEP_CYCLES = 2_000_000
WARMUP_CALLS = 5
SUSTAIN_BF16_S = 30.0  # continuous 8192^3 BF16 GEMMs: time to reach the power-limited steady state
SUSTAIN_FP8_S = 15.0
CHUNK_S = 0.5  # sustained series resolution

# Layer GEMMs (tokens m, output n, inner k) as Megatron-Core runs them, micro-batch 1:
# Llama 3.1 8B TP1 seq 8192; Llama 3.1 70B TP4+SP seq 8192; GPT-3 175B TP8+SP seq 2048.
LAYER_GEMMS = (
    ("llama8b.qkv", 8192, 6144, 4096), ("llama8b.proj", 8192, 4096, 4096),
    ("llama8b.fc1", 8192, 28672, 4096), ("llama8b.fc2", 8192, 4096, 14336),
    ("llama8b.head", 8192, 128256, 4096),
    ("llama70b.tp4.qkv", 8192, 2560, 8192), ("llama70b.tp4.proj", 8192, 8192, 2048),
    ("llama70b.tp4.fc1", 8192, 14336, 8192), ("llama70b.tp4.fc2", 8192, 8192, 7168),
    ("gpt175b.tp8.qkv", 2048, 4608, 12288), ("gpt175b.tp8.proj", 2048, 12288, 1536),
    ("gpt175b.tp8.fc1", 2048, 6144, 12288), ("gpt175b.tp8.fc2", 2048, 12288, 6144),
)
SQUARES = (1024, 2048, 4096, 8192, 16384)
K_SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)  # 8192 x 8192 x k
WAVE_N_K = ((4608, 12288), (12288, 1536))  # GPT-3 175B TP 8: QKV and output projection
ATTN_TOKENS = 16384  # batch x sequence per attention measurement
ATTN_SEQS = (1024, 2048, 4096, 8192, 16384)
MEM_SHAPES = ((8192, 4096), (8192, 8192))

SECTIONS = ("sustained_bf16", "sustained_fp8", "gemm", "fp8_accum", "waves", "attention", "memory", "host")
FIELDS = ("section", "name", "dtype", "pass", "m", "n", "k", "time_s", "tflops", "gbps", "sm_MHz", "power_W")


class Sampler(threading.Thread):
    """SM clock, power, temperature and clock-event reasons every ``period_s``, from NVML or nvidia-smi."""

    def __init__(self, period_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.period_s, self.samples, self._stop_flag = period_s, [], threading.Event()
        self.source = "none"
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.source = "nvml"
        except Exception:  # noqa: BLE001 - no NVML: nvidia-smi, else no samples
            self._nvml = None
            if shutil.which("nvidia-smi"):
                self.source = "nvidia-smi"

    def read(self) -> tuple[float, float, float, int] | None:
        if self._nvml is not None:
            n, h = self._nvml, self._h
            reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                n.nvmlDeviceGetCurrentClocksThrottleReasons
            return (n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetPowerUsage(h) / 1e3,
                    n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU), int(reasons(h)))
        if self.source == "nvidia-smi":
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
            sm, pw, tc = (float(v) for v in out.splitlines()[0].split(","))
            return sm, pw, tc, 0
        return None

    def run(self) -> None:
        while not self._stop_flag.is_set():
            r = self.read()
            if r is not None:
                self.samples.append((time.perf_counter(),) + tuple(r))
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop_flag.set()

    def window(self, t0: float, t1: float) -> dict:
        """Median SM clock and power, max temperature, OR of the clock-event reasons in [t0, t1]."""
        rows = [s for s in self.samples if t0 <= s[0] <= t1] or self.samples[-1:]
        if not rows:
            return {"sm_MHz": float("nan"), "power_W": float("nan"), "temp_C": float("nan"), "reasons": 0}
        med = lambda i: sorted(r[i] for r in rows)[len(rows) // 2]  # noqa: E731
        reasons = 0
        for r in rows:
            reasons |= r[4]
        return {"sm_MHz": med(1), "power_W": med(2), "temp_C": max(r[3] for r in rows), "reasons": reasons}


def timed(fn) -> tuple[float, float, float]:
    """(median seconds per call, wall start, wall end) of back-to-back calls for at least MIN_TIME_S,
    in batches of 8 queued behind a sleep kernel."""
    for _ in range(WARMUP_CALLS):
        fn()
    torch.cuda.synchronize()
    times, t0 = [], time.perf_counter()
    while True:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(8)]
        torch.cuda._sleep(QUEUE_SLEEP_CYCLES)  # the GPU waits while the host queues the batch
        for a, b in evs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times += [a.elapsed_time(b) * 1e-3 for a, b in evs]
        if time.perf_counter() - t0 >= MIN_TIME_S and len(times) >= 16:
            break
    times.sort()
    return times[len(times) // 2], t0, time.perf_counter()


def sustained(fn, flops: float, seconds: float, sampler: Sampler) -> list[dict]:
    """TFLOP/s, SM clock and power per CHUNK_S of ``seconds`` of continuous calls."""
    series, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, calls = time.perf_counter(), 0
        a.record()
        while time.perf_counter() - t0 < CHUNK_S:
            for _ in range(4):
                fn()
            calls += 4
            torch.cuda.synchronize()  # keep the host within a few calls of the GPU
        b.record()
        b.synchronize()
        t1 = time.perf_counter()
        series.append(dict(t_s=round(t0 - start, 2), tflops=flops * calls / (a.elapsed_time(b) * 1e-3) / 1e12,
                           **sampler.window(t0, t1)))
    return series


def fp8_operands(m: int, n: int, k: int):
    """Row-major (m, k) and column-major (k, n) e4m3 operands with unit scales, as TE's TN GEMMs take."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return a, b, one


def fp8_gemm(m: int, n: int, k: int, fast_accum: bool):
    a, b, one = fp8_operands(m, n, k)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast_accum)


def bf16_gemm(m: int, n: int, k: int, layout: str):
    """``fwd``: Y = X W^T (nn.Linear, W (n, k)); ``dgrad``: dX = dY W; ``wgrad``: dW = dY^T X."""
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    if layout == "fwd":
        x, w = r(m, k), r(n, k)
        return lambda: F.linear(x, w)
    if layout == "dgrad":  # output (m, k), inner n
        dy, w = r(m, n), r(n, k)
        return lambda: torch.matmul(dy, w)
    dy, x = r(m, n), r(m, k)  # wgrad: output (n, k), inner m
    return lambda: torch.matmul(dy.t(), x)


def row(section, name, dtype, pass_, m, n, k, t, flops, nbytes, clk) -> dict:
    return dict(section=section, name=name, dtype=dtype, **{"pass": pass_}, m=m, n=n, k=k, time_s=t,
                tflops=flops / t / 1e12 if flops else 0.0, gbps=nbytes / t / 1e9 if nbytes else 0.0,
                sm_MHz=clk["sm_MHz"], power_W=clk["power_W"])


def gemm_rows(sampler: Sampler) -> list[dict]:
    out = []

    def one(name, dtype, pass_, m, n, k, fn):
        t, t0, t1 = timed(fn)
        out.append(row("gemm", name, dtype, pass_, m, n, k, t, 2.0 * m * n * k, 0, sampler.window(t0, t1)))

    for s in SQUARES:
        one(f"square{s}", "bf16", "fwd", s, s, s, bf16_gemm(s, s, s, "fwd"))
        one(f"square{s}", "fp8", "fwd", s, s, s, fp8_gemm(s, s, s, True))
    for k in K_SWEEP:
        one(f"ksweep{k}", "bf16", "fwd", 8192, 8192, k, bf16_gemm(8192, 8192, k, "fwd"))
        one(f"ksweep{k}", "fp8", "fwd", 8192, 8192, k, fp8_gemm(8192, 8192, k, True))
    for name, m, n, k in LAYER_GEMMS:
        for layout, (mm, nn, kk) in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (n, k, m))):
            one(name, "bf16", layout, mm, nn, kk, bf16_gemm(m, n, k, layout))
            # TE: fprop with fast accumulation, dgrad and wgrad with split accumulators
            one(name, "fp8", layout, mm, nn, kk, fp8_gemm(mm, nn, kk, layout == "fwd"))
        torch.cuda.empty_cache()
    return out


def wave_rows(sampler: Sampler) -> list[dict]:
    """GEMMs whose output tile count crosses wave boundaries: m from 256 to 8192 in steps of 256 at
    GPT-3 175B TP 8's QKV and projection widths and depths, BF16 and FP8. A kernel that runs whole
    waves of fixed tiles takes steps in time; split or stream-K scheduling smooths them."""
    out = []
    for (n, k), m in ((nk, m) for nk in WAVE_N_K for m in range(256, 8192 + 1, 256)):
        for dtype, fn in (("bf16", bf16_gemm(m, n, k, "fwd")), ("fp8", fp8_gemm(m, n, k, True))):
            t, t0, t1 = timed(fn)
            out.append(row("waves", f"m{m}", dtype, "fwd", m, n, k, t, 2.0 * m * n * k, 0, sampler.window(t0, t1)))
    return out


def fp8_accumulation_rows(sampler: Sampler) -> list[dict]:
    """Each layer GEMM in FP8 with fast accumulation and with split (promoted) accumulators: TE runs
    fprop with fast accumulation and dgrad/wgrad with split accumulators (module/base.py
    _2X_ACC_FPROP = False, _2X_ACC_DGRAD = _2X_ACC_WGRAD = True)."""
    out = []
    for name, m, n, k in LAYER_GEMMS:
        for layout, (mm, nn, kk) in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (n, k, m))):
            for fast in (True, False):
                t, t0, t1 = timed(fp8_gemm(mm, nn, kk, fast))
                out.append(row("fp8_accum", f"{name}.{'fast' if fast else 'split'}", "fp8", layout, mm, nn, kk,
                               t, 2.0 * mm * nn * kk, 0, sampler.window(t0, t1)))
        torch.cuda.empty_cache()
    return out


def attention_rows(sampler: Sampler, seqs: tuple[int, ...] = ATTN_SEQS) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out, heads, d = [], 32, 128
    for backend_name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        backend = getattr(SDPBackend, backend_name)
        for s in seqs:
            b = max(1, ATTN_TOKENS // s)  # longer sequences than ATTN_TOKENS: one sequence
            q, k, v = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
            flops = 4.0 * b * heads * s * s * d / 2  # causal: half of QK^T and AV (FA benchmarks' count)

            def fwd():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                torch.autograd.grad(fwd(), (q, k, v), g)

            try:
                tf, t0, t1 = timed(fwd)
                out.append(row("attention", backend_name.lower(), "bf16", "fwd", b, heads, s, tf, flops, 0,
                               sampler.window(t0, t1)))
                tfb, t0, t1 = timed(fwd_bwd)
                out.append(row("attention", backend_name.lower(), "bf16", "bwd", b, heads, s, tfb - tf,
                               2.5 * flops, 0, sampler.window(t0, t1)))
            except RuntimeError as exc:
                print(f"attention {backend_name} s={s}: {str(exc).splitlines()[0][:100]}")
            del q, k, v, g
    return out


def memory_rows(sampler: Sampler) -> list[dict]:
    out = []

    def one(name, pass_, tokens, width, fn, nbytes):
        t, t0, t1 = timed(fn)
        out.append(row("memory", name, "bf16", pass_, tokens, width, 0, t, 0, nbytes, sampler.window(t0, t1)))

    for m, n in MEM_SHAPES:
        x, y = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        gate = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
        xg = x.clone().requires_grad_(True)
        e = 2 * m * n  # bytes of one bf16 (m, n) tensor
        one("copy", "fwd", m, n, lambda: y.copy_(x), 2 * e)
        one("add", "fwd", m, n, lambda: torch.add(x, y), 3 * e)
        one("rmsnorm", "fwd", m, n, lambda: F.rms_norm(x, (n,), w, 1e-5), 2 * e)
        one("layernorm", "fwd", m, n, lambda: F.layer_norm(x, (n,), w, w, 1e-5), 2 * e)
        yr = F.rms_norm(xg, (n,), w, 1e-5)
        one("rmsnorm", "bwd", m, n, lambda: torch.autograd.grad(yr, xg, y, retain_graph=True), 3 * e)
        yl = F.layer_norm(xg, (n,), w, w, 1e-5)
        one("layernorm", "bwd", m, n, lambda: torch.autograd.grad(yl, xg, y, retain_graph=True), 3 * e)
        one("swiglu", "fwd", m, n, lambda: F.silu(gate[:, :n]) * gate[:, n:], 3 * e)
        one("gelu", "fwd", m, n, lambda: F.gelu(x, approximate="tanh"), 2 * e)
        one("fp8_cast_amax", "fwd", m, n, lambda: (x.abs().amax(), x.to(torch.float8_e4m3fn)), e + e // 2)
        one("fp8_transpose", "fwd", m, n, lambda: x.to(torch.float8_e4m3fn).t().contiguous(), e + e)
        del x, y, gate, xg, yr, yl
        torch.cuda.empty_cache()
    return out


def host_rows() -> list[dict]:
    """Host seconds per eager kernel launch (tiny add, GPU idle) and per kernel replayed from a CUDA graph."""
    a, b, c = (torch.ones(1, device="cuda") for _ in range(3))
    for _ in range(1000):
        torch.add(a, b, out=c)
    torch.cuda.synchronize()
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        torch.add(a, b, out=c)
    host_s = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    graph, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.add(a, b, out=c)
        with torch.cuda.graph(graph, stream=s):
            for _ in range(500):
                torch.add(a, b, out=c)
    torch.cuda.synchronize()
    t, _, _ = timed(graph.replay)
    nan = {"sm_MHz": float("nan"), "power_W": float("nan")}
    return [row("host", "eager_add_launch", "fp32", "fwd", 1, 1, 0, host_s, 0, 0, nan),
            row("host", "graph_add_per_kernel", "fp32", "fwd", 1, 1, 0, t / 500, 0, 0, nan)]


def provenance(sampler: Sampler) -> dict:
    p = torch.cuda.get_device_properties(0)
    prov = dict(device=torch.cuda.get_device_name(0), sms=p.multi_processor_count,
                memory_MiB=p.total_memory // 2**20, torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=str(torch.backends.cudnn.version()), python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), clock_source=sampler.source,
                command=" ".join(["python", *sys.argv]))  # the script run, with its arguments
    if shutil.which("nvidia-smi"):
        q = "driver_version,power.limit,clocks.max.sm,clocks.max.mem,clocks.sm,temperature.gpu"
        prov["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"],
                                            capture_output=True, text=True).stdout.strip()
    return prov


def summarize(series: list[dict]) -> dict:
    tail = series[len(series) // 2:]
    med = lambda key, rows: sorted(r[key] for r in rows)[len(rows) // 2]  # noqa: E731
    return {"first_tflops": series[0]["tflops"], "first_sm_MHz": series[0]["sm_MHz"],
            "steady_tflops": med("tflops", tail), "steady_sm_MHz": med("sm_MHz", tail),
            "steady_power_W": med("power_W", tail), "max_temp_C": max(r["temp_C"] for r in series),
            "reasons_or": max(r["reasons"] for r in series)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="all", help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--attn-seqs", default=",".join(map(str, ATTN_SEQS)), help="attention's sequence lengths")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    sampler.start()
    doc: dict = {"provenance": provenance(sampler), "errors": {}}
    rows: list[dict] = []
    n = 8192
    steps = [("sustained_bf16", lambda: sustained(bf16_gemm(n, n, n, "fwd"), 2.0 * n**3, SUSTAIN_BF16_S, sampler)),
             ("sustained_fp8", lambda: sustained(fp8_gemm(n, n, n, True), 2.0 * n**3, SUSTAIN_FP8_S, sampler)),
             ("gemm", lambda: gemm_rows(sampler)), ("fp8_accum", lambda: fp8_accumulation_rows(sampler)),
             ("waves", lambda: wave_rows(sampler)),
             ("attention", lambda: attention_rows(sampler, tuple(map(int, args.attn_seqs.split(","))))),
             ("memory", lambda: memory_rows(sampler)), ("host", host_rows)]
    wanted = SECTIONS if args.sections == "all" else tuple(args.sections.split(","))
    for name, fn in steps:
        if name not in wanted:
            continue
        t = time.perf_counter()
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            doc["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(f"{name}: FAILED {doc['errors'][name]}", flush=True)
            continue
        if name.startswith("sustained"):
            doc[name] = {"summary": summarize(res), "series": res}
            print(f"{name}: {json.dumps(doc[name]['summary'])}", flush=True)
        else:
            rows += res
            for r in res:
                print(f"{r['section']:9} {r['name']:18} {r['dtype']:4} {r['pass']:5} {r['m']:>6} {r['n']:>6} "
                      f"{r['k']:>6} {r['time_s'] * 1e6:10.1f} us {r['tflops']:7.1f} TF/s {r['gbps']:7.0f} GB/s "
                      f"{r['sm_MHz']:6.0f} MHz {r['power_W']:5.0f} W", flush=True)
        print(f"[{name}: {time.perf_counter() - t:.1f} s]", flush=True)
        with open(out / "gpu_kernels.csv", "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=FIELDS)
            wr.writeheader()
            wr.writerows(rows)
        (out / "gpu_kernels.json").write_text(json.dumps(doc, indent=1) + "\n")
    sampler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
