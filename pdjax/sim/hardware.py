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

  tpu_v7x 1200 GB/s -> 600 GB/s   docs.cloud.google.com/tpu/docs/tpu7x (Ironwood: "Bidirectional
                                  inter-chip interconnect (ICI) bandwidth per chip", 3D torus;
                                  BF16 2307 TFLOP/s, 192 GiB HBM at 7380 GB/s per chip; the
                                  link is its ICI per direction, as for tpu_v5p)
  b200    1800 GB/s -> 900 GB/s   NVIDIA DGX B200 user guide / HGX B200, NVLink 5 (18 links x
                                  100 GB/s bidir.), 1,440 GB for 8 GPUs (180 GB each), 8 TB/s
                                  HBM3e; dense BF16 2.25 PFLOP/s (the datasheet's 4.5 is with
                                  sparsity); PCIe Gen5 x16 hosts (64 GB/s)
  mi300x   896 GB/s -> 448 GB/s   AMD Instinct MI300X (rocm.docs.amd.com, MI300 architecture):
                                  BF16 matrix 1307.4 TFLOP/s dense, 192 GB HBM3 at 5.3 TB/s, 7
                                  peer Infinity Fabric links x 128 GB/s (full mesh, no switch:
                                  one peer pair gets one link, so a single P->D copy sees 128
                                  GB/s, the link used here), PCIe Gen5 x16 (64 GB/s)

