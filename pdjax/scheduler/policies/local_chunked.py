"""The step policy of a disaggregated run with scheduler.local_prefill=chunked: prefill-tier
instances run whole prompts (prefill_first: nothing decodes there to stall), every other
instance chunks a prompt a path policy kept there into its running decode batch
(chunked_prefill), as Dynamo's decode workers do with vLLM's chunked prefill. With the default
(whole) a local prompt runs whole on the decode instance and stalls its batch for the
prefill's length."""

from pdjax.scheduler.policies.base import StepPlan, StepPolicy


class LocalChunked(StepPolicy):
  decodes_follow_running = True   # (both of its policies: nothing waiting, decodes follow)

  def __init__(self, whole: StepPolicy, chunked: StepPolicy):
    self.whole, self.chunked = whole, chunked

  def plan(self, worker, admit) -> StepPlan:
    return (self.whole if worker.role == "prefill" else self.chunked).plan(worker, admit)
