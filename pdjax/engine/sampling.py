"""On-device sampling: greedy where temperature is 0, else softmax sampling at that temperature."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample(logits, temperatures, key):
  """logits float32 [B, V], temperatures float32 [B], key: a PRNG key -> int32 [B]."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  safe_t = jnp.where(temperatures > 0, temperatures, 1.0)
  sampled = jax.random.categorical(key, logits / safe_t[:, None], axis=-1).astype(jnp.int32)
  return jnp.where(temperatures > 0, sampled, greedy)
