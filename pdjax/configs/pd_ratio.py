"""P:D ratio on 8 devices: 1P3D, 2P2D, 3P1D (TP2 each), same workload, disaggregated.

Run:   python -m pdjax.sweep --config=configs/pd_ratio.py
Expect: sweep.md with one row per ratio; on a prefill-heavy mix (long documents) more prefill
instances cut TTFT, more decode instances cut TPOT and transfer waits.
"""

from pdjax.config import sibling_config

default = sibling_config(__file__)


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "disaggregated"
  c.workload.num_requests = 48
  c.workload.rate = 8.0
  return c


def get_sweep():
  return [{"cluster.prefill.instances": p, "cluster.decode.instances": 4 - p}
          for p in (1, 2, 3)]
