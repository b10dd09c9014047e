"""Static admission checks: what can never be served on this cluster. Pure Python."""

from __future__ import annotations

from pdjax.request import Request


# The first words of every reason rejection_reason gives: a request refused with one can never
# be served on this cluster (the server answers 400, not a retryable 429).
PERMANENT_PREFIXES = ("empty prompt", "prompt token id ", "max_new_tokens=",
                      "prompt_len + max_new_tokens = ", "needs ")


def is_permanent(reason: str) -> bool:
  """Whether a rejection reason is one of rejection_reason's (never servable here)."""
  return reason.startswith(PERMANENT_PREFIXES)


def rejection_reason(req: Request, *, max_model_len: int, pool_pages: int, page_size: int,
                     vocab_size: int = 0) -> str | None:
  """Why a request can never be served on this cluster, or None if it can. (A prompt longer
  than the prefill token budget can: the step policies prefill it in pieces.)"""
  if req.prompt_len == 0:
    return "empty prompt"
  ids = req.prompt_ids
  if vocab_size and (min(ids) < 0 or max(ids) >= vocab_size):   # (in C; the culprit below)
    bad = next(t for t in ids if not 0 <= t < vocab_size)
    return f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})"
  if req.sampling.max_new_tokens < 1:
    return f"max_new_tokens={req.sampling.max_new_tokens} must be >= 1"
  if req.max_len > max_model_len:
    return (f"prompt_len + max_new_tokens = {req.max_len} exceeds "
            f"max_model_len = {max_model_len}")
  if -(-req.max_len // page_size) > pool_pages:
    return f"needs {-(-req.max_len // page_size)} KV pages, the pool has {pool_pages}"
  return None