Hosts (`chips_per_host`) and the inter-host link (`dcn_bytes_per_s`, per chip per direction,
as ici_bytes_per_s): an instance of TP chips over H > 1 hosts (cluster.<tier>.hosts) runs its
TP ring across hosts, and a ring is bound by its slowest hop, so its all-reduces move at
min(ici, dcn) = the DCN figure (sim/roofline.py); their per-step latency stays ici_latency_s
(an assumption again: no better-sourced inter-host hop figure; it is optimistic for a NIC hop).
Pricing the whole ring at DCN is conservative where a boundary chip could use its host's whole
NIC or XLA/NCCL reduce hierarchically (ICI inside a host, DCN between hosts).
  tpu_v5e 8 chips, 3.125 GB/s    cloud.google.com/tpu/docs/v5e: "Chips per host 8", "Per-host
                                 NIC configuration 2 x 100 Gbps" (= 25 Gb/s per chip; the page's
                                 6.4 Tbps DCN per 256-chip pod agrees). 8 is the serving VM
                                 (ct5lp-hightpu-8t); 4-chip hosts (ct5lp-hightpu-4t) also
                                 exist: a JSON file with chips_per_host=4 models them
  tpu_v5p 4 chips, 6.25 GB/s     cloud.google.com/tpu/docs/v5p: the 4-chip VM, "Data center
                                 network (DCN) bandwidth per chip (Gbps) 50"
  tpu_v6e 8 chips, 12.5 GB/s     cloud.google.com/tpu/docs/v6e: "Chips per host 8" (the 8-chip
                                 ct6e-standard-8t; 4-chip hosts also exist). DCN: ASSUMED 100
                                 Gb/s per chip (4 x 200 Gbps NICs per 8-chip host; not confirmed
                                 from the page here)
  tpu_v7x 4 chips, 12.5 GB/s     cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood:
                                 each TPU7x VM has 4 chips and 2 NICs. DCN: ASSUMED 100 Gb/s per
                                 chip (the NICs' speed is not published there)
  a100    8 GPUs, 25 GB/s        DGX A100 user guide: 8 single-port ConnectX-6 HDR InfiniBand,
                                 200 Gb/s per GPU
  h100    8 GPUs, 50 GB/s        MLPerf Inference v3.1 system description, Dell XE9680 H100-SXM
                                 x8: "8x 400Gb Infiniband" (ConnectX-7 NDR, 400 Gb/s per GPU)
  h200    8 GPUs, 50 GB/s        MLPerf Inference v4.1, NVIDIA H200-SXM-141GBx8: "10x 400Gbe
                                 Infiniband" (8 compute rails, one per GPU, + 2 storage)
  b200    8 GPUs, 50 GB/s        MLPerf Inference v6.0, Nebius B200 x8: "8x ConnectX-7 IB NDR
                                 400Gb/s"
  mi300x  8 GPUs, 50 GB/s        8 OAM GPUs per platform (AMD Instinct MI300X); DCN: ASSUMED
                                 one 400 Gb/s NIC per GPU, as the NVIDIA nodes
A JSON file without chips_per_host has no host limit; without dcn_bytes_per_s a ring over
hosts runs at its ICI figure (so give it to model a multi-host instance).

Your own chip: `sim.hardware` (and each entry of `plan.map_hardware`) also takes the path of a
JSON file with these fields (bf16_flops, hbm_bytes, hbm_bytes_per_s, link_bytes_per_s; optional
ici_bytes_per_s, ici_latency_s, host_bytes_per_s, chips_per_host, dcn_bytes_per_s, name):
`hardware_for`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os


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
  chips_per_host: int | None = None      # chips one host (VM, node) holds; None: no limit
  dcn_bytes_per_s: float | None = None   # between hosts, per chip per direction; None: ICI's

  @property
  def collective_bytes_per_s(self) -> float:
    """The bandwidth a chip's TP all-reduce traffic moves at (ici_bytes_per_s, else the link)."""
    return self.ici_bytes_per_s or self.link_bytes_per_s

  def ring_bytes_per_s(self, hosts: int = 1) -> float:
    """A TP ring's bandwidth over `hosts` hosts: its slowest hop's, the DCN between hosts."""
    if hosts > 1 and self.dcn_bytes_per_s:
      return min(self.collective_bytes_per_s, self.dcn_bytes_per_s)
    return self.collective_bytes_per_s

  def hosts_for(self, tp: int) -> int:
    """The fewest hosts an instance of `tp` chips spans: at least ceil(tp / chips_per_host),
    and a divisor of tp (each host owns tp / hosts chips); 1 without a host limit."""
    if not self.chips_per_host:
      return 1
    hosts = -(-tp // self.chips_per_host)
    while tp % hosts:
      hosts += 1
    return hosts


GB = 1e9
HARDWARE = {h.name: h for h in (
    Hardware("tpu_v5e", 197e12, 16 * GB, 819 * GB, 200 * GB, ici_bytes_per_s=200 * GB,
             chips_per_host=8, dcn_bytes_per_s=3.125 * GB),
    Hardware("tpu_v5p", 459e12, 95 * GB, 2765 * GB, 600 * GB, ici_bytes_per_s=600 * GB,
             chips_per_host=4, dcn_bytes_per_s=6.25 * GB),
    Hardware("tpu_v6e", 918e12, 32 * GB, 1640 * GB, 448 * GB, ici_bytes_per_s=400 * GB,
             chips_per_host=8, dcn_bytes_per_s=12.5 * GB),
    Hardware("a100", 312e12, 80 * GB, 2039 * GB, 600 * GB, ici_bytes_per_s=300 * GB,
             chips_per_host=8, dcn_bytes_per_s=25 * GB),
    Hardware("h100", 989e12, 80 * GB, 3350 * GB, 900 * GB, ici_bytes_per_s=450 * GB,
             host_bytes_per_s=64 * GB, chips_per_host=8, dcn_bytes_per_s=50 * GB),
    Hardware("h200", 989e12, 141 * GB, 4800 * GB, 900 * GB, ici_bytes_per_s=450 * GB,
             host_bytes_per_s=64 * GB, chips_per_host=8, dcn_bytes_per_s=50 * GB),
    Hardware("tpu_v7x", 2307e12, 192 * GB, 7380 * GB, 600 * GB, ici_bytes_per_s=600 * GB,
             chips_per_host=4, dcn_bytes_per_s=12.5 * GB),
    Hardware("b200", 2250e12, 180 * GB, 8000 * GB, 1800 * GB, ici_bytes_per_s=900 * GB,
             host_bytes_per_s=64 * GB, chips_per_host=8, dcn_bytes_per_s=50 * GB),
    Hardware("mi300x", 1307e12, 192 * GB, 5300 * GB, 128 * GB, ici_bytes_per_s=448 * GB,
             host_bytes_per_s=64 * GB, chips_per_host=8, dcn_bytes_per_s=50 * GB),
)}
REQUIRED = ("bf16_flops", "hbm_bytes", "hbm_bytes_per_s", "link_bytes_per_s")
OPTIONAL = ("ici_bytes_per_s", "ici_latency_s", "host_bytes_per_s", "chips_per_host",
            "dcn_bytes_per_s")


class HardwareError(ValueError):
  """A hardware name or file that cannot be used: the message is one line."""


def is_file(name: str) -> bool:
  return name.endswith(".json") or os.sep in name


def hardware_for(name: str, what: str = "sim.hardware") -> Hardware:
  """The preset `name`, or the Hardware of the JSON file at that path (relative to the working
  directory); HardwareError (one line, naming `what`) otherwise."""
  if name in HARDWARE:
    return HARDWARE[name]
  if not isinstance(name, str) or not is_file(name):
    raise HardwareError(f"{what}={name!r} is not one of {sorted(HARDWARE)} (or a .json file)")
  return _from_file(os.path.abspath(name), what)


@functools.lru_cache(maxsize=None)
def _from_file(path: str, what: str) -> Hardware:
  try:
    with open(path) as f:
      fields = json.load(f)
  except OSError as e:
    raise HardwareError(f"{what}={path!r}: cannot read it ({e.strerror})") from None
  except json.JSONDecodeError as e:
    raise HardwareError(f"{what}={path!r}: not JSON ({e.msg} at line {e.lineno})") from None
  if not isinstance(fields, dict):
    raise HardwareError(f"{what}={path!r}: must hold one JSON object of Hardware fields")
  unknown = sorted(set(fields) - set(REQUIRED) - set(OPTIONAL) - {"name"})
  if unknown:
    raise HardwareError(f"{what}={path!r}: unknown field {unknown[0]!r} (fields: "
                        f"{', '.join(REQUIRED + OPTIONAL)}, name)")
  missing = [k for k in REQUIRED if k not in fields]
  if missing:
    raise HardwareError(f"{what}={path!r}: missing required field {missing[0]!r}")
  for key in REQUIRED + OPTIONAL:
    value = fields.get(key)
    if key in fields and (isinstance(value, bool) or not isinstance(value, (int, float))
                          or not math.isfinite(value) or value <= 0):
      raise HardwareError(f"{what}={path!r}: {key}={value!r} must be a finite number > 0")
  per_host = fields.get("chips_per_host", 1)
  if isinstance(per_host, bool) or not isinstance(per_host, int):
    raise HardwareError(f"{what}={path!r}: chips_per_host={per_host!r} must be an integer >= 1")
  name = fields.get("name", os.path.splitext(os.path.basename(path))[0])
  if not isinstance(name, str) or not name:
    raise HardwareError(f"{what}={path!r}: name={name!r} must be a non-empty string")
  return Hardware(name=name, **{k: v if k == "chips_per_host" else float(v)
                                for k, v in fields.items() if k != "name"})
