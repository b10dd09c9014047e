"""Path-choice ablation: length_hybrid's threshold (prompts shorter than it skip the prefill
tier and the KV transfer), from 0 (always disaggregated) to 512 (everything local to decode).

Run:   python -m pdjax.sweep --config=configs/ablate_path.py
Expect: one row per threshold; the seed's advice is that short prompts should not pay the
transfer: a middle threshold should keep TTFT low for chat without hurting documents.
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "pdjax_default_config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))
default = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(default)


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "disaggregated"
  c.scheduler.path = "length_hybrid"
  c.workload.num_requests = 48
  return c


def get_sweep():
  return [{"scheduler.length_threshold": t} for t in (0, 64, 128, 256, 512)]
