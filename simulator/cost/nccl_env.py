"""The NCCL environment a job runs under: NCCL's defaults, or what a fabric's vendor prescribes.

NCCL reads its environment once per communicator; on some fabrics the vendor's guide sets variables
every job must carry, and the NIC's network plugin reports properties NCCL's topology code acts on.
``NcclEnv`` holds those this model uses, one per ``ClusterSpec.fabric`` (``env_for``):

- NCCL_ALGO / NCCL_PROTO: the (algorithm, protocol) pairs the tuner may pick for collectives;
- NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS: bounds on the channels of every collective (graph/connect.cc
  ncclTopoPostset: ``nChannels = min(ncclMaxNchannels(), nChannels)``, then copies up to the minimum),
  and so on the P2P channels (graph/paths.cc ncclTopoComputeP2pChannels: ``p2pnChannels =
  pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS))``);
- NCCL_P2P_NET_CHUNKSIZE / NCCL_P2P_NVL_CHUNKSIZE: P2P step sizes (init.cc computeBuffSizes), which
  set how many channels a send is split over (enqueue.cc addP2pToPlan, ``nccl_tuner.p2p_send_channels``);
- NCCL_P2P_PXN_LEVEL=0: no PXN, so a send to another rail leaves on the sender's own NIC;
- the plugin's ``netDeviceType``: NCCL_NET_DEVICE_UNPACK (packets land in bounce buffers that NCCL's
  kernel unpacks) makes NCCL double the channels of a multi-node communicator below 16 (connect.cc,
  ``ncclParamUnpackDoubleNChannels``, NCCL 2.22.3 release notes "Double the default number of
  channels" for device network offload);
- NCCL_BUFFSIZE: the Simple protocol's buffer per connection, whose eighth is a Tree/Simple chunk
  (``cost/nccl_fill``: the chunk its pipeline fills with);
- NCCL_TUNER_PLUGIN: an external tuner whose per-size choices replace NCCL's own (``tuner_plugin``
  names it; the model still picks by NCCL's tuner and says so where it reports such a fabric).

Both GCP plugins report ``latency = 0`` and the NIC's /sys/class/net speed (nccl-plugin-gpudirecttcpx
src/net_tcpx.cc tcpxGetProperties; nccl-plugin-gpudirect-tcpxo tcpdirect_plugin/fastrak_offload/
nccl_shim.cc GetProperties), as NCCL's own IB transport does: NCCL's tuner adds nothing for them, so
its constants (``nccl_tuner``) apply unchanged. Settings a source prescribes that this model has no
term for are listed in each environment's comment (socket threads, flows per connection, ...).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..hardware.clusters import ClusterSpec

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, slots=True)
class NcclEnv:
    algorithms: tuple[str, ...] = ()  # NCCL_ALGO; () = unset (every algorithm)
    protocols: tuple[str, ...] = ()  # NCCL_PROTO; () = unset
    min_channels: int = 0  # NCCL_MIN_NCHANNELS; 0 = unset
    max_channels: int = 0  # NCCL_MAX_NCHANNELS; 0 = unset (MAXCHANNELS)
    # init.cc: NCCL_P2P_NET_CHUNKSIZE (1 << 17) and NCCL_P2P_NVL_CHUNKSIZE (1 << 19) defaults
    p2p_net_chunk_bytes: int = 128 * KiB
    p2p_nvl_chunk_bytes: int = 512 * KiB
    pxn: bool = True  # NCCL_P2P_PXN_LEVEL: 2 by default ("use PXN as much as possible"), 0 = off
    unpack: bool = False  # the network plugin's netDeviceType is NCCL_NET_DEVICE_UNPACK
    tuner_plugin: str = ""  # NCCL_TUNER_PLUGIN, when the vendor prescribes one
    buffsize_bytes: int = 4 * MiB  # NCCL_BUFFSIZE: init.cc DEFAULT_BUFFSIZE (1 << 22), Simple's buffer

    def allows(self, algorithm: str, protocol: str) -> bool:
        """Whether NCCL_ALGO / NCCL_PROTO let the tuner pick this pair for a collective (P2P-based
        all-to-all and send/recv are not collectives' algorithms and stay free)."""
        if algorithm in ("direct", "p2p"):
            return True
        return ((not self.algorithms or algorithm in self.algorithms)
                and (not self.protocols or protocol in self.protocols))

    def collective_channels(self, searched: int, num_nodes: int) -> int:
        """Channels of a collective: NCCL runs twice the rings its search found (connect.cc, as
        ``cost/collectives`` counts them), doubles them again below 16 across nodes on an unpack
        network, then clamps to NCCL_MAX_NCHANNELS and copies up to NCCL_MIN_NCHANNELS."""
        channels = 2 * searched
        if self.unpack and num_nodes > 1 and channels < 16:
            channels *= 2
        if self.max_channels:
            channels = min(channels, self.max_channels)
        return max(channels, self.min_channels)

    def p2p_channels(self, nvswitch_channels: int) -> int:
        """p2pnChannels: pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS)); ``nvswitch_channels`` is what
        NCCL prints on NVSwitch nodes (32), which NCCL_MAX_NCHANNELS caps through nChannels."""
        if not self.max_channels:
            return nvswitch_channels
        return min(nvswitch_channels, 1 << max(0, self.max_channels - 1).bit_length())


DEFAULT = NcclEnv()

# GCP A3 High, GPUDirect-TCPX: the NCCL environment of Google's TCPX nccl-tests (GoogleCloudPlatform/
# container-engine-accelerators gpudirect-tcpx/nccl-config.yaml run-nccl.sh before commit 0e5609b0,
# 2026-06-01, the script dstack's examples/clusters/a3high runs; dstack's task env is the same less
# the channel bounds): NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=8,
# NCCL_P2P_NET_CHUNKSIZE=524288, NCCL_P2P_NVL_CHUNKSIZE=1048576, NCCL_P2P_PXN_LEVEL=0; the plugin is
# an unpack device (net_tcpx.cc: props->netDeviceType = NCCL_NET_DEVICE_UNPACK); NCCL_BUFFSIZE=4194304
# (NCCL's default). Not modelled: NCCL_NSOCKS_PERTHREAD=4, NCCL_SOCKET_NTHREADS=1 (4 TCP flows and one
# helper thread per connection), NCCL_DYNAMIC_CHUNK_SIZE=524288, NCCL_CROSS_NIC=0 (rings stay on their rail,
# as modelled anyway). Google's commit 0e5609b0 drops the channel bounds for GKE 1.34+ as "a
# performance bottleneck" and allows Ring,Tree; the rows of nccl_real.csv ran the earlier setting.
TCPX = NcclEnv(algorithms=("ring",), protocols=("simple",), min_channels=8, max_channels=8,
               p2p_net_chunk_bytes=512 * KiB, p2p_nvl_chunk_bytes=1024 * KiB, pxn=False, unpack=True)

# GCP A3 Mega, GPUDirect-TCPXO: nccl-env-profile-simple.sh (google/nccl-plugin-gpudirect-tcpxo
# tcpxo_scripts; the default profile of GCP's releases up to 2025-02, gpudirect-tcpxo/README.md):
# NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple, NCCL_MIN_NCHANNELS=4, NCCL_P2P_NET_CHUNKSIZE=524288,
# NCCL_P2P_NVL_CHUNKSIZE=1048576, NCCL_NVLS_ENABLE=0 (the hardware file's nvls = false), and
# NCCL_TUNER_PLUGIN=libnccl-tuner.so with a3plus_tuner_config_simple.textproto, shipped only inside
# the installer image: its per-size algorithm, protocol and channel choices are not published. The
# plugin is a host device (nccl_shim.cc: netDeviceType = NCCL_NET_DEVICE_HOST); NCCL_BUFFSIZE=8388608
# (also in Google's release notes for plugin v1.0.3, container-engine-accelerators gpudirect-tcpxo/
# README.md, 2024-06-27: 1 MiB Tree/Simple chunks). Not modelled: NCCL_FASTRAK_NUM_FLOWS=2, the tuner
# plugin's chunk sizes (its getChunkSize may change the chunk: unpublished). Later profiles add LL128
# (2025-05) and NVLSTree (2025-08, NCCL_NVLSTREE_MAX_CHUNKSIZE=131072); dstack's A3 Mega all-gather ran
# the LL128 profile.
TCPXO = NcclEnv(algorithms=("ring", "tree"), protocols=("simple",), min_channels=4,
                p2p_net_chunk_bytes=512 * KiB, p2p_nvl_chunk_bytes=1024 * KiB, buffsize_bytes=8 * MiB,
                tuner_plugin="libnccl-tuner.so (a3plus_tuner_config_simple.textproto)")

FABRIC_ENV: dict[str, NcclEnv] = {"tcpx": TCPX, "tcpxo": TCPXO}


def env_for(cluster: ClusterSpec) -> NcclEnv:
    """The environment jobs on ``cluster`` run under: the variables its description sets
    (``cluster.nccl_env``, hardware/nccl_vars) over its fabric's vendor environment, else NCCL's
    defaults (InfiniBand and RoCE need none of these variables)."""
    return _env(cluster.fabric, cluster.nccl_env)


@functools.lru_cache(maxsize=None)
def _env(fabric: str, overrides: tuple[tuple[str, Any], ...]) -> NcclEnv:
    env = FABRIC_ENV.get(fabric, DEFAULT)
    fields: dict[str, Any] = dict(overrides)  # NcclEnv field -> value, checked by hardware/nccl_vars
    return replace(env, **fields) if fields else env
