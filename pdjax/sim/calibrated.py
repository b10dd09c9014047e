"""Calibrated step-time model, fitted to step times measured on the real engine
(`python -m pdjax.calibrate`), per TP degree. The engine's programs have static shapes, so a
step costs what its bucket costs, plus a term that grows with the attended context:

  prefill / mixed step   base_p(T) + c_p * A   T = packed tokens padded to the prefill bucket,
  (fitted per program:                         A = sum_i q_i * (c_i + (q_i + 1) / 2), the causal
                                                   attention pairs (q_i new tokens after c_i
                                                   cached ones; ~ len^2 / 2 per prompt)
   the plain one, and a chunked run's ragged one with a row per decode: `prefill_ragged`)
  decode step            base_d(B) + c_d * N   B = batch padded to the decode bucket,
                                               N = sum of context lengths
  KV transfer            base_t(X)             X = bytes moved, padded to the transfer bucket
  host time per step     h_k + g_k * R         R = rows in the step (sequences), k = prefill
                                                   (prefill and mixed steps) or decode

base(.) is the fitted per-bucket time, interpolated linearly between calibrated buckets and
extrapolated from the last two (so a run whose buckets differ from the calibration's still gets
a number). With two buckets this is DistServe's a + b * tokens + c * sum(len^2) estimator. Fits
are non-negative least squares over one-hot bucket columns and the context column. A profile
is a JSON file; `check_profile` makes sure it describes the run.

Host time (`host_s` in the profile): what the driver's CPU adds to each step that the isolated
step times (dispatch to result, `pdjax.calibrate`) do not hold: collecting the previous step's
tokens, the step policy's plan and page bookkeeping, the loop's turn. `pdjax.calibrate` serves a
small workload on the real instances and takes it from the step records' host phases (see
`host_samples`); the cost adds it to each prefill and decode step's seconds, scaled by the share
of steps that did wait for the host (with overlap, a step dispatched ahead waits for none).
It is part of the simulated step (and so slowed by a shared host, like the Python it stands
for): the simulated step records' own host fields stay 0, as the virtual clock does not move
while the driver plans. A profile made before host time was measured is refused (`load_profile`).

Layer-group streaming (`stream_group_s`, kv.stream_layers): the extra seconds per layer group of
a streamed prefill step, measured by `pdjax.calibrate` (engine/stream_timing.py); a profile
without it charges none, as the roofline's ideal engine does.
"""

from __future__ import annotations

import bisect
import dataclasses
import json

import numpy as np

FORMAT = "pdjax.sim.profile/3"
OLD_FORMATS = ("pdjax.sim.profile/2",)   # no host time: refused with a re-calibrate hint


class ProfileError(ValueError):
  """A profile that cannot serve this run; str() is one line."""


