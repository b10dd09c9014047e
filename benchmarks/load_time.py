"""Parameter load time, HF safetensors vs pdjax orbax, onto 4 instances x TP2 (8 CPU devices).

  python benchmarks/load_time.py [--workdir=/tmp/pdjax_load_time] [--reps=3] [--dtype=float32]
  python benchmarks/load_time.py --hf=~/.cache/pdjax/smollm2/hf --tp=1   # a real HF folder

With --hf, that folder is timed (converted once into --workdir) instead of the random model,
on 4 instances x --tp (SmolLM2's 3 kv heads allow TP1 or TP3).

Makes (once, kept in --workdir) a random SmolLM2-135M-sized Llama saved by transformers in
bfloat16 (vocab 49152, hidden 576, 30 layers, MLP 1536, tied embeddings; 8 heads / 4 kv heads
so TP2 shards it), converts it with pdjax.convert, then times in a fresh process per try what
a run does from `model.checkpoint` to every instance holding its params: `host_params` and one
`place_params` per instance (the part of Instance() that places params), until the arrays are
ready. Prints the median of --reps tries per format and the peak RSS that loading added (on
CPU, device buffers are host memory too: "on devices" is in it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

def child(checkpoint: str, dtype: str, tp: int) -> None:
  """One timed load in this (fresh) process; prints a JSON line."""
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  import jax
  import orbax.checkpoint  # noqa: F401  (imports are not what is timed)
  from pdjax.engine import mesh as mesh_lib
  from pdjax.engine.cluster import host_params
  from pdjax.engine.instance import place_params
  from pdjax.models.llama_config import config_from_hf
  from pdjax.models import hf_loader  # noqa: F401
  mcfg = config_from_hf(checkpoint)
  specs = mesh_lib.split_devices(jax.devices(), [("colocated", 4, tp)])
  rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  t0 = time.perf_counter()
  params = host_params(mcfg, checkpoint=checkpoint, seed=0, dtype=dtype)
  placed = [place_params(mesh_lib.instance_mesh(s.devices), params)[1] for s in specs]
  jax.block_until_ready(placed)
  seconds = time.perf_counter() - t0
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  device_bytes = sum(s.data.nbytes for p in placed for x in jax.tree_util.tree_leaves(p)
                     for s in x.addressable_shards)
  print(json.dumps({"seconds": seconds, "rss_added_mib": (rss - rss0) / 1024,
                    "device_mib": device_bytes / 2**20}))


def make_checkpoints(workdir: str, given_hf: str = "") -> tuple[str, str, float]:
  hf = given_hf or os.path.join(workdir, "hf")
  orbax = os.path.join(workdir, "orbax_" + os.path.basename(os.path.normpath(hf))
                       if given_hf else "orbax")
  if not given_hf and not os.path.isfile(os.path.join(hf, "config.json")):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(hf)
  convert_s = float("nan")
  if not os.path.isdir(orbax):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pdjax.convert", f"--checkpoint={hf}",
                    f"--out={orbax}"], check=True)
    convert_s = time.perf_counter() - t0
  return hf, orbax, convert_s


def _size_mib(folder: str) -> float:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder)
             for f in fs) / 2**20


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", default="/tmp/pdjax_load_time")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--hf", default="", help="an HF folder to time instead of the random model")
  ap.add_argument("--tp", type=int, default=2)
  ap.add_argument("--child", nargs=3, metavar=("CHECKPOINT", "DTYPE", "TP"),
                  help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    return child(args.child[0], args.child[1], int(args.child[2]))
  os.makedirs(args.workdir, exist_ok=True)
  hf, orbax, convert_s = make_checkpoints(args.workdir, os.path.expanduser(args.hf))
  runs = {"hf": [], "orbax": []}
  for rep in range(args.reps):   # alternate the order: drift hits both formats alike
    for fmt in (("hf", "orbax") if rep % 2 == 0 else ("orbax", "hf")):
      path = hf if fmt == "hf" else orbax
      out = subprocess.run([sys.executable, __file__, "--child", path, args.dtype,
                            str(args.tp)],
                           capture_output=True, text=True, check=True).stdout
      runs[fmt].append(json.loads(out.strip().splitlines()[-1]))
  print(f"4 instances x TP{args.tp}, model.dtype={args.dtype}, median of {args.reps}; convert "
        f"{convert_s:.1f} s (nan: reused)")
  print(f"{'format':<8}{'on disk MiB':>13}{'load s':>9}{'tries s':>22}{'peak RSS +MiB':>15}"
        f"{'on devices MiB':>16}")
  for fmt, path in (("hf", hf), ("orbax", orbax)):
    r = runs[fmt]
    tries = ", ".join(f"{x['seconds']:.2f}" for x in r)
    med = lambda k: statistics.median(x[k] for x in r)  # noqa: E731
    print(f"{fmt:<8}{_size_mib(path):>13.0f}{med('seconds'):>9.2f}{tries:>22}"
          f"{med('rss_added_mib'):>15.0f}{med('device_mib'):>16.0f}")


if __name__ == "__main__":
  main()
