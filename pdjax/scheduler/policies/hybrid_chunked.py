"""The step policy of a hybrid run (mode=hybrid): every instance runs chunked prefill beside its
decodes (chunked_prefill, Sarathi-Serve's stall-free batching), each tier with its own chunk
budget: P-heavy instances (role prefill) large chunks that drain prompts fast, D-heavy ones
(role decode) small chunks that keep their decode steps short (TaiChi)."""

from pdjax.scheduler.policies.base import StepPlan, StepPolicy
from pdjax.scheduler.policies.chunked_prefill import ChunkedPrefill


class HybridChunked(StepPolicy):
  """Chunked prefill with a chunk budget per tier: {role: tokens per step}."""

  decodes_follow_running = True   # (chunked_prefill's: nothing waiting, decodes follow)

  def __init__(self, budgets: dict, max_prefill_seqs: int = 17):
    self.budgets = dict(budgets)
    self.by_role = {role: ChunkedPrefill(chunk_budget=n, max_prefill_seqs=max_prefill_seqs)
                    for role, n in budgets.items()}

  def plan(self, worker, admit) -> StepPlan:
    return self.by_role[worker.role].plan(worker, admit)