@dataclasses.dataclass(frozen=True)
class StepFit:
  """seconds = base(size) + per_unit_s * units, base interpolated over the fitted sizes."""
  sizes: tuple[float, ...]
  base_s: tuple[float, ...]
  per_unit_s: float = 0.0

  def base(self, size: float) -> float:
    xs, ys = self.sizes, self.base_s
    if len(xs) == 1:
      return ys[0]
    i = min(max(bisect.bisect_left(xs, size), 1), len(xs) - 1)   # segment [i-1, i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (size - x0) / (x1 - x0), 0.0)

  def __call__(self, size: float, units: float = 0.0) -> float:
    return self.base(size) + self.per_unit_s * units

  def to_json(self) -> dict:
    return {"sizes": list(self.sizes), "base_s": list(self.base_s), "per_unit_s": self.per_unit_s}

  @classmethod
  def from_json(cls, d: dict) -> "StepFit":
    return cls(tuple(d["sizes"]), tuple(d["base_s"]), d.get("per_unit_s", 0.0))


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Least squares with every coefficient >= 0: a column whose coefficient comes out negative
  is dropped (pinned to 0) and the rest refitted."""
  free, coef = list(range(x.shape[1])), np.zeros(x.shape[1])
  while free:
    sol, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
    if (sol >= 0).all():
      coef[free] = sol
      break
    free.pop(int(np.argmin(sol)))
  return coef


def fit_step(points: list[tuple[float, float, float]]) -> tuple[StepFit, float]:
  """points: (size, units, seconds). Returns the fit and its mean relative error."""
  sizes = sorted({p[0] for p in points})
  x = np.zeros((len(points), len(sizes) + 1))
  for row, (size, units, _) in enumerate(points):
    x[row, sizes.index(size)] = 1.0
    x[row, -1] = units
  y = np.array([p[2] for p in points], dtype=np.float64)
  coef = _nonneg_lstsq(x, y)
  fit = StepFit(tuple(float(s) for s in sizes), tuple(float(c) for c in coef[:-1]),
                float(coef[-1]))
  predicted = np.array([fit(size, units) for size, units, _ in points])
  return fit, float(np.mean(np.abs(predicted - y) / y))


@dataclasses.dataclass(frozen=True)
class HostFit:
  """Host seconds per step: (base_s + per_seq_s * rows) * waited_share."""
  base_s: float = 0.0
  per_seq_s: float = 0.0
  waited_share: float = 1.0   # steps that waited for the host / (those + steps dispatched ahead)

  def __call__(self, rows: int) -> float:
    return (self.base_s + self.per_seq_s * rows) * self.waited_share

  @classmethod
  def from_json(cls, d: dict) -> "HostFit":
    return cls(d["base_s"], d["per_seq_s"], d.get("waited_share", 1.0))


def _host_kind(kind: str) -> str:
  return "decode" if kind == "decode" else "prefill"   # mixed steps run the ragged program


def host_samples(steps) -> dict[str, list[tuple[int, float]]]:
  """From a real run's step records (`pdjax.scheduler.collect`, in collection order): per kind
  ("prefill": prefill and mixed steps; "decode") the (rows, seconds) of host time of every step
  its instance waited for: its `host_wait_s` (from the previous step's completion to this
  one's launch) less the previous step's `readback_s` and its own `dispatch_s`, which an
  isolated step time already holds. Steps after an idle spell (no wait) and steps dispatched
  ahead are left out; "<kind>_ahead" counts the latter. "<kind>_wait": the whole
  `host_wait_s` of the same steps (what the device waited, dispatch and readback included)."""
  out = {"prefill": [], "decode": [], "prefill_ahead": 0, "decode_ahead": 0,
         "prefill_wait": [], "decode_wait": []}
  previous: dict[str, dict] = {}
  for s in steps:
    before, previous[s["instance"]] = previous.get(s["instance"]), s
    kind = _host_kind(s["kind"])
    if s.get("ahead"):
      out[f"{kind}_ahead"] += 1
      continue
    if before is None or s.get("host_wait_s", 0.0) <= 0.0:
      continue
    extra = s["host_wait_s"] - before.get("readback_s", 0.0) - s.get("dispatch_s", 0.0)
    out[kind].append((int(s["num_seqs"]), max(extra, 0.0)))
    out[f"{kind}_wait"].append((int(s["num_seqs"]), s["host_wait_s"]))
  return out


def fit_host(samples: list[tuple[int, float]], ahead: int = 0) -> dict:
  """base_s + per_seq_s * rows by least squares over the steps (both >= 0): the mean host time
  per step, not the median. The wait's tail (a GC pause, the loop serving other instances
  first, another process on the cores) is time the device really sat idle, and the simulator
  predicts means. Returns the JSON of a HostFit plus the steps it saw."""
  groups: dict[int, list[float]] = {}
  for rows, seconds in samples:
    groups.setdefault(rows, []).append(seconds)
  if not groups:
    return {"base_s": 0.0, "per_seq_s": 0.0, "waited_share": 0.0 if ahead else 1.0,
            "steps": 0, "ahead": ahead}
  rows = sorted(groups)
  means = [sum(groups[n]) / len(groups[n]) for n in rows]
  if len(rows) == 1:
    base, per_seq = means[0], 0.0
  else:   # least squares over the steps == over each row count's mean, weighted by its steps
    weight = np.sqrt([len(groups[n]) for n in rows])
    x = np.array([[1.0, float(n)] for n in rows]) * weight[:, None]
    base, per_seq = _nonneg_lstsq(x, np.array(means) * weight)
  return {"base_s": float(base), "per_seq_s": float(per_seq),
          "waited_share": len(samples) / (len(samples) + ahead), "steps": len(samples),
          "ahead": ahead}


MIN_HOST_STEPS = 10   # a kind with fewer waited steps takes the fit of both kinds' steps


def fit_host_kinds(samples: dict) -> tuple[dict, dict]:
  """`host_samples`'s output -> ({kind: fit_host} of the host time, the same of the whole
  wait). A kind with fewer than MIN_HOST_STEPS waited steps (e.g. prefill steps in a
  disaggregated run, which seldom have a queue behind them) is fitted on both kinds' steps:
  the host's per-step work (collect, plan, launch) is the same code."""
  fits = ({}, {})
  for kind in ("prefill", "decode"):
    for fit, key in zip(fits, (kind, f"{kind}_wait")):
      points = samples[key]
      if len(points) < MIN_HOST_STEPS:
        points = samples[key.replace(kind, "prefill")] + samples[key.replace(kind, "decode")]
      fit[kind] = fit_host(points, samples[f"{kind}_ahead"])
  return fits


def attention_pairs(chunks: list[tuple[int, int]]) -> float:
  return float(sum(q * (c + (q + 1) / 2) for q, c in chunks))


def _pad(buckets: tuple[int, ...], n: int) -> int:
  i = bisect.bisect_left(buckets, n)
  return buckets[i] if i < len(buckets) else n


