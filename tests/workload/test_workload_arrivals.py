"""Tests for pdjax.workload.arrivals: determinism, order, rates, on/off windows, ramps, errors."""

import numpy as np
import pytest

from pdjax.workload import arrivals

PARAMS = dict(rate=8.0, burstiness=0.5, on_s=2.0, off_s=3.0, ramp_to_rate=24.0)


@pytest.mark.parametrize("process", arrivals.ARRIVALS)
def test_deterministic_sorted_strictly_increasing(process):
  a = arrivals.arrival_times(process, 500, rng=0, **PARAMS)
  assert a == arrivals.arrival_times(process, 500, rng=np.random.default_rng(0), **PARAMS)
  assert a != arrivals.arrival_times(process, 500, rng=1, **PARAMS)
  assert len(a) == 500 and a[0] > 0.0
  assert all(type(t) is float for t in a)
  assert all(b > x for x, b in zip(a, a[1:]))
  assert arrivals.arrival_times(process, 0, rng=0, **PARAMS) == []


@pytest.mark.parametrize("process, extra", [("poisson", {}), ("gamma", dict(burstiness=0.5)),
                                            ("gamma", dict(burstiness=3.0))])
def test_mean_rate_within_ten_percent(process, extra):
  a = arrivals.arrival_times(process, 2000, rate=8.0, rng=0, **extra)
  assert abs(len(a) / a[-1] - 8.0) < 0.8


def test_low_burstiness_is_burstier():
  def cv(burstiness):
    gaps = np.diff(arrivals.gamma(2000, rate=8.0, burstiness=burstiness, rng=0), prepend=0.0)
    return gaps.std() / gaps.mean()
  assert cv(0.25) > 1.5 > cv(1.0) > 0.8 > cv(4.0)


def test_poisson_matches_gamma_with_burstiness_one_in_distribution():
  gaps = np.diff(arrivals.gamma(2000, rate=4.0, burstiness=1.0, rng=3), prepend=0.0)
  assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1


def test_onoff_never_arrives_in_off_windows():
  a = np.array(arrivals.onoff(2000, rate=20.0, on_s=1.5, off_s=2.5, rng=0))
  phase = a % 4.0
  assert np.all(phase <= 1.5 + 1e-9)
  assert a[-1] > 40.0   # Many cycles covered.
  on_time = (a // 4.0) * 1.5 + phase
  assert abs(len(a) / on_time[-1] - 20.0) < 2.0   # Poisson at rate while on.


def test_onoff_with_no_off_time_is_poisson():
  assert (arrivals.onoff(100, rate=5.0, on_s=1.0, off_s=0.0, rng=2)
          == pytest.approx(arrivals.poisson(100, rate=5.0, rng=2)))


def test_ramp_second_half_is_denser():
  a = arrivals.ramp(2000, rate=4.0, ramp_to_rate=40.0, rng=0)
  first, second = a[999] - 0.0, a[-1] - a[999]
  assert second < first / 2
  down = arrivals.ramp(2000, rate=40.0, ramp_to_rate=4.0, rng=0)
  assert down[-1] - down[999] > 2 * down[999]


def test_ramp_with_equal_rates_is_poisson():
  assert arrivals.ramp(50, rate=3.0, ramp_to_rate=3.0, rng=5) == pytest.approx(
      arrivals.poisson(50, rate=3.0, rng=5))


@pytest.mark.parametrize("call, message", [
    (lambda: arrivals.poisson(-1, rate=1.0, rng=0), "n must be >= 0, got -1"),
    (lambda: arrivals.poisson(3, rate=0.0, rng=0), "rate must be > 0 requests/s, got 0.0"),
    (lambda: arrivals.poisson(3, rate=float("nan"), rng=0),
     "rate must be > 0 requests/s, got nan"),
    (lambda: arrivals.poisson(3, rate=float("inf"), rng=0), "rate must be finite, got inf"),
    (lambda: arrivals.gamma(3, rate=1.0, burstiness=0.0, rng=0),
     "burstiness must be > 0, got 0.0"),
    (lambda: arrivals.onoff(3, rate=1.0, on_s=0.0, off_s=1.0, rng=0),
     "on_s must be > 0 seconds, got 0.0"),
    (lambda: arrivals.onoff(3, rate=1.0, on_s=1.0, off_s=-1.0, rng=0),
     "off_s must be >= 0 seconds, got -1.0"),
    (lambda: arrivals.ramp(3, rate=1.0, ramp_to_rate=-2.0, rng=0),
     "ramp_to_rate must be > 0 requests/s, got -2.0"),
    (lambda: arrivals.arrival_times("weibull", 3, rate=1.0, rng=0),
     "unknown arrival process 'weibull' (known: poisson, gamma, onoff, ramp)"),
])
def test_errors(call, message):
  with pytest.raises(ValueError) as e:
    call()
  assert str(e.value) == message
