"""How long the default config's instances take to build (issue 45): both placements of
`python -m pdjax.run` (4 colocated x TP2 with the chunked run's programs, 2 prefill + 2 decode
x TP2), cold (an empty persistent compile cache) and warm (the same cache again), with the
compiles on the compile threads (engine/runtime.compile_in_background) against compiles one at
a time on the calling thread, alternated; each build in a process of its own (jax's
persistent cache is set once per process).

  python benchmarks/build_time.py [--rounds=2]

Prints the machine, then per round and way: seconds to build each placement and the programs
built (XLA compiles + cache loads).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

from pdjax import config as config_lib  # noqa: E402
from pdjax.configs.default import get_config  # noqa: E402
from pdjax.engine import options as options_lib  # noqa: E402
from pdjax.engine import runtime  # noqa: E402
from pdjax.engine.cluster import build_instances, enable_compile_cache, host_params  # noqa: E402


def _serial(lowered, on_done):
  """compile_in_background's peer: compiles now, on this thread."""
  future = concurrent.futures.Future()
  compiled, by_xla = runtime.compile_lowered(lowered)
  on_done(by_xla)
  future.set_result((compiled, by_xla))
  return runtime.CompilingProgram(future)


def build_both(cfg, mcfg, params) -> list[tuple[str, float, int]]:
  rows = []
  for mode, chunked in (("colocated", True), ("disaggregated", False)):
    opts = options_lib.engine_options(cfg, chunked=chunked)
    t0 = time.perf_counter()
    insts = build_instances(config_lib.tiers(cfg)[mode], mcfg, params, opts,
                            opts_by_role=options_lib.tier_options(cfg, opts))
    rows.append((mode, time.perf_counter() - t0,
                 sum(i.compiles + i.compiles_from_cache for i in insts)))
    del insts
    jax.clear_caches()
  return rows


def child(way: str, cache: str) -> None:
  """One build of both placements with `way`'s compiles, on the persistent cache `cache`."""
  cfg = get_config()
  mcfg = config_lib.validate(cfg)
  params = host_params(mcfg, checkpoint="", seed=0, dtype="float32")
  if way == "serial":
    import pdjax.engine.instance as instance_lib
    instance_lib.compile_in_background = _serial
  enable_compile_cache(cache)
  for mode, seconds, programs in build_both(cfg, mcfg, params):
    print(f"{mode} {seconds:.2f} {programs}", flush=True)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--child", default="")
  p.add_argument("--cache", default="")
  args = p.parse_args()
  if args.child:
    return child(args.child, args.cache)
  print(f"machine: {platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, "
        f"8 virtual cpu devices; load average at start {os.getloadavg()[0]:.1f}")
  for r in range(args.rounds):
    for way, name in (("threads", "compile threads"), ("serial", "one at a time")):
      with tempfile.TemporaryDirectory() as cache:
        for state in ("cold", "warm"):
          out = subprocess.run([sys.executable, __file__, f"--child={way}", f"--cache={cache}"],
                               capture_output=True, text=True, check=True).stdout
          for line in out.splitlines():
            mode, seconds, programs = line.split()
            print(f"round {r} {name:>15} {state}: {mode:>13} {float(seconds):6.1f} s, "
                  f"{programs} programs (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
  main()
