"""nccl-tests results from public repositories against the simulator, row by row.

Usage: python benchmarks/nccl_real.py [nccl_real.csv] [--json]
Every row of ../shared/validation/nccl_real.csv whose system the cluster description can express is
run through ``run_collective`` (plan -> flow network) on that system's hardware file, at the row's
message size and op, with the algorithm the simulator's NCCL tuner picks. Printed per row: the
hardware file and NICs used, measured and predicted busbw, the error, and the issue's target
(+-10% for messages >= 64 MB, +-25% below). Rows that cannot be expressed are listed with the reason.
The simulator's tuner is one NCCL version (``nccl_tuner.NCCL_VERSION``); the rows' own runs used
whatever NCCL their authors had, mostly older.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from simulator.cost.nccl_env import DEFAULT, FABRIC_ENV  # noqa: E402
from simulator.cost.nccl_tuner import NCCL_VERSION  # noqa: E402
from simulator.explore.collective import run_collective  # noqa: E402
from simulator.hardware.clusters import CLUSTER_PRESETS  # noqa: E402
from simulator.hardware.hwfile import read_cluster_file  # noqa: E402

# the bundled copy of the shared file (../shared/validation/nccl_real.csv), so that a clean clone has it
CSV = ROOT / "simulator" / "data" / "nccl_real.csv"
CLUSTERS = ROOT / "scenarios" / "clusters"
LARGE_BYTES = 64 * 2 ** 20
TARGET_LARGE, TARGET_SMALL = 0.10, 0.25

# system text of the row -> (hardware, why): the file or preset that describes it.
SYSTEMS = (
    ("A3 Mega", "gcp-a3-mega.toml"),
    ("A3 High", "gcp-a3-high.toml"),
    ("Nebius", "nebius-h100-ib.toml"),
    ("A100", "dgx-a100-80gb"),
    ("H100", "dgx-h100"),
)


def cluster_for(row: dict):
    """(ClusterSpec, hardware name) for a row, or (None, reason)."""
    for key, hw in SYSTEMS:
        if key in row["system"]:
            base = read_cluster_file(CLUSTERS / hw) if hw.endswith(".toml") else CLUSTER_PRESETS[hw]
            gpus, nodes = int(row["gpus"]), int(row["nodes"])
            if gpus != nodes * base.gpus_per_node:
                return None, f"{gpus} GPUs on {nodes} nodes is not whole {hw} nodes"
            return base.with_nodes(nodes), hw
    return None, f"no hardware description for system {row['system']!r}"


def evaluate(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        cluster, hw = cluster_for(row)
        size, measured = float(row["size_bytes"]), float(row["busbw_GBps_measured"])
        entry = {"system": row["system"], "op": row["op"], "size_bytes": size, "measured_GBps": measured}
        if cluster is None:
            out.append(dict(entry, expressible=False, reason=hw))
            continue
        got = run_collective(cluster, row["op"], size)
        target = TARGET_LARGE if size >= LARGE_BYTES else TARGET_SMALL
        err = got["busbw_GBps"] / measured - 1
        nics = f"{cluster.nics_per_node} x {cluster.nic_bandwidth_Bps * 8 / 1e9:g} Gb/s {cluster.fabric}"
        out.append(dict(entry, expressible=True, hardware=hw, nics=nics if cluster.num_nodes > 1 else "(one node)",
                        predicted_GBps=got["busbw_GBps"], error=err, target=target,
                        within=abs(err) <= target, algorithm=got["algorithm"], fabric=cluster.fabric))
    return out


def env_note(fabric: str) -> str:
    """The vendor's NCCL settings the simulator applies on ``fabric`` ('' for NCCL's defaults), and the
    external tuner it cannot apply."""
    env = FABRIC_ENV.get(fabric, DEFAULT)
    if env is DEFAULT:
        return ""
    parts = [f"NCCL_ALGO={','.join(env.algorithms)} NCCL_PROTO={','.join(env.protocols)}"]
    if env.min_channels or env.max_channels:
        parts.append(f"channels {env.min_channels or 1}..{env.max_channels or 'MAXCHANNELS'}")
    parts.append(f"P2P chunks {env.p2p_net_chunk_bytes // 1024} KiB net / {env.p2p_nvl_chunk_bytes // 1024} KiB NVLink")
    if not env.pxn:
        parts.append("no PXN")
    if env.unpack:
        parts.append("unpack network device (channels x2)")
    if env.tuner_plugin:
        parts.append(f"vendor tuner plugin {env.tuner_plugin} NOT applied: its per-size choices are "
                     f"unpublished, the simulator picks with NCCL {NCCL_VERSION}'s tuner")
    return "; ".join(parts)


def report(results: list[dict]) -> None:
    print(f"NCCL tuner constants and rules of NCCL {NCCL_VERSION} (cost/nccl_tuner)")
    print(f"{'hardware':20s} {'NICs':28s} {'op':14s} {'size':>11s} {'measured':>9s} {'predicted':>9s} "
          f"{'error':>8s} {'target':>7s}  algorithm")
    for r in results:
        if not r["expressible"]:
            continue
        flag = "" if r["within"] else "  <-- outside"
        print(f"{r['hardware']:20s} {r['nics']:28s} {r['op']:14s} {int(r['size_bytes']):>11d} "
              f"{r['measured_GBps']:9.2f} {r['predicted_GBps']:9.2f} {r['error']:+8.1%} "
              f"{'+-' + format(r['target'], '.0%'):>7s}  {r['algorithm']}{flag}")
    done = [r for r in results if r["expressible"]]
    for label, part in (("messages >= 64 MB", [r for r in done if r["size_bytes"] >= LARGE_BYTES]),
                        ("messages < 64 MB", [r for r in done if r["size_bytes"] < LARGE_BYTES])):
        if part:
            mape = sum(abs(r["error"]) for r in part) / len(part)
            print(f"{label}: {sum(r['within'] for r in part)} of {len(part)} within target, "
                  f"mean |error| {mape:.1%}")
    for hw, fabric in sorted({(r["hardware"], r["fabric"]) for r in done}):
        note = env_note(fabric)
        if note:
            print(f"{hw} ({fabric}): {note}")
    skipped = [r for r in results if not r["expressible"]]
    print(f"rows: {len(results)}, expressible: {len(done)}, not expressible: {len(skipped)}")
    for r in skipped:
        print(f"  not expressible: {r['system']} {r['op']} {int(r['size_bytes'])}: {r['reason']}")


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "--json"]
    path = Path(args[0]) if args else CSV
    if not path.is_file():
        print(f"{path} not found", file=sys.stderr)
        return 2
    with open(path, newline="") as fh:
        results = evaluate(list(csv.DictReader(fh)))
    if "--json" in argv:
        print(json.dumps(results))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
