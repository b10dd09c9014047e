"""prefill_first: whole prompts first, decode when no prompt can start (classic continuous
batching, vLLM's default without chunking). A prefill step stalls the running decode batch:
the TPOT interference that disaggregation and chunked prefill exist to remove.

A sequence longer than the whole token budget (a long prompt, or a preempted request
recomputing its prompt and generated tokens) is prefilled alone, in budget-sized pieces over
consecutive steps; otherwise it could never run and its instance would stall forever."""

from pdjax.scheduler.policies.base import StepPlan, StepPolicy


class PrefillFirst(StepPolicy):
  decodes_follow_running = True   # nothing waiting: the decode rows follow the running batch

  def __init__(self, token_budget: int = 512, max_prefill_seqs: int = 4, **_):
    self.token_budget, self.max_seqs = token_budget, max_prefill_seqs

  def plan(self, worker, admit) -> StepPlan:
    chunks, tokens = [], 0
    for req in worker.waiting:    # first come first served: stop at the first that can't go
      if len(chunks) == self.max_seqs:
        break
      if not worker.admitted(req):   # not admitted yet: needs its pages and a decode slot
        if (worker.keeps(req) and worker.num_running() >= worker.max_batch) or not admit(req):
          break
      start, end = req.num_computed_tokens, req.prefill_len   # after admit: cached prefix
      if end - start > self.token_budget - tokens:
        if not chunks and end - start > self.token_budget:
          chunks.append((req, start, start + self.token_budget))   # a piece, alone
        break
      chunks.append((req, start, end))
      tokens += end - start
    if chunks:
      return StepPlan(chunks=chunks)
    return StepPlan(decodes=list(worker.running))
