"""Times the paged-attention kernels against their XLA implementation and JAX's own Pallas ops.

  python -m kernels_pallas.bench                   # on a GPU/TPU: the full table
  python -m kernels_pallas.bench --interpret       # on CPU: small sizes, correctness only

Decode: batch {1, 8, 64} x context {512, 4096, 32768}, reporting achieved KV-read bandwidth
against the device's measured copy bandwidth. Ragged prefill: 1-8 sequences of 512-8192
tokens, reporting FLOP/s against a measured bf16 matmul. Every row also carries the max abs
error against the dense reference (computed where it fits in memory). Interpret-mode timings
are not performance numbers and are printed as such.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import kernels_pallas
from kernels_pallas.platform import pick_variant

KV_HEADS, GQA, HEAD_DIM, PAGE_SIZE = 8, 4, 128, 16


def timed(fn, *args, iters: int = 10) -> float:
  """Median seconds of fn(*args) after one warm-up call (compile excluded)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
  """Bytes/s of a large device-to-device copy (read + write counted)."""
  x = jnp.ones((nbytes // 2,), jnp.bfloat16)
  return 2 * nbytes / timed(jax.jit(lambda a: a + 1), x)


def matmul_flops(n: int = 8192) -> float:
  a = jnp.ones((n, n), jnp.bfloat16)
  return 2 * n ** 3 / timed(jax.jit(lambda x, y: x @ y), a, a)


def decode_inputs(batch, context, dtype, seed=0):
  rng = np.random.default_rng(seed)
  pages_per_seq = context // PAGE_SIZE
  total = batch * pages_per_seq
  shape = (KV_HEADS, total, PAGE_SIZE, HEAD_DIM)
  k = jax.random.normal(jax.random.key(seed), shape, dtype)
  v = jax.random.normal(jax.random.key(seed + 1), shape, dtype)
  q = jax.random.normal(jax.random.key(seed + 2), (batch, KV_HEADS * GQA, HEAD_DIM), dtype)
  table = jnp.asarray(rng.permutation(total).reshape(batch, pages_per_seq), jnp.int32)
  return q, k, v, jnp.full((batch,), context, jnp.int32), table


def bench_decode(batch, context, dtype, interpret, ceiling_bps, with_reference=True,
                 variant=None):
  args = decode_inputs(batch, context, dtype)
  ours = jax.jit(lambda *a: kernels_pallas.paged_attention(*a, interpret=interpret,
                                                           variant=variant))
  row = {"kernel": "decode", "batch": batch, "context": context, "dtype": jnp.dtype(dtype).name}
  out = ours(*args)
  kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * jnp.dtype(dtype).itemsize
  if with_reference:
    ref = jax.jit(kernels_pallas.paged_attention_reference)(*args)
    row["max_abs_err"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
  if interpret:
    return row
  row["pdjax_s"] = timed(ours, *args)
  row["pdjax_GBps"] = kv_bytes / row["pdjax_s"] / 1e9
  row["pct_of_copy"] = 100 * kv_bytes / row["pdjax_s"] / ceiling_bps
  row["xla_s"] = timed(jax.jit(kernels_pallas.paged_attention_xla), *args)
  if jax.default_backend() == "gpu":
    from jax.experimental.pallas.ops.gpu import paged_attention as jax_gpu
    q, k, v, lengths, table = args
    theirs = jax.jit(lambda q, k, v, t, l: jax_gpu.paged_attention(
        q * HEAD_DIM ** -0.5, k, v, t, l, pages_per_compute_block=8))
    row["jax_pallas_s"] = timed(theirs, q, k, v, table, lengths)
  return row


def ragged_inputs(num_seqs, seq_len, dtype, seed=0):
  rng = np.random.default_rng(seed)
  pages_per_seq = seq_len // PAGE_SIZE
  total = num_seqs * pages_per_seq
  shape = (KV_HEADS, total, PAGE_SIZE, HEAD_DIM)
  k = jax.random.normal(jax.random.key(seed), shape, dtype)
  v = jax.random.normal(jax.random.key(seed + 1), shape, dtype)
  q = jax.random.normal(jax.random.key(seed + 2), (num_seqs * seq_len, KV_HEADS * GQA, HEAD_DIM),
                        dtype)
  table = jnp.asarray(rng.permutation(total).reshape(num_seqs, pages_per_seq), jnp.int32)
  cu = jnp.arange(num_seqs + 1, dtype=jnp.int32) * seq_len
  return (q, k, v, jnp.full((num_seqs,), seq_len, jnp.int32), table, cu,
          jnp.array([num_seqs], jnp.int32))


def bench_ragged(num_seqs, seq_len, dtype, interpret, ceiling_flops, with_reference=True,
                 variant=None):
  args = ragged_inputs(num_seqs, seq_len, dtype)
  ours = jax.jit(lambda *a: kernels_pallas.ragged_paged_attention(*a, interpret=interpret,
                                                                  variant=variant))
  row = {"kernel": "ragged", "seqs": num_seqs, "seq_len": seq_len, "dtype": jnp.dtype(dtype).name}
  out = ours(*args)
  if with_reference:
    ref = kernels_pallas.ragged_paged_attention_reference(*args)
    row["max_abs_err"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
  if interpret:
    return row
  flops = 4 * num_seqs * (seq_len * (seq_len + 1) // 2) * KV_HEADS * GQA * HEAD_DIM  # causal
  row["pdjax_s"] = timed(ours, *args)
  row["pdjax_TFLOPs"] = flops / row["pdjax_s"] / 1e12
  row["pct_of_matmul"] = 100 * flops / row["pdjax_s"] / ceiling_flops
  fits = num_seqs * seq_len <= 8192
  row["xla_s"] = timed(jax.jit(kernels_pallas.ragged_paged_attention_xla), *args) if fits else None
  return row


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--interpret", action="store_true", help="CPU: small sizes, errors only")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--variant", default=None, choices=["tpu", "gpu"],
                      help="kernel flavour (default: by platform; gpu-flavoured on CPU)")
  parser.add_argument("--out", default="", help="also write the rows as JSON here")
  a = parser.parse_args()
  dtype = jnp.dtype(a.dtype)
  print(f"platform={jax.default_backend()} device={jax.devices()[0].device_kind} "
        f"jax={jax.__version__} variant={pick_variant(a.variant, a.interpret)} dtype={a.dtype}")
  rows = []
  if a.interpret:   # interpret mode is a correctness check, not a timing
    decode_sizes, ragged_sizes, ceil_bps, ceil_flops = [(1, 64), (4, 256)], [(1, 64), (3, 128)], 0, 0
  else:
    ceil_bps, ceil_flops = copy_bandwidth(), matmul_flops()
    print(f"ceilings: copy {ceil_bps / 1e9:.0f} GB/s, bf16 matmul {ceil_flops / 1e12:.0f} TFLOP/s")
    decode_sizes = [(b, c) for b in (1, 8, 64) for c in (512, 4096, 32768)]
    ragged_sizes = [(1, 512), (1, 8192), (4, 2048), (8, 512), (8, 8192)]
  for batch, context in decode_sizes:
    rows.append(bench_decode(batch, context, dtype, a.interpret, ceil_bps,
                             with_reference=batch * context <= 64 * 4096, variant=a.variant))
    print(json.dumps(rows[-1]))
  for seqs, seq_len in ragged_sizes:
    rows.append(bench_ragged(seqs, seq_len, dtype, a.interpret, ceil_flops,
                             with_reference=seqs * seq_len <= 8192, variant=a.variant))
    print(json.dumps(rows[-1]))
  if a.out:
    with open(a.out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
