"""calibration/profile.queued_cuda_times on a simulated GPU: a host that takes 6 us to launch a kernel
and a GPU that runs each 2 us kernel in order. Bracketing each call with events times the launch; a
batch queued behind a sleep kernel times the kernels. No torch needed: a stand-in module plays it."""

import sys
import types

import pytest

from simulator.calibration import profile

LAUNCH_S = 6e-6  # host time of one eager launch (measured on the lent H100: 6.0 us)
KERNEL_S = 2e-6  # the kernel's own time on the GPU
SLEEP_HZ = 1.98e9  # the simulated GPU's SM clock: torch.cuda._sleep counts its cycles


class FakeGPU:
    """One stream: the host's clock and the time the GPU's queue drains."""

    def __init__(self):
        self.host_s, self.gpu_free_s = 0.0, 0.0

    def launch(self, gpu_s: float) -> float:
        self.host_s += LAUNCH_S
        start = max(self.gpu_free_s, self.host_s)
        self.gpu_free_s = start + gpu_s
        return self.gpu_free_s

    def sync(self):
        self.host_s = max(self.host_s, self.gpu_free_s)


def fake_torch(gpu: FakeGPU) -> types.ModuleType:
    class Event:
        def __init__(self, enable_timing=True):
            self.at_s = None

        def record(self, stream=None):
            self.at_s = max(gpu.gpu_free_s, gpu.host_s)
            gpu.gpu_free_s = self.at_s

        def synchronize(self):
            gpu.host_s = max(gpu.host_s, self.at_s)

        def elapsed_time(self, end):
            return (end.at_s - self.at_s) * 1e3  # milliseconds, as CUDA events give them

    cuda = types.SimpleNamespace(Event=Event, synchronize=gpu.sync,
                                 _sleep=lambda cycles: gpu.launch(cycles / SLEEP_HZ))
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def gpu(monkeypatch):
    g = FakeGPU()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(g))
    monkeypatch.setattr(profile.time, "perf_counter", lambda: g.host_s)
    return g


def test_queued_batches_time_the_kernel_not_its_launch(gpu):
    kernel = lambda: gpu.launch(KERNEL_S)  # noqa: E731
    queued = profile.queued_cuda_times(kernel, 50)
    assert len(queued) == profile.QUEUED_BATCHES
    assert all(t == pytest.approx(KERNEL_S) for t in queued)
    # the previous protocol, an event pair around each call, times the host's launch instead
    bracketed = profile.cuda_event_times(kernel, 50)
    assert bracketed[len(bracketed) // 2] == pytest.approx(LAUNCH_S)


def test_a_kernel_longer_than_its_launch_times_the_same_both_ways(gpu):
    long_kernel = lambda: gpu.launch(100e-6)  # noqa: E731
    assert profile.queued_cuda_times(long_kernel, 10)[2] == pytest.approx(100e-6)
    assert profile.cuda_event_times(long_kernel, 10)[5] == pytest.approx(100e-6)


def test_time_callable_reports_the_median_and_the_calls_timed(gpu):
    t, calls = profile.time_callable(lambda: gpu.launch(KERNEL_S), "cuda")
    assert t == pytest.approx(KERNEL_S)
    assert calls == profile.MAX_REPS  # 2 us kernels: the most repetitions, in 5 batches of 10
