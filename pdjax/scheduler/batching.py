"""Batch formation for prefill (under a token budget) and admission checks. Pure Python."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pdjax.request import Request


def take_prefill_batch(queue: deque[Request], *, token_budget: int, max_seqs: int,
                       admit: Callable[[Request], bool]) -> list[Request]:
  """Pops requests from the head of the queue, first come first served, while the packed
  prompt tokens stay within the budget and `admit` (e.g. "its pages can be allocated") holds.
  Stops at the first request that does not fit, so no request is overtaken."""
  batch, tokens = [], 0
  while queue and len(batch) < max_seqs:
    req = queue[0]
    if tokens + req.prompt_len > token_budget or not admit(req):
      break
    queue.popleft()
    batch.append(req)
    tokens += req.prompt_len
  return batch


def rejection_reason(req: Request, *, max_model_len: int, token_budget: int,
                     pool_pages: int, page_size: int) -> str | None:
  """Why a request can never be served on this cluster, or None if it can."""
  if req.prompt_len == 0:
    return "empty prompt"
  if req.sampling.max_new_tokens < 1:
    return f"max_new_tokens={req.sampling.max_new_tokens} must be >= 1"
  if req.max_len > max_model_len:
    return (f"prompt_len + max_new_tokens = {req.max_len} exceeds "
            f"max_model_len = {max_model_len}")
  if req.prompt_len > token_budget:
    return f"prompt_len = {req.prompt_len} exceeds the prefill token budget {token_budget}"
  if -(-req.max_len // page_size) > pool_pages:
    return f"needs {-(-req.max_len // page_size)} KV pages, the pool has {pool_pages}"
  return None
