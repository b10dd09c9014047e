"""Where a decode step's time goes, per phase, on a real model: the engine's step program vs the
same program with one phase taken out, and the phases alone, at several batch sizes.

  python benchmarks/decode_profile.py [--batches=1,4,64] [--context=128] [--reps=20]
      [--checkpoint=DIR] [--tp=1] [--layout=auto|stacked|unrolled] [--num_pages=N]
      [--max_model_len=N]
      [--prefill_len=N --prefill_bucket=128]
      [--out=FILE.json]

Model: SmolLM2-135M-Instruct (pdjax.text.gguf.smollm2_folder(), or --checkpoint), float32, the
XLA attention (the CPU default), one instance of --tp devices. Each batch row is a sequence of
--context tokens already in the cache (its pages allocated in order); the step appends one.

Rows, each the median of --reps runs after warm-up, timed from dispatch until the tokens are on
the host (what the driver waits for):
  step         the engine's compiled decode program (Instance.decode: metadata built and packed
               on the host, dispatched, tokens read back);
  host         building and packing the batch alone (no device work);
  -attention   the step with the paged attention replaced by zeros (the difference is attention);
  -kv write    the step without writing the new token's K/V into the pools;
  lm head      x [B, hidden] @ embedding^T alone; sampling: greedy sample() over [B, vocab] alone;
  matmuls      the 30 layers' projections and MLP alone, in the instance's parameter layout
               (stacked: one scanned body; unrolled: one body per layer).
Shares are of `step`; the ablated rows overlap (XLA fuses across phases), so they need not sum.
Then, per batch, the step against this machine's rooflines measured in the same run: the bytes
it must read (every weight once, the batch's K/V) over numpy's copy bandwidth, and its FLOPs
over numpy's float32 matmul rate (1.0 = the step runs at that limit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # PYTHONPATH wins
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from transfer import median_s  # noqa: E402  (the benchmarks' median of timed runs)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,4,64")
  parser.add_argument("--context", type=int, default=128)
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--checkpoint", default=None)
  parser.add_argument("--tp", type=int, default=1)
  parser.add_argument("--layout", default="auto", help="model.param_layout: auto, stacked, "
                      "unrolled")
  parser.add_argument("--num_pages", type=int, default=0, help="KV pool pages (default: just "
                      "the largest batch's; the server's smollm2 config has 512)")
  parser.add_argument("--max_model_len", type=int, default=0, help="tokens a block table "
                      "holds (default: just past --context; the server's smollm2 config: 1024)")
  parser.add_argument("--prefill_len", type=int, default=0, help="also time a prefill of one "
                      "prompt of this many tokens, in a bucket of --prefill_bucket")
  parser.add_argument("--prefill_bucket", type=int, default=128)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]

  import jax
  import jax.numpy as jnp
  import numpy as np
  from kernels_pallas.attention_ops import AttentionOps
  from pdjax.engine import batch as batch_lib
  from pdjax.engine import mesh as mesh_lib
  from pdjax.engine import programs
  from pdjax.engine.cluster import host_params
  from pdjax.engine.instance import Instance
  from pdjax.engine.options import EngineOptions
  from pdjax.engine.sampling import sample
  from pdjax.models import llama as llama_lib
  from pdjax.models.llama_config import config_from_hf

  checkpoint = args.checkpoint
  if checkpoint is None:
    from pdjax.text.gguf import smollm2_folder
    checkpoint = smollm2_folder()
  cfg = config_from_hf(checkpoint)
  params = host_params(cfg, checkpoint=checkpoint, seed=0, dtype="float32")
  page_size = 16
  max_len = -(-max(args.context + 16, args.max_model_len) // page_size) * page_size
  pages_per_seq = max_len // page_size
  opts = EngineOptions(page_size=page_size,
                       num_pages=max(args.num_pages, max(batches) * pages_per_seq),
                       max_model_len=max_len, max_prefill_seqs=1,
                       prefill_buckets=(16,) + ((args.prefill_bucket,) if args.prefill_len else ()),
                       decode_buckets=tuple(batches), dtype="float32", attention_impl="xla",
                       param_layout=args.layout, lazy_compile=True)
  spec = mesh_lib.split_devices(jax.devices(), [("colocated", 1, args.tp)])[0]
  inst = Instance(spec, cfg, params, opts)

  def seqs(b):
    return [(1, args.context, list(range(i * pages_per_seq, (i + 1) * pages_per_seq)), 0.0, 0)
            for i in range(b)]

  layout = dict(layout=inst.param_layout)

  class NoAttention(AttentionOps):
    def decode(self, q, *a, **kw):
      return jnp.zeros_like(q)

  def variant_program(b, model=None, write=True):
    """The decode step compiled with a modified model (the instance's shardings)."""
    model = model or llama_lib.Llama(cfg, mode="decode", dtype=jnp.float32, **layout)
    example = inst._padding_batch("decode", b)
    step = programs.bind_step("decode", model, layout=batch_lib.layout(example),
                              token_rows=inst.token_rows)
    in_sh, out_sh = mesh_lib.step_shardings(inst.mesh, inst._param_sh)
    return inst._compile(step, (inst.params, inst.kv, batch_lib.pack(example), inst._no_prev),
                         in_sh, out_sh, donate=(1,))

  def run_variant(compiled, b):
    flat = batch_lib.pack(batch_lib.decode_batch(inst.geom, seqs(b), batch_size=b))

    def fn():
      tokens, inst.kv = compiled(inst.params, inst.kv, flat, inst._no_prev)
      np.asarray(tokens)
    return fn

  rows = {}
  for b in batches:
    r = {}
    r["step"] = median_s(lambda: inst.decode(seqs(b)).result(), args.reps)
    r["host"] = median_s(lambda: batch_lib.pack(batch_lib.decode_batch(
        inst.geom, seqs(b), batch_size=b)), args.reps)
    no_attn = llama_lib.Llama(cfg, mode="decode", dtype=jnp.float32,
                              attention=NoAttention(impl="xla", mesh=inst.mesh), **layout)
    r["-attention"] = median_s(run_variant(variant_program(b, no_attn), b), args.reps)
    original = llama_lib.write_layer_kv
    llama_lib.write_layer_kv = lambda k_pool, v_pool, layer, k, v, slots: (k_pool, v_pool)
    try:
      r["-kv write"] = median_s(run_variant(variant_program(b), b), args.reps)
    finally:
      llama_lib.write_layer_kv = original
    embed = jnp.asarray(params["params"]["embed_tokens"]["embedding"])
    x = jnp.ones((b, cfg.hidden_size), jnp.float32)
    head = jax.jit(lambda x, e: x @ e.T)
    r["lm head"] = median_s(lambda: head(x, embed).block_until_ready(), args.reps)
    logits = head(x, embed)
    greedy = jax.jit(lambda l: sample(l, jnp.zeros(b), jax.random.split(jax.random.key(0), b),
                                      jnp.ones(b)))
    r["sampling"] = median_s(lambda: greedy(logits).block_until_ready(), args.reps)
    r["matmuls"] = median_s(_matmuls(params, x, cfg, inst.param_layout), args.reps)
    r.update(_rooflines(params, cfg, b, args.context, r["step"]))
    rows[b] = r
    print(f"batch {b}: " + ", ".join(f"{k} {v * 1e3:.2f} ms ({v / r['step']:.0%})"
                                      for k, v in r.items() if not k.startswith("roofline")),
          flush=True)
    print(f"batch {b}: step / memory-bandwidth roofline {r['roofline_bandwidth']:.2f} "
          f"({r['roofline_bytes'] / 1e6:.0f} MB a step at {r['roofline_gbps']:.1f} GB/s, numpy "
          f"copy now); step / compute roofline {r['roofline_compute']:.2f} "
          f"({r['roofline_flops'] / 1e9:.1f} GFLOP at {r['roofline_gflops']:.0f} GFLOP/s, numpy "
          f"float32 matmul now)", flush=True)
  if args.prefill_len:
    prompt = [(list(range(3, 3 + args.prefill_len)), 0, list(range(pages_per_seq)), 0.0, 0, 1.0)]
    ms = median_s(lambda: inst.prefill(prompt).result(), args.reps) * 1e3
    print(f"prefill 1 x {args.prefill_len} tokens (bucket {args.prefill_bucket}): {ms:.1f} ms",
          flush=True)
  machine = f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} " \
            f"{jax.default_backend()}"
  print(f"SmolLM2-135M float32, XLA attention, tp={args.tp}, layout {inst.param_layout} "
        f"context {args.context}, {opts.num_pages} pages, "
        f"max_model_len {opts.max_model_len}, "
        f"median of {args.reps}; {machine}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"machine": machine, "context": args.context, "rows": rows}, f, indent=1)


def _rooflines(params, cfg, b: int, context: int, step_s: float) -> dict:
  """The step against what this machine's memory and arithmetic allow, measured now: bytes a
  step must read (every weight once, the batch's K/V of `context` tokens) over numpy's copy
  bandwidth of a 256 MB array (read + write counted), and its FLOPs (2 per weight per row,
  the attention's 4 per cached element) over numpy's float32 matmul rate (2048^3). Each value
  is the roofline time over the step: 1.0 means the step runs at that limit."""
  import time
  import jax
  import numpy as np
  weights = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * context * b
  nbytes = 4 * (weights + kv)
  flops = 2 * weights * b + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context * b

  def best(fn, reps=5):
    fn()
    times = []
    for _ in range(reps):
      t0 = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t0)
    return min(times)
  src, dst = np.ones(64 << 20, np.float32), np.empty(64 << 20, np.float32)
  gbps = 2 * src.nbytes / best(lambda: np.copyto(dst, src)) / 1e9
  a = np.ones((2048, 2048), np.float32)
  gflops = 2 * 2048 ** 3 / best(lambda: a @ a) / 1e9
  return {"roofline_bytes": nbytes, "roofline_gbps": gbps,
          "roofline_bandwidth": nbytes / (gbps * 1e9) / step_s, "roofline_flops": flops,
          "roofline_gflops": gflops, "roofline_compute": flops / (gflops * 1e9) / step_s}


