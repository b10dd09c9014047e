"""Decode-router ablation on multi-turn agent sessions (KV stays long, sessions return).

Run:   python -m pdjax.sweep --config=configs/ablate_router.py
Expect: one row per decode router; session_sticky and kv_aware keep sessions where their KV
fits, least_loaded/round_robin spread them blindly.
"""

from pdjax.config import sibling_config

default = sibling_config(__file__)


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "disaggregated"
  c.workload.preset = "agent_multiturn"
  c.workload.num_requests = 48
  c.workload.rate = 8.0
  return c


def get_sweep():
  return [{"scheduler.decode_router": r} for r in
          ("least_loaded", "round_robin", "random", "power_of_two", "kv_aware", "session_sticky")]
