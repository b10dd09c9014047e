"""chunked_prefill: every step carries all running decodes plus prompt chunks filling the rest of
a per-step token budget (Sarathi-Serve's stall-free batching). Decodes never wait for a whole
prompt; a long prompt is spread over several steps."""

from pdjax.scheduler.policies.base import StepPlan, StepPolicy


class ChunkedPrefill(StepPolicy):
  decodes_follow_running = True   # nothing waiting: the decode rows follow the running batch

  def __init__(self, chunk_budget: int = 128, max_prefill_seqs: int = 17, **_):
    self.budget, self.max_seqs = chunk_budget, max_prefill_seqs

  def plan(self, worker, admit) -> StepPlan:
    decodes = list(worker.running)[:min(self.budget, self.max_seqs - 1)]
    left, chunks = self.budget - len(decodes), []
    for req in worker.waiting:
      if left <= 0 or len(chunks) + len(decodes) >= self.max_seqs:
        break
      if not worker.admitted(req):   # a new prompt needs its pages and a decode slot
        if (worker.keeps(req) and worker.num_running() >= worker.max_batch) or not admit(req):
          break
      start = req.num_computed_tokens
      end = min(req.prefill_len, start + left)
      chunks.append((req, start, end))
      left -= end - start
      if end < req.prefill_len:   # a partial chunk ends the step
        break
    return StepPlan(chunks=chunks, decodes=decodes)
