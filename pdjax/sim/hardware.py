"""Accelerator presets from public datasheets (per chip): dense bf16 FLOP/s, HBM capacity and
bandwidth, the default P->D link bandwidth (ICI for TPUs, NVLink for GPUs; override it with
`sim.link_gbps`, e.g. DCN or InfiniBand between hosts), and the chip-to-chip interconnect the
tensor-parallel all-reduces inside an instance run over.

Collective bandwidth (`ici_bytes_per_s`) is per chip and per direction: what one chip can send
at once over all its links, i.e. half the bidirectional figure the datasheets quote. A ring
all-reduce sends and receives the same bytes on every chip, so one direction is what bounds it.
Sources (bidirectional per chip -> per direction used here):
  tpu_v5e  400 GB/s -> 200 GB/s   cloud.google.com/tpu/docs/v5e ("Bidirectional ICI bandwidth
                                  (per chip)", 4 ICI ports, 2D torus)
  tpu_v5p 1200 GB/s -> 600 GB/s   cloud.google.com/tpu/docs/v5p (3D torus)
  tpu_v6e  800 GB/s -> 400 GB/s   cloud.google.com/tpu/docs/v6e (4 ICI ports, 2D torus)
  a100     600 GB/s -> 300 GB/s   NVIDIA A100 datasheet, NVLink 3 (12 links x 50 GB/s bidir.)
  h100     900 GB/s -> 450 GB/s   NVIDIA H100 SXM datasheet, NVLink 4 (18 links x 50 GB/s)
  h200     900 GB/s -> 450 GB/s   NVIDIA H200 SXM datasheet, NVLink 4
This is the ceiling a well-mapped ring reaches (NCCL over NVSwitch spreads a ring over all
NVLinks; XLA maps a TPU all-reduce over the slice's torus axes); measured all-reduce bus
bandwidth is lower, so the TP cost these figures give is optimistic on bandwidth.

Per-step latency (`ici_latency_s`, 2 us for every preset) is an assumption, not a datasheet
figure: a ring all-reduce over TP chips takes 2 (TP - 1) dependent steps. NCCL's own tuning
model (NVIDIA/nccl src/graph/tuning.cc) costs an NVLink ring step 0.47 us (LL protocol) to
3.4 us (Simple) on top of a 6.6-8.4 us base per call: 7.5-13 us (LL) and 15-56 us (Simple) per
all-reduce at TP 2-8, against 4-28 us here. Google publishes no ICI hop latency; TPUs use the
same figure.

Host link (`host_bytes_per_s`, the host KV tier's offloads and reloads), per chip per
direction: PCIe Gen4 x16 (a100) 32 GB/s, PCIe Gen5 x16 (h100, h200) 64 GB/s, nominal (measured
pinned-memory copies reach ~80% of it). TPUs: 32 GB/s assumed (Google publishes no per-chip
host DMA figure). `sim.host_link_gbps` overrides it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
  name: str
  bf16_flops: float        # dense peak, FLOP/s
  hbm_bytes: float
  hbm_bytes_per_s: float
  link_bytes_per_s: float  # default P->D link
  ici_bytes_per_s: float | None = None   # TP collectives, per chip per direction; None: the link
  ici_latency_s: float = 2e-6            # per ring all-reduce step (chip-to-chip hop)
  host_bytes_per_s: float = 32e9         # host <-> chip copies (the host KV tier), per chip

  @property
  def collective_bytes_per_s(self) -> float:
    """The bandwidth a chip's TP all-reduce traffic moves at (ici_bytes_per_s, else the link)."""
    return self.ici_bytes_per_s or self.link_bytes_per_s


GB = 1e9
HARDWARE = {h.name: h for h in (
    Hardware("tpu_v5e", 197e12, 16 * GB, 819 * GB, 200 * GB, ici_bytes_per_s=200 * GB),
    Hardware("tpu_v5p", 459e12, 95 * GB, 2765 * GB, 600 * GB, ici_bytes_per_s=600 * GB),
    Hardware("tpu_v6e", 918e12, 32 * GB, 1640 * GB, 448 * GB, ici_bytes_per_s=400 * GB),
    Hardware("a100", 312e12, 80 * GB, 2039 * GB, 600 * GB, ici_bytes_per_s=300 * GB),
    Hardware("h100", 989e12, 80 * GB, 3350 * GB, 900 * GB, ici_bytes_per_s=450 * GB,
             host_bytes_per_s=64 * GB),
    Hardware("h200", 989e12, 141 * GB, 4800 * GB, 900 * GB, ici_bytes_per_s=450 * GB,
             host_bytes_per_s=64 * GB),
)}
