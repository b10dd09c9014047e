"""Seeded arrival processes: when requests arrive, separate from what they ask.

Each function returns n arrival times in seconds, sorted and strictly increasing from the first
gap (the first arrival is > 0). Same seed (or the same Generator state), same times.
  poisson  exponential gaps with mean 1/rate.
  gamma    gamma gaps, shape = burstiness, scale = 1/(rate * burstiness): mean 1/rate as
           poisson; burstiness 1 is Poisson, < 1 burstier, > 1 more regular (as
           `vllm bench serve --burstiness`).
  onoff    Poisson at rate inside on_s windows, nothing inside off_s windows, alternating,
           starting with an on window at 0.
  ramp     gap i drawn at the instantaneous rate, which rises (or falls) linearly over the
           arrivals from rate (first gap) to ramp_to_rate (last gap).
"""

from __future__ import annotations

import math

import numpy as np

ARRIVALS = ("poisson", "gamma", "onoff", "ramp")
Seed = int | np.random.Generator


def _check_n(n: int) -> None:
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")


def _positive(name: str, value: float, unit: str = "") -> None:
  if not value > 0:
    raise ValueError(f"{name} must be > 0{unit}, got {value}")
  if not math.isfinite(value):
    raise ValueError(f"{name} must be finite, got {value}")


def _strict(times: np.ndarray) -> list[float]:
  """times as floats, nudged so no two (nor the first and 0) are equal."""
  times = np.array(times, dtype=float)
  prev = 0.0
  for i in range(times.size):  # Guard against zero gaps lost to rounding.
    if times[i] <= prev:
      times[i] = np.nextafter(prev, np.inf)
    prev = times[i]
  return [float(t) for t in times]


def poisson(n: int, *, rate: float, rng: Seed) -> list[float]:
  _check_n(n)
  _positive("rate", rate, " requests/s")
  rng = np.random.default_rng(rng)
  return _strict(np.cumsum(rng.exponential(1.0 / rate, size=n)))


def gamma(n: int, *, rate: float, burstiness: float, rng: Seed) -> list[float]:
  _check_n(n)
  _positive("rate", rate, " requests/s")
  _positive("burstiness", burstiness)
  rng = np.random.default_rng(rng)
  return _strict(np.cumsum(rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)))


def onoff(n: int, *, rate: float, on_s: float, off_s: float, rng: Seed) -> list[float]:
  _check_n(n)
  _positive("rate", rate, " requests/s")
  _positive("on_s", on_s, " seconds")
  if not (off_s >= 0 and math.isfinite(off_s)):
    raise ValueError(f"off_s must be >= 0 seconds, got {off_s}")
  rng = np.random.default_rng(rng)
  on_time = np.cumsum(rng.exponential(1.0 / rate, size=n))  # Time spent in on windows.
  windows = np.floor(on_time / on_s)
  return _strict(on_time + windows * off_s)


def ramp(n: int, *, rate: float, ramp_to_rate: float, rng: Seed) -> list[float]:
  _check_n(n)
  _positive("rate", rate, " requests/s")
  _positive("ramp_to_rate", ramp_to_rate, " requests/s")
  rng = np.random.default_rng(rng)
  rates = np.linspace(rate, ramp_to_rate, num=n)
  return _strict(np.cumsum(rng.exponential(1.0, size=n) / rates))


def arrival_times(process: str, n: int, *, rate: float, rng: Seed, burstiness: float = 1.0,
                  on_s: float = 2.0, off_s: float = 2.0,
                  ramp_to_rate: float = 16.0) -> list[float]:
  """Dispatches on the process name; the parameters a process does not use are ignored."""
  if process == "poisson":
    return poisson(n, rate=rate, rng=rng)
  if process == "gamma":
    return gamma(n, rate=rate, burstiness=burstiness, rng=rng)
  if process == "onoff":
    return onoff(n, rate=rate, on_s=on_s, off_s=off_s, rng=rng)
  if process == "ramp":
    return ramp(n, rate=rate, ramp_to_rate=ramp_to_rate, rng=rng)
  raise ValueError(f"unknown arrival process {process!r} (known: {', '.join(ARRIVALS)})")
