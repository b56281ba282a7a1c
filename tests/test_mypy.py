"""mypy over simulator/ with the [mypy] settings of setup.cfg: the CI's type check (pytest runs it)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_passes_on_the_simulator_package():
    cache = Path(tempfile.gettempdir()) / "llm-cluster-simulator-mypy-cache"  # outside the work tree
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg"),
                          "--cache-dir", str(cache)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Success: no issues found" in out.stdout
