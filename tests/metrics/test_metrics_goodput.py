"""Tests for pdjax.metrics.goodput: per-chip goodput and the rate search's next rate."""

import pytest

from pdjax.metrics.goodput import next_rate_to_try, per_chip_goodput

POINTS = [(8, 0.3), (1, 1.0), (4, 0.85), (2, 0.95)]


def test_per_chip_goodput():
  g = per_chip_goodput(POINTS, 0.9, 8)
  assert g == {"rate": 2.0, "per_chip": 0.25, "target": 0.9, "chips": 8,
               "points": [(1.0, 1.0), (2.0, 0.95), (4.0, 0.85), (8.0, 0.3)]}
  assert per_chip_goodput(POINTS, 0.85, 2)["rate"] == 4.0   # >= target passes
  none = per_chip_goodput(POINTS, 1.01, 4)
  assert none["rate"] is None and none["per_chip"] is None
  assert per_chip_goodput([], 0.9, 1)["points"] == []
  with pytest.raises(ValueError):
    per_chip_goodput(POINTS, 0.9, 0)


def test_next_rate_bisection_steps():
  assert next_rate_to_try([], 0.9, 1, 8, 0.1) == 1.0              # lo first
  assert next_rate_to_try([(1, 1.0)], 0.9, 1, 8, 0.1) == 8.0      # then hi
  assert next_rate_to_try([(1, 1.0), (8, 0.3)], 0.9, 1, 8, 0.1) == 4.5
  pts = list(POINTS)
  assert next_rate_to_try(pts, 0.9, 1, 8, 0.1) == 3.0             # between 2 and 4
  pts.append((3, 0.9))
  assert next_rate_to_try(pts, 0.9, 1, 8, 0.1) == 3.5
  pts.append((3.5, 0.92))
  assert next_rate_to_try(pts, 0.9, 1, 8, 0.1) == 3.75
  pts.append((3.75, 0.88))                                        # 0.25 <= 0.1 * 3.75
  assert next_rate_to_try(pts, 0.9, 1, 8, 0.1) is None
  assert per_chip_goodput(pts, 0.9, 8)["rate"] == 3.5


def test_next_rate_stops():
  assert next_rate_to_try([(1, 0.5)], 0.9, 1, 8, 0.1) is None     # lo fails
  assert next_rate_to_try([(1, 1.0), (8, 0.95)], 0.9, 1, 8, 0.1) is None  # hi passes
  # Points outside [lo, hi] are ignored.
  assert next_rate_to_try([(0.5, 1.0), (16, 0.0)], 0.9, 1, 8, 0.1) == 1.0
  with pytest.raises(ValueError):
    next_rate_to_try([], 0.9, 8, 8, 0.1)
  with pytest.raises(ValueError):
    next_rate_to_try([], 0.9, 1, 8, 0.0)


def test_search_loop_converges():
  def attainment(rate):
    return 1.0 if rate <= 3.3 else 0.5

  points = []
  rate = next_rate_to_try(points, 0.9, 0.5, 16, 0.02)
  for _ in range(50):
    if rate is None:
      break
    points.append((rate, attainment(rate)))
    rate = next_rate_to_try(points, 0.9, 0.5, 16, 0.02)
  assert rate is None and len(points) < 15
  best = per_chip_goodput(points, 0.9, 4)["rate"]
  assert 3.3 * (1 - 0.02) <= best <= 3.3
