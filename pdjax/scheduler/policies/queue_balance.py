"""queue_balance: adapt the P:D ratio to the load. Every `interval_s`, if prefilled requests are
backing up for decode room while some prefill instance has nothing queued, drain one prefill
instance into the decode tier; if prompts are queueing (more than `queued_tokens` per prefill
instance) while the transfer backlog is empty and a decode instance is idle, drain one decode
instance into the prefill tier. Each tier keeps at least one instance."""

from pdjax.scheduler.policies.base import RoleSwitchPolicy


class QueueBalance(RoleSwitchPolicy):

  def __init__(self, interval_s: float = 1.0, queued_tokens: int = 1024, **_):
    self.interval_s, self.queued_tokens = interval_s, queued_tokens
    self._last = float("-inf")

  def decide(self, now, prefill_tier, decode_tier, transfer_backlog):
    if now - self._last < self.interval_s:
      return []
    self._last = now
    if transfer_backlog > 0 and len(prefill_tier) > 1:
      idle = [w for w in prefill_tier if w.num_waiting() == 0]
      if idle:
        return [(idle[0], "decode")]
    queued = sum(w.queued_tokens() for w in prefill_tier) / max(len(prefill_tier), 1)
    if transfer_backlog == 0 and queued > self.queued_tokens and len(decode_tier) > 1:
      idle = [w for w in decode_tier if w.num_running() == 0]
      if idle:
        return [(idle[0], "prefill")]
    return []
