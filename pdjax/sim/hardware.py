"""Accelerator presets from public datasheets (per chip): dense bf16 FLOP/s, HBM capacity and
bandwidth, and the default P->D link bandwidth (ICI for TPUs, NVLink for GPUs). Override the
link with `sim.link_gbps` (e.g. DCN or InfiniBand between hosts)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
  name: str
  bf16_flops: float        # dense peak, FLOP/s
  hbm_bytes: float
  hbm_bytes_per_s: float
  link_bytes_per_s: float  # default P->D link


GB = 1e9
HARDWARE = {h.name: h for h in (
    Hardware("tpu_v5e", 197e12, 16 * GB, 819 * GB, 200 * GB),
    Hardware("tpu_v5p", 459e12, 95 * GB, 2765 * GB, 600 * GB),
    Hardware("tpu_v6e", 918e12, 32 * GB, 1640 * GB, 448 * GB),
    Hardware("a100", 312e12, 80 * GB, 2039 * GB, 600 * GB),
    Hardware("h100", 989e12, 80 * GB, 3350 * GB, 900 * GB),
    Hardware("h200", 989e12, 141 * GB, 4800 * GB, 900 * GB),
)}
