"""A re-mesh policy for the engine and Ray re-mesh tests: merges the decode tier (2 x TP1) into
one TP2 instance once `running` sequences decode on it, then splits it back once a request has
finished on the merged instance, so each switch moves live KV whatever the machine's speed."""

from pdjax.scheduler.policies.base import RoleSwitchPolicy
from pdjax.scheduler.policies.remesh import RemeshPlan


class WhenDecoding(RoleSwitchPolicy):

  def __init__(self, running: int = 4):
    self.running, self.stage = running, 0

  def remesh(self, now, prefill_tier, decode_tier, transfer_backlog):
    busy = sum(len(w.running) for w in decode_tier)
    if self.stage == 0 and len(decode_tier) == 2 and busy >= self.running:
      self.stage = 1
      return RemeshPlan("decode", 1, 2, f"{busy} decoding")
    if self.stage == 1 and len(decode_tier) == 1 and busy >= 2 and decode_tier[0].token_interval_s:
      self.stage = 2
      return RemeshPlan("decode", 2, 1, "a request finished on the merged instance")
    return None
