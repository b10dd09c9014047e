"""A run's tiers over time in a few hundred bins: per role and bin, the per-instance mean and
max of the sampled state (queued, running, KV pages used and cached, % of the pool) and the
tier's busy fraction; what the tier timeline plot draws for a long run.

steps and samples as in pdjax.metrics.timeline. The run spans 0 (or the first sample or step,
if earlier) to its last sample or step end; bins are a round width (columns.round_width) at
least that span over `bins`. Sampled state is a step function per instance, each sample
holding until the instance's next one (the last until the run's end), in the role the sample
names. mean: time-weighted over the bin and over the instances in that role during it (NaN
where none was). max: the largest value held in the bin by an instance in that role (samples
taken in it, and the value held from before it). busy: the tier's step time in the bin over
the bin's length (the last one ends with the run) times the tier's members (instances that
ran a step or were sampled in that role, as in timeline.tier_stats).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdjax.metrics import columns

BINS = 600
QUANTITIES = ("queued", "running", "kv_used_pct", "kv_cached_pct")


def _state(samples: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(times, values: rows of QUANTITIES) of samples."""
  t, queued, running, used, cached, total = columns.numbers(
      samples, ("t", "queued", "running", "kv_pages_used", "kv_pages_cached",
                "kv_pages_total"), {"kv_pages_cached": 0.0})
  pool = np.maximum(total, 1.0)
  return t, np.stack([queued, running, 100 * used / pool, 100 * cached / pool], axis=1)


def _busy_until(start: np.ndarray, end: np.ndarray, x: np.ndarray) -> np.ndarray:
  """Step time before each x: sum of clip(x - start, 0, end - start) over the steps (for
  start <= end: the sum of x - start over starts before x, less x - end over ends before x)."""
  out = np.zeros(len(x))
  for times, sign in ((np.sort(start), 1.0), (np.sort(end), -1.0)):
    before = np.searchsorted(times, x, side="left")
    total = np.r_[0.0, np.cumsum(times)]
    out += sign * (x * before - total[before])
  return out


def tier_bins(steps: Sequence[dict], samples: Sequence[dict], bins: int = BINS) -> dict:
  """{"edges": bin edges (bins + 1 at most), "width", "end" (the run's end), "roles": {role:
  {"members", "busy": array, "instances": array (the mean number of instances sampled in the
  role), quantity: {"mean": array, "max": array}}}} (see the module docstring); {} when there
  are no steps and no samples."""
  st_inst, st_inst_names = columns.codes(steps, "instance")
  st_role, st_role_names = columns.codes(steps, "role")
  sm_inst, sm_inst_names = columns.codes(samples, "instance")
  sm_role, sm_role_names = columns.codes(samples, "role")
  start, end = columns.numbers(steps, ("start_s", "end_s"))
  t, values = _state(samples)
  if not len(start) and not len(t):
    return {}
  lo = min([0.0] + [float(a.min()) for a in (start, t) if len(a)])
  run_end = max(float(a.max()) for a in (end, t) if len(a))
  width = columns.round_width((run_end - lo) / bins)
  count = max(1, int(np.ceil((run_end - lo) / width - 1e-9)))
  edges = lo + width * np.arange(count + 1)
  x = np.minimum(edges, run_end)
  lengths = np.diff(x)   # the width, but the last bin ends with the run
  quantities = len(QUANTITIES)
  integrals = {role: np.zeros((count, quantities + 1)) for role in sm_role_names}
  peaks = {role: np.full((count, quantities), -np.inf) for role in sm_role_names}
  for i in range(len(sm_inst_names)):
    mine = np.flatnonzero(sm_inst == i)
    mine = mine[np.argsort(t[mine], kind="stable")]
    _add_instance(integrals, peaks, t[mine], values[mine], sm_role[mine], sm_role_names, x,
                  run_end)
  out = {}
  for role in sorted(set(st_role_names) | set(sm_role_names)):
    in_steps = st_role == (st_role_names.index(role) if role in st_role_names else -1)
    in_samples = sm_role == (sm_role_names.index(role) if role in sm_role_names else -1)
    members = len({st_inst_names[i] for i in np.unique(st_inst[in_steps]).tolist()} |
                  {sm_inst_names[i] for i in np.unique(sm_inst[in_samples]).tolist()})
    busy = np.diff(_busy_until(start[in_steps], end[in_steps], x)) / (lengths * members)
    num = integrals.get(role, np.zeros((count, quantities + 1)))
    peak = peaks.get(role, np.full((count, quantities), -np.inf))
    bin_of = np.clip(((t[in_samples] - lo) // width).astype(np.int64), 0, count - 1)
    np.maximum.at(peak, bin_of, values[in_samples])
    held = num[:, -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
      mean = np.where(held > 0, num[:, :-1] / held, np.nan)
    peak[np.isinf(peak)] = np.nan
    out[role] = {"members": members, "busy": busy, "instances": num[:, -1] / lengths,
                 **{name: {"mean": mean[:, q], "max": peak[:, q]}
                    for q, name in enumerate(QUANTITIES)}}
  return {"edges": edges, "width": width, "end": run_end, "roles": out}


def _add_instance(integrals: dict, peaks: dict, t: np.ndarray, values: np.ndarray,
                  role: np.ndarray, role_names: list[str], x: np.ndarray,
                  run_end: float) -> None:
  """Adds one instance's time-sorted samples to each role's integral over each bin (bins
  ending at x, clipped to the run's end) of each quantity and of 1, and to its maxima: the
  value held at each bin's start."""
  hold = np.diff(np.r_[t, max(run_end, t[-1])])
  last = np.searchsorted(t, x, side="right") - 1     # the sample holding at each edge
  valid = last >= 0
  at = np.maximum(last, 0)
  with_one = np.c_[values, np.ones(len(t))]
  for code in np.unique(role).tolist():
    name = role_names[code]
    mask = (role == code)[:, None]
    cum = np.r_[np.zeros((1, with_one.shape[1])),
                np.cumsum(with_one * hold[:, None] * mask, axis=0)]
    part = (with_one * mask)[at] * (x - t[at])[:, None]
    integrals[name] += np.diff(np.where(valid[:, None], cum[at] + part, 0.0), axis=0)
    from_before = valid[:-1] & (role[at[:-1]] == code) & (x[:-1] < run_end)
    peaks[name] = np.maximum(peaks[name], np.where(from_before[:, None], values[at[:-1]],
                                                   -np.inf))
