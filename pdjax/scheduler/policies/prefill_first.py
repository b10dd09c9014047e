"""prefill_first: whole prompts first, decode when no prompt can start (classic continuous
batching, vLLM's default without chunking). A prefill step stalls the running decode batch:
the TPOT interference that disaggregation and chunked prefill exist to remove."""

from pdjax.scheduler.policies.base import StepPlan, StepPolicy


class PrefillFirst(StepPolicy):

  def __init__(self, token_budget: int = 512, max_prefill_seqs: int = 4, **_):
    self.token_budget, self.max_seqs = token_budget, max_prefill_seqs
    self.max_prompt_tokens = token_budget   # a whole prompt must fit one step

  def plan(self, worker, admit) -> StepPlan:
    chunks, tokens, staying = [], 0, 0
    for req in worker.waiting:    # first come first served: stop at the first that can't go
      if len(chunks) == self.max_seqs:
        break
      stays = worker.keeps(req)
      if (stays and worker.num_running() + staying >= worker.max_batch) or not admit(req):
        break
      start, end = req.num_computed_tokens, req.prefill_len   # after admit: cached prefix
      if tokens + end - start > self.token_budget:
        break
      chunks.append((req, start, end))
      tokens += end - start
      staying += stays
    if chunks:
      return StepPlan(chunks=chunks)
    return StepPlan(decodes=list(worker.running))
