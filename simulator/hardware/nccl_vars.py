"""The NCCL environment variables a cluster description may set (``[cluster.nccl_env]``).

A job's launcher often exports NCCL variables (a recipe's ``NCCL_P2P_NET_CHUNKSIZE``, an ``NCCL_ALGO``
pinned for a test); they override what the fabric's vendor prescribes (cost/nccl_env). Each accepted
variable maps onto one field of ``cost.nccl_env.NcclEnv``, with NCCL's own syntax and meaning:

- NCCL_ALGO / NCCL_PROTO: comma-separated names, case-insensitive, or a ``^``-prefixed list to exclude
  (NCCL's src/graph/tuning.cc parseList); CollNet and PAT are not modelled, so they may only be excluded;
- NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS: 1..64 (MAXCHANNELS);
- NCCL_P2P_NET_CHUNKSIZE / NCCL_P2P_NVL_CHUNKSIZE / NCCL_BUFFSIZE: bytes;
- NCCL_P2P_PXN_LEVEL: 0 disables PXN, 1 and 2 allow it.
NCCL_NVLS_ENABLE is the cluster's own ``nvls`` field. Anything else is refused, naming the variable.
"""

from __future__ import annotations

ALGORITHMS = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls_tree"}
PROTOCOLS = {"simple": "simple", "ll": "ll", "ll128": "ll128"}
UNMODELLED_ALGORITHMS = ("collnetdirect", "collnetchain", "collnet", "pat")
MAX_CHANNELS = 64  # NCCL src/include/device.h MAXCHANNELS
# variable -> (NcclEnv field, least, most). The byte sizes' upper ends (1 GiB chunks, 16 GiB buffers) are not
# NCCL's limits (it has none) but a plausibility bound that catches a misplaced unit, as hwfile.MAX_QUANTITY does
INTS = {"NCCL_MIN_NCHANNELS": ("min_channels", 1, MAX_CHANNELS),
        "NCCL_MAX_NCHANNELS": ("max_channels", 1, MAX_CHANNELS),
        "NCCL_P2P_NET_CHUNKSIZE": ("p2p_net_chunk_bytes", 1, 1 << 30),
        "NCCL_P2P_NVL_CHUNKSIZE": ("p2p_nvl_chunk_bytes", 1, 1 << 30),
        "NCCL_BUFFSIZE": ("buffsize_bytes", 1, 1 << 34), "NCCL_P2P_PXN_LEVEL": ("pxn", 0, 2)}
NcclValue = int | bool | tuple[str, ...]
LISTS = {"NCCL_ALGO": ("algorithms", ALGORITHMS), "NCCL_PROTO": ("protocols", PROTOCOLS)}
VARIABLES = tuple(INTS) + tuple(LISTS)


def _names(where: str, var: str, text: object, known: dict[str, str]) -> tuple[str, ...]:
    """The model's names of what an NCCL_ALGO / NCCL_PROTO value allows."""
    if not isinstance(text, str) or not text.strip("^ "):
        raise ValueError(f"{where}.nccl_env.{var} must be a comma-separated list of names, got {text!r}")
    exclude = text.startswith("^")
    items = [x.strip().lower() for x in text.lstrip("^").split(",") if x.strip()]
    bad = [x for x in items if x not in known and not (exclude and x in UNMODELLED_ALGORITHMS)]
    if bad:
        allowed = ", ".join(known)
        if var == "NCCL_ALGO":
            allowed += f" (only excluded: {', '.join(UNMODELLED_ALGORITHMS)})"
        raise ValueError(f"{where}.nccl_env.{var} = {text!r}: unknown or unmodelled {bad}; names: {allowed}")
    chosen = [known[x] for x in items if x in known]
    names = [v for v in known.values() if v not in chosen] if exclude else list(dict.fromkeys(chosen))
    if not names:
        raise ValueError(f"{where}.nccl_env.{var} = {text!r} leaves nothing to run")
    return tuple(names)


def _integer(where: str, var: str, value: object) -> int:
    field, low, high = INTS[var]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{where}.nccl_env.{var} must be an integer in {low}..{high}, got {value!r}")
    return value


def parse_nccl_env(where: str, table: object) -> tuple[tuple[str, NcclValue], ...]:
    """(NcclEnv field, value) pairs, sorted by field, from a ``nccl_env`` table of NCCL variables."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}.nccl_env must be a table of NCCL variables, got {table!r}")
    out: dict[str, NcclValue] = {}
    low, high = 0, MAX_CHANNELS
    for var, value in table.items():
        if var == "NCCL_NVLS_ENABLE":
            raise ValueError(f"{where}.nccl_env.NCCL_NVLS_ENABLE: set {where}.nvls instead")
        if var in LISTS:
            field, known = LISTS[var]
            out[field] = _names(where, var, value, known)
        elif var in INTS:
            n = _integer(where, var, value)
            out[INTS[var][0]] = bool(n) if var == "NCCL_P2P_PXN_LEVEL" else n
            if var == "NCCL_MIN_NCHANNELS":
                low = n
            elif var == "NCCL_MAX_NCHANNELS":
                high = n
        else:
            raise ValueError(f"{where}.nccl_env: {var!r} is not modelled; variables: {', '.join(VARIABLES)}")
    if low > high:
        raise ValueError(f"{where}.nccl_env: NCCL_MIN_NCHANNELS = {low} above NCCL_MAX_NCHANNELS = {high}")
    return tuple(sorted(out.items()))
