"""A study's own policies, in its own folder: pdjax is not edited. Each reads only the policy
API (pdjax/scheduler/policy_api.py) and runs unchanged on the simulator, the engine, Ray and
the server. docs/policies.md walks through them."""

from pdjax.scheduler.policies.base import PathChoice


class ShortestWait:
  """Router: the instance whose queued prompt tokens drain first at its measured rate."""

  def __init__(self, seed=0):
    self.turn = seed                       # rotates ties, so idle instances share the load

  def choose(self, req, candidates):
    if not candidates:
      return None
    def wait(w):                           # seconds of prefill queued ahead (tokens if unmeasured)
      rate = w.prefill_drain_tok_s or w.prefill_tok_s
      return (w.queued_tokens() / rate if rate else w.queued_tokens(), w.num_running())
    best = min(wait(w) for w in candidates)
    tied = [w for w in candidates if wait(w) == best]
    self.turn += 1
    return tied[self.turn % len(tied)]


class ShortPromptsStayLocal:
  """Path: a prompt with fewer than `local_below` uncached tokens prefills on its decode
  instance (no KV transfer) while that instance has a free slot; the rest go disaggregated."""

  uses_picks = True                        # decide for the instances the routers picked

  def __init__(self, local_below=64):
    self.local_below = local_below

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    _, decode_pick = picks or (None, None)
    if decode_pick is not None and decode_pick.num_running() < decode_pick.max_batch:
      uncached = req.prefill_len - decode_pick.prefix_cached_tokens(req)
      if uncached < self.local_below:
        return PathChoice("colocated", "decode", {"policy": "short_prompts_stay_local",
                                                  "choice": "colocated", "uncached": uncached})
    return PathChoice("disaggregated", "prefill")


class FreeSlots:
  """Scorer: decode slots left on the instance (higher is better)."""

  def score(self, req, worker):
    return worker.max_batch - worker.num_running()
