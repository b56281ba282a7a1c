"""Transformer Engine userbuffers configurations: how ``tp_comm_overlap`` runs each of a layer's TP sites.

Megatron-Core and NeMo pass TE's ``initialize_ub`` one table per site (the recipes' ``ub_tp_comm_overlap_cfg``,
NeMo's ``tp_overlap_configs/userbuffers.py``, the launcher's ``conf/training/tp_overlap/*.yaml``); a site the
table leaves out, or every site when no table is given (Megatron-LM's ``--tp-comm-overlap`` without
``--tp-comm-overlap-cfg``; NeMo's overlap callback without a config), keeps TE's default (``module/base.py``
``initialize_ub``; ``get_default_config`` from TE 1.9): ring exchange for the four all-gather sites (1 SM;
its transfers run on copy engines, ``use_ce``), a pipeline of 4 splits on 16 SMs for the two reduce-scatter
sites, bulk on 16 SMs for the four backward sites; ``set_sm_margin`` off everywhere up to TE 1.13
("te1-default"), on for the pipeline and bulk sites from TE 2.0 ("te2-default", commit 544dd14b4). TE 1.7/1.8
read ring-exchange sites at 16 SMs but hard-code 1 SM and copy engines for them: the same run.
The bundled tables are files under ``simulator/data/tp_overlap/``, each with the source it copies; a
scenario names one (``parallelism.tp_comm_overlap_cfg``) or gives the path of its own TOML file in the
same form. A bulk site may also be ``nccl``: an asynchronous NCCL collective beside the GEMM, holding
NCCL's CTAs (PyTorch's micro-pipelined TP, which has no bulk overlap). cost/tp_overlap prices the methods.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[1] / "data" / "tp_overlap"
TE_DEFAULTS = ("te1-default", "te2-default")  # no table: every site at TE 1.x's / 2.x's default
TE_DEFAULT = TE_DEFAULTS[1]  # today's Transformer Engine

# TE initialize_ub: the all-gathers in front of column-parallel GEMMs (forward input, backward output
# gradient), the reduce-scatters behind row-parallel GEMMs, and the backward's bulk sites.
GATHER_SITES = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")
SCATTER_SITES = ("proj_fprop", "fc2_fprop")
BULK_SITES = ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")
SITES = GATHER_SITES + SCATTER_SITES + BULK_SITES
# the methods TE runs at each kind of site (TE add_ub: "pipeline overlap method is not supported for AllGather")
METHODS = {**{s: ("ring_exchange",) for s in GATHER_SITES}, **{s: ("pipeline", "ring_exchange") for s in SCATTER_SITES},
           **{s: ("bulk", "nccl") for s in BULK_SITES}}
# keys of a site's table: the ones that change the model, then TE's others, read and checked but not modelled
# (cga_size: the comm kernel's cluster shape; fp8_buf: the buffer's dtype, priced by blocking_tp.TPTraffic;
# use_ce: copy engines for ring-exchange transfers, TE's default and the only transfer modelled)
MODELLED_KEYS = {"method", "num_sm", "num_splits", "set_sm_margin", "aggregate", "atomic_gemm"}
OTHER_KEYS = {"cga_size", "fp8_buf", "use_ce", "is_reduce_scatter"}


@dataclass(frozen=True, slots=True)
class OverlapSite:
    method: str  # "ring_exchange" | "pipeline" | "bulk" | "nccl" (a bulk site left to NCCL)
    num_sm: int  # SMs of its communication kernel (a ring exchange's transfers use copy engines: none held)
    splits: int = 4  # pipeline chunks (TE num_splits)
    sm_margin: bool = False  # set_sm_margin: the GEMM is launched on the SMs num_sm leaves
    aggregate: bool = False  # ring exchange: two chunks per GEMM (tp/2 steps)

    @property
    def sms_held(self) -> int:
        """SMs the site's userbuffers kernel holds while it runs (a ring exchange's copies: none; NCCL's
        collective at an ``nccl`` site: its channels, which cost/model counts)."""
        return self.num_sm if self.method in ("pipeline", "bulk") else 0


def te_default_site(site: str, te_major: int = 2) -> OverlapSite:
    """TE's ``get_default_config``: num_sm 1 for ring exchange, else 16; num_splits 4 for a pipeline;
    aggregate and atomic_gemm off; set_sm_margin off (TE 1.x), on except for ring exchange (TE 2.x)."""
    method = METHODS[site][0]
    ring = method == "ring_exchange"
    return OverlapSite(method, 1 if ring else 16, sm_margin=te_major >= 2 and not ring)


@dataclass(frozen=True, slots=True)
class UbConfig:
    """Every site's settings, TE's default where the table is silent; ``source``: where it was copied from."""

    name: str
    sites: tuple[tuple[str, OverlapSite], ...]
    source: str = ""

    def site(self, name: str) -> OverlapSite:
        return dict(self.sites)[name]


def _site(where: str, site: str, table: object, te_major: int) -> OverlapSite:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [{site}] must be a table, got {table!r}")
    unknown = set(table) - MODELLED_KEYS - OTHER_KEYS
    if unknown:
        raise ValueError(f"{where}: [{site}] unknown key(s) {sorted(unknown)}; known: "
                         f"{', '.join(sorted(MODELLED_KEYS | OTHER_KEYS))}")
    s = te_default_site(site, te_major)
    method = table.get("method", s.method)
    if method not in METHODS[site]:
        raise ValueError(f"{where}: {site}.method must be one of {', '.join(METHODS[site])}, got {method!r}")
    if table.get("atomic_gemm", False):
        raise ValueError(f"{where}: {site}.atomic_gemm = true (TE's atomic-counter GEMM) is not modelled")
    # TE computes the default from the site's default method and then applies the table: a method changed
    # without num_sm keeps the default method's SMs (they matter only with set_sm_margin for a ring exchange)
    num_sm, splits = table.get("num_sm", s.num_sm), table.get("num_splits", s.splits)
    for key, v in (("num_sm", num_sm), ("num_splits", splits)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "num_sm" else 1):
            raise ValueError(f"{where}: {site}.{key} must be an integer >= {0 if key == 'num_sm' else 1}, got {v!r}")
    flags = {"set_sm_margin": table.get("set_sm_margin", s.sm_margin), "aggregate": table.get("aggregate", False)}
    for key, v in flags.items():
        if v not in (True, False, 0, 1) or isinstance(v, float):
            raise ValueError(f"{where}: {site}.{key} must be true/false (or 0/1), got {v!r}")
    return replace(s, method=method, num_sm=num_sm, splits=splits, sm_margin=bool(flags["set_sm_margin"]),
                   aggregate=bool(flags["aggregate"]) and method == "ring_exchange")


def config_from_table(raw: dict, where: str, name: str) -> UbConfig:
    """A UbConfig from a file's tables, one per site it sets (keys as TE's ``ub_cfgs``); ``te`` (1 or 2,
    default 2): the Transformer Engine whose defaults fill what the file leaves out."""
    unknown = set(raw) - set(SITES) - {"name", "source", "te"}
    if unknown:
        raise ValueError(f"{where}: unknown site(s) {sorted(unknown)}; sites: {', '.join(SITES)}")
    te = raw.get("te", 2)
    if te not in (1, 2) or isinstance(te, bool):
        raise ValueError(f"{where}: te must be 1 or 2 (the Transformer Engine major version), got {te!r}")
    sites = tuple((s, _site(where, s, raw[s], te) if s in raw else te_default_site(s, te)) for s in SITES)
    return UbConfig(str(raw.get("name", name)), sites, str(raw.get("source", "")))


@functools.lru_cache(maxsize=None)
def load_ub_config(name: str) -> UbConfig:
    """The configuration ``name`` stands for: TE's defaults, a bundled file's stem, or a TOML file's path.
    ValueError, one line naming the file and the field, for anything else."""
    if name in TE_DEFAULTS:
        te = TE_DEFAULTS.index(name) + 1
        return UbConfig(name, tuple((s, te_default_site(s, te)) for s in SITES),
                        f"Transformer Engine {te}.x module/base.py initialize_ub defaults")
    path = Path(name) if name.endswith(".toml") else CONFIG_DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"no userbuffers configuration {name!r}: neither a TOML file nor one of "
                         f"{', '.join(bundled_configs())}")
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"userbuffers configuration {path}: {exc}") from None
    return config_from_table(raw, str(path), path.stem)


def bundled_configs() -> tuple[str, ...]:
    return TE_DEFAULTS + tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
