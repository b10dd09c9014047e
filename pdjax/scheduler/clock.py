"""Clocks for the driver: wall time for the real engine; manual (virtual) time for the simulator
and fake-instance tests, which jumps to the next event instead of sleeping."""

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

  def advance_to(self, t: float) -> None:
    """Virtual time jumps forward to t (never backward)."""
    self.t = max(self.t, t)
