"""Clocks for the driver: wall time for the real engine, manual time for fake-instance tests."""

from __future__ import annotations

import time


class WallClock:
  """Seconds since construction (perf_counter)."""

  def __init__(self):
    self._t0 = time.perf_counter()

  def now(self) -> float:
    return time.perf_counter() - self._t0

  def sleep_until(self, t: float) -> None:
    delay = t - self.now()
    if delay > 0:
      time.sleep(delay)


class ManualClock:
  """Time moves only when told to: `advance(dt)`, or `sleep_until` jumping forward."""

  def __init__(self, start: float = 0.0):
    self.t = start

  def now(self) -> float:
    return self.t

  def advance(self, dt: float) -> None:
    self.t += dt

  def sleep_until(self, t: float) -> None:
    self.t = max(self.t, t)
