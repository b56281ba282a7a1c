"""Every script under benchmarks/ compiles (the GPU ones need torch and a GPU to run, which CI has
not: a syntax error there would otherwise wait for the next lent GPU to be found)."""

import py_compile
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_the_gpu_benchmarks_are_there():
    assert {"gpu_kernels.py", "gpu_layer.py", "gpu_contention.py"} <= {p.name for p in BENCHMARKS}


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_script_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)
