"""Instances that share one host's compute slow each other down: processor sharing on the
virtual clock.

On this project's CPU machine all instances run on the same two cores: a decode step that
takes 4 ms alone takes ~6-9 ms while other instances run prefills, while a prefill barely
notices a concurrent decode. `python -m pdjax.calibrate` measures the table
slowdown[kind][n_p][n_d]: how much longer a step of `kind` takes while n_p other prefill-like
and n_d other decode steps are in flight (on accelerators with one instance per chip it comes
out ~1.0). Model: each in-flight step holds `work` seconds of isolated-step time and
progresses at 1 / slowdown(its kind, the others in flight) seconds of work per second. When a
step starts or ends, everyone's remaining work is advanced at the old rates and their end
times are recomputed at the new ones (events only: nothing is polled). Beyond the measured
counts the slowdown's excess over 1 grows in proportion to the number of others.
"""

from __future__ import annotations


def slowdown_at(table: list[list[float]], n_p: int, n_d: int) -> float:
  """table[n_p][n_d] for n_p + n_d <= len(table) - 1; scaled beyond."""
  limit = len(table) - 1
  total = n_p + n_d
  if total <= limit:
    return table[n_p][n_d]
  cp = round(n_p * limit / total)
  excess = table[cp][limit - cp] - 1.0
  return 1.0 + excess * total / limit


def _kind(kind: str) -> str:
  return "decode" if kind == "decode" else "prefill"   # mixed steps run the ragged program


class SharedHost:

  def __init__(self, clock, slowdown: dict[str, list[list[float]]]):
    self.clock, self.slowdown = clock, slowdown
    self._active: dict[object, list] = {}    # pending -> [remaining work s, kind]; in order
    self._t = clock.now()

  def _rates(self) -> list[float]:
    kinds = [state[1] for state in self._active.values()]
    n_p = sum(k == "prefill" for k in kinds)
    n_d = len(kinds) - n_p
    return [1.0 / slowdown_at(self.slowdown[k], n_p - (k == "prefill"), n_d - (k == "decode"))
            for k in kinds]

  def _advance(self) -> None:
    now = self.clock.now()
    dt = now - self._t
    if dt > 0:
      for state, rate in zip(self._active.values(), self._rates()):
        state[0] = max(state[0] - dt * rate, 0.0)
    self._t = max(self._t, now)

  def _reschedule(self) -> None:
    for (pending, state), rate in zip(self._active.items(), self._rates()):
      pending.end_s = self._t + state[0] / rate

  def start(self, pending, work_s: float, kind: str) -> None:
    self._advance()
    self._active[pending] = [work_s, _kind(kind)]
    self._reschedule()

  def finish(self, pending) -> None:
    self._advance()
    self._active.pop(pending, None)
    self._reschedule()
