"""Every runnable scenario file simulates, and every notebook executes (nbclient)."""

from pathlib import Path

import pytest

from simulator.pipeline import simulate
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
# every scenario file, the MoE recipes and the calibration example included (scenarios/clusters/ holds
# hardware files, not scenarios)
SCENARIOS = sorted(p for p in (ROOT / "scenarios").rglob("*.toml") if "clusters" not in p.relative_to(ROOT).parts)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_scenarios_and_notebooks():
    assert len(SCENARIOS) >= 12 and NOTEBOOKS
    assert {"deepseek-v3-1024xh100", "mixtral-8x22b-256xh100", "tiny-gpt"} <= {p.stem for p in SCENARIOS}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.relative_to(ROOT / "scenarios").with_suffix("").as_posix())
def test_scenario_simulates(path):
    m = simulate(load_scenario(path)).metrics
    assert m["iteration_time_s"] > 0 and 0 < m["mfu"] < 1
    assert sum(m["time_breakdown_s"].values()) == pytest.approx(m["iteration_time_s"], rel=1e-9)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
