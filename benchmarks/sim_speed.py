"""Simulator speed: requests simulated per wall-clock second on a 64-instance cluster.

  python benchmarks/sim_speed.py 100000 colocated        # 64 colocated instances
  python benchmarks/sim_speed.py 100000 disaggregated    # 32 prefill + 32 decode

Tiny Llama on the a100 roofline preset; requests arrive every 0.5 ms with prompts of 20-319
tokens and 4-32 output tokens. Times serving only (the driver loop and the cost model).
"""
import sys
import time

from pdjax.runner import serve_requests as serving
from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import PRESETS
from pdjax.request import Request, SamplingParams
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.instance import build_sim_instances, sim_transfer


def main(num_requests: int, mode: str) -> None:
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=4096, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,))
  tiers = ([("colocated", 64, 1)] if mode == "colocated" else
           [("prefill", 32, 1), ("decode", 32, 1)])
  insts = build_sim_instances(tiers, PRESETS["tiny"], opts, hardware="a100", clock=clock)
  reqs = [Request(id=f"r{i}", arrival_s=0.0005 * i, prompt_ids=[5] * (20 + 13 * i % 300),
                  sampling=SamplingParams(max_new_tokens=4 + i % 29))
          for i in range(num_requests)]
  start = time.perf_counter()
  result = serving.serve(mode, insts, reqs, clock=clock, transfer_fn=sim_transfer)
  wall = time.perf_counter() - start
  print(f"{mode} {num_requests} requests: {wall:.1f} s wall, "
        f"{num_requests / wall:.0f} requests simulated / s, {result.duration_s:.1f} s virtual, "
        f"{len(result.steps)} steps")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])
