"""On-device sampling: greedy where temperature is 0, else softmax sampling at that temperature.

Each row's noise comes from its own key, fold_in(fold_in(key(run seed), row seed), position of
the sampled token): the same request (row seed = Request.sampling_seed) samples the same token
at the same position however it is batched, chunked or placed, and requests with different
seeds draw different noise.

A row whose logits are not all finite (NaN/inf: a poisoned checkpoint or a numerical blow-up)
samples NON_FINITE (-1) instead of a token: the scheduler fails that request with the reason
rather than emitting a meaningless argmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp


NON_FINITE = -1


def row_keys(run_seed: int, seeds, positions):
  """One PRNG key per row: seeds int32 [B] (per request), positions int32 [B] (where the
  sampled token goes in its sequence) -> keys [B]."""
  base = jax.random.key(run_seed)
  return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.fold_in(base, s), p))(
      seeds, positions)


def sample(logits, temperatures, keys):
  """logits float32 [B, V], temperatures float32 [B], keys: one PRNG key per row [B]
  (`row_keys`) -> int32 [B]. A batch with no sampled row skips the noise altogether (greedy
  decoding pays for no random numbers)."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def sampled():
    safe_t = jnp.where(temperatures > 0, temperatures, 1.0)
    scaled = logits / safe_t[:, None]
    drawn = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, scaled)
    return jnp.where(temperatures > 0, drawn.astype(jnp.int32), greedy)

  tokens = jax.lax.cond(jnp.any(temperatures > 0), sampled, lambda: greedy)
  return jnp.where(jnp.all(jnp.isfinite(logits), axis=-1), tokens, NON_FINITE)
