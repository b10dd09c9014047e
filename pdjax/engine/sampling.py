"""On-device sampling: greedy where temperature is 0, else softmax sampling at that temperature.

A row whose logits are not all finite (NaN/inf: a poisoned checkpoint or a numerical blow-up)
samples NON_FINITE (-1) instead of a token: the scheduler fails that request with the reason
rather than emitting a meaningless argmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp


NON_FINITE = -1


def sample(logits, temperatures, key):
  """logits float32 [B, V], temperatures float32 [B], key: a PRNG key -> int32 [B]."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  safe_t = jnp.where(temperatures > 0, temperatures, 1.0)
  sampled = jax.random.categorical(key, logits / safe_t[:, None], axis=-1).astype(jnp.int32)
  tokens = jnp.where(temperatures > 0, sampled, greedy)
  return jnp.where(jnp.all(jnp.isfinite(logits), axis=-1), tokens, NON_FINITE)
