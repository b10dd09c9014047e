"""Seeded fault decisions (pure Python). Each decision draws from its own stream keyed by
(seed, request id, what, attempt), so it does not depend on the order events happen in: the
same request meets the same faults in every mode and on both backends."""

from __future__ import annotations

import collections
import random

from pdjax.faults.spec import FaultSpec


class FaultInjector:

  def __init__(self, spec: FaultSpec):
    self.spec = spec
    self.injected: collections.Counter[str] = collections.Counter()

  def _rng(self, *key) -> random.Random:
    return random.Random(":".join(str(k) for k in (self.spec.seed, *key)))

  def cancel_plan(self, req) -> tuple[str, int] | None:
    """(stage, k) if the client will abort this request: at `stage`; for "decode", after its
    k-th generated token."""
    if not self.spec.cancel_prob:
      return None
    rng = self._rng(req.id, "cancel")
    if rng.random() >= self.spec.cancel_prob:
      return None
    stage = rng.choice(self.spec.cancel_stages)
    k = rng.randint(1, max(1, req.sampling.max_new_tokens - 1))
    return stage, k

  def transfer_attempt(self, req, attempt: int) -> tuple[bool, float]:
    """(fails, extra delay in seconds) for this transfer attempt of req."""
    rng = self._rng(req.id, "transfer", attempt)
    fails = rng.random() < self.spec.transfer_fail_prob
    delay = 0.0
    d = self.spec.transfer_delay
    if d:
      kind = d[0]
      delay = (d[1] if kind == "const" else rng.expovariate(1.0 / d[1]) if kind == "exp" and d[1]
               else rng.uniform(d[1], d[2]) if kind == "uniform" else 0.0)
    if fails:
      self.injected["transfer_fail"] += 1
    if delay > 0:
      self.injected["transfer_delay"] += 1
    return fails, delay

  def tamper_attempt(self, req, attempt: int) -> bool:
    """Whether this transfer attempt of req, sealed between nodes, has a piece tampered."""
    if not self.spec.tamper_prob:
      return False
    tampered = self._rng(req.id, "tamper", attempt).random() < self.spec.tamper_prob
    if tampered:
      self.injected["tamper"] += 1
    return tampered

  def slow_factor(self, instance: str, now: float) -> float:
    factor = 1.0
    for name, k, t in self.spec.slow_instances:
      if name == instance and now >= t:
        factor = max(factor, k)
    return factor
