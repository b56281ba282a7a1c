"""Discrete-event cluster simulator for distributed LLM training: the public API.

    from simulator import load_scenario, simulate
    result = simulate(load_scenario("scenarios/gpt3-175b-1024xa100.toml"))
    result.metrics["iteration_time_s"]
"""

from __future__ import annotations

__all__ = ["load_scenario", "simulate", "simulate_metrics", "write_results", "RunResult", "Scenario",
           "ScenarioError"]


def __getattr__(name: str):
    # Lazy: `import simulator` stays cheap and the CLI's error path needs no simpy/matplotlib import.
    if name in ("load_scenario", "Scenario", "ScenarioError"):
        from . import scenario
        return getattr(scenario, name)
    if name in ("simulate", "simulate_metrics", "write_results", "RunResult"):
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