def _matmuls(params, x, cfg, layout: str):
  """The layers' seven projections alone (x through every weight, in the instance's layout:
  a scanned body over stacked weights, or one body per layer)."""
  import jax
  import jax.numpy as jnp
  from pdjax.models.param_layout import to_layout
  names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

  def project(x, p):
    def mm(h, w):
      return h @ w["kernel"].reshape(h.shape[-1], -1)
    q = mm(x, p["q_proj"])
    kv = mm(x, p["k_proj"]).sum() + mm(x, p["v_proj"]).sum()
    o = mm(q, p["o_proj"]) + 0 * kv
    g, u = mm(x, p["gate_proj"]), mm(x, p["up_proj"])
    return x + o + mm(jax.nn.silu(g) * u, p["down_proj"])

  tree = to_layout({"params": {**params["params"]}}, cfg.num_layers, layout)["params"]
  tree = jax.tree_util.tree_map(jnp.asarray, tree)
  if layout == "unrolled":
    layers = [{n: tree[f"layers_{i}"][n] for n in names} for i in range(cfg.num_layers)]

    @jax.jit
    def f(layers, x):
      for p in layers:
        x = project(x, p)
      return x
  else:
    layers = {n: tree["layers"][n] for n in names}

    @jax.jit
    def f(layers, x):
      return jax.lax.scan(lambda x, p: (project(x, p), None), x, layers)[0]
  return lambda: f(layers, x).block_until_ready()


if __name__ == "__main__":
  main()
