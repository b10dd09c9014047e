"""The study's config: pdjax's smoke config on the simulator, with the study's router, path
policy, workload and chip. Run it from anywhere (this folder is put first on sys.path):

  python -m pdjax.run --config=examples/custom_policy/study.py
  python -m pdjax.sweep --config=examples/custom_policy/study.py     (get_sweep below)
  python -m pdjax.run --config=examples/custom_policy/study.py --config.backend=jax \
      --config.model.preset=tiny --config.model.dtype=float32      (the engine, on this CPU)
"""

import os

from pdjax.configs import default

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg=None):
  c = default.get_config("smoke")
  c.backend, c.mode = "sim", "disaggregated"
  c.model.preset, c.model.dtype = "llama3_8b", "bfloat16"   # (simulated: no weights needed)
  c.sim.hardware = os.path.join(HERE, "lab_chip.json")
  c.workload.kind, c.workload.path = "python", "my_workloads:chat_bursts"
  c.workload.num_requests = 32
  c.scheduler.prefill_router = "my_policies:ShortestWait"
  c.scheduler.decode_router = "weighted"
  c.scheduler.decode_scorers = "queue=1,my_policies:FreeSlots=2"
  c.scheduler.path = "my_policies:ShortPromptsStayLocal"
  c.scheduler.policy_args.local_below = 48
  c.slo.ttft_s, c.slo.tpot_s = 0.02, 0.005
  return c


def get_sweep():
  """The study's router against the built-in default, on the same seeds (with `repeats`)."""
  return [{"scheduler.prefill_router": "least_loaded"},
          {"scheduler.prefill_router": "my_policies:ShortestWait"}]
