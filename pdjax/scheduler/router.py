"""Routing: which instance of a tier takes a request. Pure Python.

`least_loaded` is the default policy: the instance with the smallest load, ties broken by the
order the instances were given (so runs are deterministic). Policies come in a later issue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def least_loaded(candidates: Sequence[T], load: Callable[[T], float],
                 eligible: Callable[[T], bool] = lambda _: True) -> T | None:
  """The eligible candidate with the lowest load (first on ties), or None if none is eligible."""
  best, best_load = None, None
  for c in candidates:
    if not eligible(c):
      continue
    value = load(c)
    if best is None or value < best_load:
      best, best_load = c, value
  return best
