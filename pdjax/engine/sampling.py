"""On-device sampling: greedy where temperature is 0, else softmax sampling at that temperature,
restricted to the row's nucleus when its top_p < 1.

Nucleus (top_p) sampling: after temperature scaling, a row keeps the smallest set of most
likely tokens whose probability mass reaches top_p (always at least the most likely token;
tokens tied with the least likely kept one are kept too), renormalised, and draws from it. A
row with top_p >= 1 draws from the whole distribution exactly as without the filter, and a
batch with no such filtered sampled row skips the sort altogether.

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


def nucleus(scaled, top_ps):
  """scaled float32 [B, V] (logits over temperature), top_ps float32 [B] -> [B, V]: each row
  with top_p < 1 has every token outside its nucleus set to -inf (the draw renormalises over
  the rest); rows with top_p >= 1 are returned unchanged."""
  ordered = -jnp.sort(-scaled, axis=-1)                     # descending
  probs = jax.nn.softmax(ordered, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs               # mass of the tokens ahead of each
  kept = jnp.maximum(jnp.sum(before < top_ps[:, None], axis=-1), 1)
  threshold = jnp.take_along_axis(ordered, (kept - 1)[:, None], axis=-1)
  filtered = jnp.where(scaled >= threshold, scaled, -jnp.inf)
  return jnp.where((top_ps < 1)[:, None], filtered, scaled)


def sample(logits, temperatures, keys, top_ps=None):
  """logits float32 [B, V], temperatures float32 [B], keys: one PRNG key per row [B]
  (`row_keys`), top_ps float32 [B] in (0, 1] (None: all 1) -> int32 [B]. A batch with no
  sampled row skips the noise altogether (greedy decoding pays for no random numbers), and one
  whose sampled rows all have top_p >= 1 skips the nucleus sort."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def sampled():
    safe_t = jnp.where(temperatures > 0, temperatures, 1.0)
    scaled = logits / safe_t[:, None]
    if top_ps is not None:
      scaled = jax.lax.cond(jnp.any((temperatures > 0) & (top_ps < 1)),
                            lambda: nucleus(scaled, top_ps), lambda: scaled)
    drawn = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, scaled)
    return jnp.where(temperatures > 0, drawn.astype(jnp.int32), greedy)

  tokens = jax.lax.cond(jnp.any(temperatures > 0), sampled, lambda: greedy)
  return jnp.where(jnp.all(jnp.isfinite(logits), axis=-1), tokens, NON_FINITE)
