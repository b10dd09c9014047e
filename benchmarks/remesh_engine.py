"""Re-meshing the real engine's decode tier live (scheduler.role_switch=remesh): how long a
merge (k x TP1 -> 1 x TPk) and the split back take while requests decode, phase by phase,
and whether any token changed.

  python benchmarks/remesh_engine.py [--model=tiny|smollm2] [--requests=8] [--max-new=48]
      [--param-layout=auto|stacked]

One prefill instance at TP1 and a decode tier of k TP1 instances (tiny: k=2; SmolLM2-135M:
k=3, its 3 KV heads allow TP 1 or 3) on simulated CPU devices. Start-up builds the instances
and one standby instance for the merged layout (its programs compiled then: `standby_s`).
Then the same requests (all at t=0, greedy, every answer --max-new tokens long) are served
twice on the same instances: without re-meshing, and with a policy that merges the decode
tier once every request decodes there and splits it back once the merged instance has
finished one. Printed: each switch's phases (drain, reshard, compile, migrate, rejoin wait),
the requests it moved, the serve wall time of both runs, and whether every request's tokens
equal the run without re-meshing. Goal (issue 31): merge and split < 2 s each, 0 lost,
tokens identical.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # PYTHONPATH wins
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()


def _model(name: str):
  import jax
  import numpy as np
  if name == "tiny":
    from pdjax.models.llama import init_params
    from pdjax.models.llama_config import PRESETS
    cfg = PRESETS["tiny"]
    return cfg, jax.tree_util.tree_map(np.asarray, init_params(cfg, seed=0)), 2
  from pdjax.models.hf_loader import load_hf_checkpoint
  from pdjax.text.gguf import smollm2_folder
  cfg, params = load_hf_checkpoint(smollm2_folder(), dtype=np.float32)
  return cfg, params, 3


class WhenDecoding:
  """Merge once `n` requests decode on the tier; split once the merged instance finished one."""

  def __init__(self, n: int, k: int):
    self.n, self.k, self.stage = n, k, 0

  def decide(self, *_):
    return []

  def remesh(self, now, prefill_tier, decode_tier, backlog):
    from pdjax.scheduler.policies.remesh import RemeshPlan
    busy = sum(len(w.running) for w in decode_tier)
    if self.stage == 0 and len(decode_tier) == self.k and busy >= self.n:
      self.stage = 1
      return RemeshPlan("decode", 1, self.k, f"{busy} decoding")
    if self.stage == 1 and len(decode_tier) == 1 and decode_tier[0].token_interval_s:
      self.stage = 2
      return RemeshPlan("decode", self.k, 1, "one finished on the merged instance")
    return None


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
  ap.add_argument("--requests", type=int, default=8)
  ap.add_argument("--max-new", type=int, default=48)
  ap.add_argument("--param-layout", default="auto", choices=("auto", "stacked"),
                  help="model.param_layout (auto: CPU TP1 instances unrolled)")
  args = ap.parse_args(argv)
  t_cmd = time.perf_counter()
  import jax
  from pdjax.engine.cluster import build_instances, enable_compile_cache
  from pdjax.engine.options import EngineOptions
  from pdjax.engine.remesh import EngineRemeshBuilder
  from pdjax.request import Request, SamplingParams, Status
  from pdjax.runner.serve_requests import serve
  from pdjax.scheduler import policies as policy_lib
  enable_compile_cache(os.path.expanduser("~/.cache/pdjax/xla"))
  cfg, params, k = _model(args.model)
  opts = EngineOptions(page_size=16, num_pages=256, max_model_len=512, prefill_buckets=(128,),
                       max_prefill_seqs=4, decode_buckets=(4, 8, 16), dtype="float32", seed=0,
                       param_layout=args.param_layout)
  t0 = time.perf_counter()
  instances = build_instances([("prefill", 1, 1), ("decode", k, 1)], cfg, params, opts)
  builder = EngineRemeshBuilder(cfg, {"prefill": opts, "decode": opts}, instances)
  build_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  builder.precompile({"decode": [(1, k)]}, params)
  standby_s = time.perf_counter() - t0
  names = dict(prefill_router="least_loaded", decode_router="least_loaded",
               path="always_disagg", admission="none", colocated_policy="prefill_first",
               role_switch="none")

  def requests():
    return [Request(id=f"r{i}", arrival_s=0.0,
                    prompt_ids=[(7 * i + j) % 400 + 3 for j in range(20 + 9 * i)],
                    sampling=SamplingParams(max_new_tokens=args.max_new), eos_ids=())
            for i in range(args.requests)]

  def run(remesh: bool):
    policies = policy_lib.build(names, dict(token_budget=128, max_prefill_seqs=4))
    kw = {}
    if remesh:
      policies.role_switch = WhenDecoding(min(args.requests, 4 * k), k)
      kw = dict(remesh_builder=builder)
    t = time.perf_counter()
    result = serve("disaggregated", [i for i in builder.live if i.role == "prefill"]
                   + [i for i in builder.live if i.role == "decode"], requests(),
                   policies=policies, **kw)
    return result, time.perf_counter() - t

  base, base_s = run(False)
  result, remesh_s = run(True)
  device = jax.devices()[0]
  print(f"# re-mesh on the real engine: model={args.model} ({cfg.num_layers} layers), "
        f"backend={device.platform} ({jax.device_count()} devices), jax {jax.__version__}, "
        f"float32; 1 prefill x TP1 + decode {k} x TP1 <-> 1 x TP{k}; "
        f"{args.requests} requests at t=0, {args.max_new} tokens each, greedy; param_layout "
        f"{args.param_layout}")
  print(f"start-up: instances built {build_s:.2f} s, standby TP{k} instance {standby_s:.2f} s")
  for e in result.remesh_events:
    phases = ", ".join(f"{p} {s * 1e3:.1f}" for p, s in e["phases_s"].items())
    print(f"{e['from']} -> {e['to']}: total {e['total_s'] * 1e3:.1f} ms ({phases} ms); "
          f"moved {e['migrated']}, requeued {e['requeued']}, recomputed {e['recomputed']}; "
          f"ok={e['ok']}")
  lost = sum(r.status != Status.FINISHED for r in result.requests)
  same = {r.id: r.output_ids for r in result.requests} == \
      {r.id: r.output_ids for r in base.requests}
  print(f"serve wall: without re-mesh {base_s:.2f} s, with {remesh_s:.2f} s "
        f"(one run each: the difference includes the switches and the other layout's steps)")
  print(f"requests not finished: {lost}; tokens identical to the run without re-meshing: {same}")
  print(f"whole command: {time.perf_counter() - t_cmd:.1f} s")
  return 0 if same and not lost else 1


if __name__ == "__main__":
  sys.exit(main())
