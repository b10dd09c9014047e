"""The pure device programs: prefill, decode, and the KV page gather/scatter used by transfer.

Each is a plain function of explicit state (params, KV pools, a batch of metadata arrays) that
`Instance` jits once per bucket with its own shardings, KV donated. Batches are dicts of arrays
built on the host by `pdjax.engine.batch`; see that module for every field's shape.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pdjax.engine.sampling import row_keys, sample
from pdjax.models.llama import Llama


def unpack(flat, layout):
  """The batch dict from `batch.pack`'s int32 buffer: static slices, float32 fields bitcast."""
  out, at = {}, 0
  for name, shape, dtype in layout:
    n = int(np.prod(shape, dtype=np.int64))
    v = flat[at:at + n].reshape(shape)
    out[name] = v if dtype == "int32" else jax.lax.bitcast_convert_type(v, jnp.dtype(dtype))
    at += n
  return out


def input_tokens(batch, prev_tokens):
  """The step's input tokens: from the batch, or, where prev_rows >= 0, the previous step's
  sampled token in that row (still on the device: overlapped scheduling)."""
  rows = batch["prev_rows"]
  return jnp.where(rows >= 0, prev_tokens[jnp.maximum(rows, 0)], batch["tokens"])


def _padded(tokens, token_rows: int):
  """Every step returns `token_rows` tokens, so any step's output can feed any next step."""
  return jnp.zeros(token_rows, jnp.int32).at[:tokens.shape[0]].set(tokens)


def prefill(params, kv, flat, prev_tokens, *, model: Llama, layout, token_rows: int):
  """Writes the prompts' KV into the pools and samples each sequence's first token.

  flat: the packed batch (see pdjax.engine.batch); prev_tokens int32 [token_rows]: the
  previous step's output. Returns (tokens int32 [token_rows], kv). Rows past
  batch["num_seqs"] are padding. A sequence of kv_len tokens samples the token at position
  kv_len (keyed by the batch's run seed, its own seed and that position).
  """
  batch = unpack(flat, layout)
  meta = {k: batch[k] for k in ("positions", "slot_mapping", "kv_lens", "page_indices",
                                 "cu_q_lens", "num_seqs")}
  last = jnp.maximum(batch["cu_q_lens"][1:] - 1, 0)
  logits, kv = model.apply(params, input_tokens(batch, prev_tokens), kv, meta, last)
  keys = row_keys(batch["run_seed"][0], batch["seeds"], batch["kv_lens"])
  return _padded(sample(logits, batch["temperatures"], keys, batch["top_ps"]), token_rows), kv


def decode(params, kv, flat, prev_tokens, *, model: Llama, layout, token_rows: int):
  """One decode step for a batch of sequences: appends one token's KV, samples the next token.

  Returns (tokens int32 [token_rows], kv). The token sampled goes at position + 1 = lengths.
  """
  batch = unpack(flat, layout)
  meta = {k: batch[k] for k in ("positions", "slot_mapping", "lengths", "page_indices")}
  rows = jnp.arange(batch["tokens"].shape[0])
  logits, kv = model.apply(params, input_tokens(batch, prev_tokens), kv, meta, rows)
  keys = row_keys(batch["run_seed"][0], batch["seeds"], batch["lengths"])
  return _padded(sample(logits, batch["temperatures"], keys, batch["top_ps"]), token_rows), kv


STEPS = {"prefill": prefill, "decode": decode}


def bind_step(kind: str, model: Llama, *, layout, token_rows: int):
  """The step program an instance compiles for one bucket: (params, kv, packed batch, previous
  tokens) -> (tokens int32 [token_rows], kv). kind: "prefill" | "decode"; layout: the bucket's
  `batch.layout`. The run's seed is in the batch (`run_seed`), not bound here: one program
  serves every seed."""
  return functools.partial(STEPS[kind], model=model, layout=layout, token_rows=token_rows)


