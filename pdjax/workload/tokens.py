"""Synthesized prompt token ids: seeded, in [1, vocab_size), never an EOS id.

Presets and length-only traces need concrete prompt ids; they come from here so every source
follows the same rule. Mooncake-style prefix blocks are seeded by their hash id alone, so two
requests that name the same block get the same tokens for it (prefix sharing survives).
"""

from __future__ import annotations

import numpy as np

_BLOCK_STREAM = 1   # seed-sequence tag for prefix blocks (rows use other tags)


def allowed_token_ids(vocab_size: int, eos_ids: tuple[int, ...]) -> np.ndarray:
  """The ids a synthesized prompt may use: [1, vocab_size) minus eos_ids."""
  eos_ids = tuple(int(e) for e in eos_ids)
  allowed = np.setdiff1d(np.arange(1, max(vocab_size, 1)), np.asarray(eos_ids, int))
  if allowed.size == 0:
    raise ValueError(
        f"no prompt token ids left in [1, {vocab_size}) after excluding eos_ids {eos_ids}")
  return allowed


def random_prompt(rng: np.random.Generator, allowed: np.ndarray, length: int) -> list[int]:
  """length ids drawn uniformly from allowed."""
  return allowed[rng.integers(0, allowed.size, size=length)].tolist()   # Python ints


def block_tokens(hash_id: int, block_size: int, *, seed: int,
                 allowed: np.ndarray) -> list[int]:
  """The block_size tokens of prefix block hash_id (same seed and id, same tokens)."""
  rng = np.random.default_rng([int(seed), _BLOCK_STREAM, int(hash_id)])
  return random_prompt(rng, allowed, block_size)


def block_prompt(hash_ids: tuple[int, ...], length: int, block_size: int, *, seed: int,
                 allowed: np.ndarray, rng: np.random.Generator) -> list[int]:
  """length tokens: the named blocks in order, cut to length; past the last block, fresh
  tokens from rng (unshared)."""
  ids: list[int] = []
  for h in hash_ids:
    if len(ids) >= length:
      break
    ids.extend(block_tokens(h, block_size, seed=seed, allowed=allowed))
  ids = ids[:length]
  return ids + random_prompt(rng, allowed, length - len(ids))
