"""What a latency model's TTFT missed, learned from the requests it predicted: slo_headroom's
online correction (`scheduler.latency_feedback`). Pure Python.

A prediction from step costs leaves out what the run adds around its steps: the driver's loop
and the first token's trip to the host, and serving's slowdowns against an isolated
calibration (on a 2-core CPU a 128-token prompt measures 6-10 ms where the calibrated step is
4.3 ms). Each request's first token leaves a residual, measured - predicted TTFT; the next
prediction for the same path and prompt size class adds the median of the last `window`
residuals there (of the path's residuals of any size while that class has none; nothing
before the first). Additive, not a ratio: the missing part is mostly a fixed cost per step,
which a ratio would scale with the prompt. As llm-d's predicted-latency router retrains on
what its pods measured, only with a median instead of a model.

TPOT is not corrected: on the 2-core CPU a request's token interval swings 1-8 ms with what
the other instances prefill meanwhile (after its prediction), and a median of past residuals
made the TPOT error worse (42% -> 58% median in one run of the default config).

Size classes are powers of two of the tokens the prompt computes (1-128 tokens one class,
then 129-256, 257-512, ...), where a step's cost changes with its bucket.
"""

from __future__ import annotations

import statistics
from collections import deque


def size_class(tokens: int) -> int:
  """The power-of-two class of a prompt's computed tokens: 7 for 1-128, 8 for 129-256, ..."""
  return max(tokens - 1, 127).bit_length()


class LatencyFeedback:
  """TTFT residuals of (path, size class), the last `window` of each."""

  def __init__(self, window: int):
    if window < 1:
      raise ValueError(f"latency feedback window {window} < 1")
    self.window = window
    self._residuals: dict[tuple, deque] = {}

  def correction_s(self, path: str, size: int) -> float:
    """The median residual of (path, size), else of the path over every size, else 0."""
    for key in ((path, size), path):
      seen = self._residuals.get(key)
      if seen:
        return statistics.median(seen)
    return 0.0

  def learn(self, path: str, size: int, residual_s: float) -> None:
    for key in ((path, size), path):
      self._residuals.setdefault(key, deque(maxlen=self.window)).append(residual_s)