@functools.lru_cache(maxsize=64)
def step_function(kind: str, cfg, dtype, attention, param_layout: str, layout,
                  token_rows: int):
  """`bind_step` of a Llama(cfg, mode=kind, ...) step, one function object per distinct
  program: instances on other devices with the same shapes pass jax the same function, whose
  trace jax then reuses (only the lowering is per instance). Cleared with jax's caches
  (runner/instance_pool.py)."""
  model = Llama(cfg, mode=kind, dtype=dtype, attention=attention, layout=param_layout)
  return bind_step(kind, model, layout=layout, token_rows=token_rows)


def gather_pages(kv, page_ids, layers: tuple[int, int] | None = None):
  """kv: (k, v) pools [L, KVH, P, ps, D]; page_ids int32 [n] -> [2, L, KVH, n, ps, D] (with
  layers=(a, b): only those layers, [2, b - a, KVH, n, ps, D])."""
  at = slice(None) if layers is None else slice(*layers)
  return jnp.stack([kv[0][at, :, page_ids], kv[1][at, :, page_ids]])


def scatter_pages(kv, pages, page_ids, layers: tuple[int, int] | None = None):
  """Writes pages [2, L, KVH, n, ps, D] into the pools at page_ids (out-of-range ids dropped);
  with layers=(a, b), pages hold layers a..b only and are written there."""
  at = slice(None) if layers is None else slice(*layers)
  k = kv[0].at[at, :, page_ids].set(pages[0], mode="drop")
  v = kv[1].at[at, :, page_ids].set(pages[1], mode="drop")
  return k, v


@functools.lru_cache(maxsize=8)
def _dense_forward(cfg, dtype):
  """The reference's jitted no-cache forward, built once per (model config, dtype) so repeated
  reference runs reuse its compiled shapes."""
  model = Llama(cfg, mode="dense", dtype=dtype)
  return jax.jit(lambda p, toks, last: model.apply(
      p, toks, (), {"positions": jnp.arange(toks.shape[0])}, last[None])[0])


def _reference_logits(forward, params, ids: list[int], bucket: int) -> np.ndarray:
  """The next-token logits after ids. The sequence is zero-padded to a multiple of `bucket` so
  a few shapes compile; causal attention keeps padding after the last real token from
  changing its logits."""
  padded = ids + [0] * (-len(ids) % bucket)
  return np.asarray(forward(params, jnp.array(padded, jnp.int32), jnp.int32(len(ids) - 1))[0])


def reference_generate(params, cfg, prompt_ids, max_new_tokens: int, eos_ids=(), dtype=jnp.float32,
                       bucket: int = 64):
  """No-cache reference: recomputes the whole sequence for every new token (greedy), computing
  in `dtype`."""
  forward = _dense_forward(cfg, jnp.dtype(dtype))
  ids = list(prompt_ids)
  out = []
  for _ in range(max_new_tokens):
    token = int(np.argmax(_reference_logits(forward, params, ids, bucket)))
    out.append(token)
    ids.append(token)
    if token in eos_ids:
      break
  return out


# In a low-precision run, a greedy token within TIE_EPS * eps(dtype) * max|logit| of the
# reference's best is a rounding tie, not a difference (bfloat16: eps = 2^-7).
TIE_EPS = 4


def reference_mismatch(params, cfg, prompt_ids, output_ids, eos_ids=(), dtype=jnp.float32,
                       bucket: int = 64) -> int | None:
  """Teacher-forced check of a greedy output against the no-cache reference in `dtype`: for
  each i, the reference's logits after prompt + output_ids[:i] must make output_ids[i] the
  greedy token (float32: exactly the argmax; lower precision: within the tie tolerance, see
  TIE_EPS), and no token before the last may be an EOS. Returns the first index that fails,
  or None."""
  dtype = jnp.dtype(dtype)
  forward = _dense_forward(cfg, dtype)
  tie = 0.0 if dtype == jnp.float32 else TIE_EPS * float(jnp.finfo(dtype).eps)
  ids = list(prompt_ids)
  for i, token in enumerate(output_ids):
    logits = _reference_logits(forward, params, ids, bucket)
    best = float(logits.max())
    if best - float(logits[token]) > tie * float(np.abs(logits).max()):
      return i
    if token in eos_ids and i < len(output_ids) - 1:
      return i
    ids.append(token)
  return None
