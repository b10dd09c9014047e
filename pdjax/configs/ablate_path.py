"""Path-choice ablation: length_hybrid's threshold (prompts shorter than it skip the prefill
tier and the KV transfer), from 0 (always disaggregated) to 512 (everything local to decode).

Run:   python -m pdjax.sweep --config=configs/ablate_path.py
Expect: one row per threshold; the seed's advice is that short prompts should not pay the
transfer: a middle threshold should keep TTFT low for chat without hurting documents.
"""

from pdjax.config import sibling_config

default = sibling_config(__file__)


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "disaggregated"
  c.scheduler.path = "length_hybrid"
  c.workload.num_requests = 48
  return c


def get_sweep():
  return [{"scheduler.length_threshold": t} for t in (0, 64, 128, 256, 512)]
