"""Simulator speed: requests simulated per wall-clock second on a 64-instance cluster.

  python benchmarks/sim_speed.py 10000 colocated        # 64 colocated instances
  python benchmarks/sim_speed.py 10000 disaggregated    # 32 prefill + 32 decode
"""
import time, sys
from pdjax import serving
from pdjax.engine.instance import EngineOptions
from pdjax.models.llama_config import PRESETS
from pdjax.request import Request, SamplingParams
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.instance import build_sim_instances, sim_transfer
n = int(sys.argv[1]); mode = sys.argv[2]
clock = ManualClock()
opts = EngineOptions(page_size=16, num_pages=4096, max_model_len=512, prefill_buckets=(512,), max_prefill_seqs=4, decode_buckets=(16,))
tiers = [("colocated", 64, 1)] if mode == "colocated" else [("prefill", 32, 1), ("decode", 32, 1)]
insts = build_sim_instances(tiers, PRESETS["tiny"], opts, hardware="a100", clock=clock)
reqs = [Request(id=f"r{i}", arrival_s=0.0005 * i, prompt_ids=[5] * (20 + 13 * i % 300), sampling=SamplingParams(max_new_tokens=4 + i % 29)) for i in range(n)]
t = time.perf_counter()
res = serving.serve(mode, insts, reqs, clock=clock, transfer_fn=sim_transfer)
dt = time.perf_counter() - t
print(mode, n, f"{dt:.1f} s", f"{n/dt:.0f} req/s simulated", "virtual", f"{res.duration_s:.1f} s")