@dataclasses.dataclass(frozen=True)
class CalibratedCost:
  tp: int
  prefill: StepFit
  decode: StepFit
  transfer: StepFit
  kv_bytes_token: float
  prefill_buckets: tuple[int, ...]
  decode_buckets: tuple[int, ...]
  transfer_buckets: tuple[int, ...]     # pages per transfer
  host_prefill: HostFit = HostFit()     # driver host time per prefill / mixed step
  host_decode: HostFit = HostFit()      # and per decode step
  stream_group_s: float = 0.0           # per layer group of a streamed prefill (kv.stream_
                                        # layers; the profile's, engine/stream_timing.py)
  transfer_waits_for_destination = True  # the engine's copy queues behind dst's step

  def kv_bytes_per_token(self) -> float:
    return self.kv_bytes_token

  def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
    tokens = _pad(self.prefill_buckets, sum(q for q, _ in chunks))
    return self.prefill(tokens, attention_pairs(chunks)) + self.host_prefill(len(chunks))

  def decode_s(self, contexts: list[int]) -> float:
    return (self.decode(_pad(self.decode_buckets, len(contexts)), sum(contexts))
            + self.host_decode(len(contexts)))

  def decode_s_steps(self, batch: int, context_sums: np.ndarray) -> np.ndarray:
    """decode_s of `batch` sequences whose contexts sum to each of context_sums, exactly (the
    same operations in the same order; a decode chain's steps)."""
    fit = self.decode
    return (fit.base(_pad(self.decode_buckets, batch)) + fit.per_unit_s * context_sums
            + self.host_decode(batch))

  def decode_s_floor(self) -> float:
    """No decode step is shorter: the cheapest bucket's base and one row's host time (the
    fits' per-token and per-row terms are never negative; no step exceeds the largest
    bucket). 0 for a profile whose fits have a negative term (no bound then)."""
    if self.decode.per_unit_s < 0 or self.host_decode.per_seq_s < 0:
      return 0.0
    return min(self.decode.base(b) for b in self.decode_buckets) + self.host_decode(1)

  def moved_pages(self, num_pages: int) -> int:
    return num_pages   # the engine moves exactly the pages, in bucket-sized pieces

  def transfer_s(self, num_bytes: float) -> float:
    return self.transfer(num_bytes)


def save_profile(path: str, profile: dict) -> None:
  with open(path, "w") as f:
    json.dump(profile, f, indent=1, sort_keys=True)
    f.write("\n")


def load_profile(path: str, key: str = "sim.profile") -> dict:
  try:
    with open(path) as f:
      profile = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ProfileError(f"{key}={path!r} cannot be read: {e}") from None
  if profile.get("format") in OLD_FORMATS:
    raise ProfileError(f"{key}={path!r} has no host time ({profile['format']}, made "
                       f"before pdjax measured it); re-run python -m pdjax.calibrate")
  if profile.get("format") != FORMAT:
    raise ProfileError(f"{key}={path!r} is not a {FORMAT} profile")
  return profile


def check_profile(profile: dict, path: str, *, model: dict, dtype: str, tps,
                  key: str = "sim.profile") -> None:
  """The profile must describe this model (dataclasses.asdict of its LlamaConfig), dtype and
  every TP degree the run uses."""
  if profile["model"] != json.loads(json.dumps(model)) or profile["dtype"] != dtype:
    raise ProfileError(f"{key}={path!r} was calibrated for another model or dtype "
                       f"({profile.get('model_name', '?')}, {profile['dtype']}); "
                       f"run python -m pdjax.calibrate for this one")
  missing = sorted({int(tp) for tp in tps} - {int(tp) for tp in profile["instances"]})
  if missing:
    raise ProfileError(f"{key}={path!r} has no fit for tp={missing} "
                       f"(it has tp={sorted(int(t) for t in profile['instances'])})")


def cost_from_profile(profile: dict, tp: int, opts) -> CalibratedCost:
  """The cost of one instance of `tp` chips, padding to the run's buckets (`opts`). A run whose
  prefill program has more rows than the calibrated plain one (a chunked run's ragged program,
  which packs every decode row) takes the `prefill_ragged` fit when the profile has one: on
  this CPU a small prefill step costs ~2x more in the 17-row program than in the 4-row one."""
  fits = profile["instances"][str(tp)]
  host = profile["host_s"]
  prefill = fits["prefill"]
  if "prefill_ragged" in fits and opts.max_prefill_seqs > profile["engine"]["max_prefill_seqs"]:
    prefill = fits["prefill_ragged"]
  return CalibratedCost(tp=tp, prefill=StepFit.from_json(prefill),
                        decode=StepFit.from_json(fits["decode"]),
                        transfer=StepFit.from_json(fits["transfer"]),
                        kv_bytes_token=profile["kv_bytes_per_token"],
                        prefill_buckets=tuple(opts.prefill_buckets),
                        decode_buckets=tuple(opts.decode_buckets),
                        transfer_buckets=tuple(opts.transfer_buckets),
                        host_prefill=HostFit.from_json(host["prefill"]),
                        host_decode=HostFit.from_json(host["decode"]),
                        stream_group_s=profile.get("stream_group_s", {}).get("seconds", 0.0))
