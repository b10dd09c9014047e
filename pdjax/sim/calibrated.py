"""Calibrated step-time model, fitted to step times measured on the real engine
(`python -m pdjax.calibrate`), per TP degree. The engine's programs have static shapes, so a
step costs what its bucket costs, plus a term that grows with the attended context:

  prefill / mixed step   base_p(T) + c_p * A   T = packed tokens padded to the prefill bucket,
                                               A = sum_i q_i * (c_i + (q_i + 1) / 2), the causal
                                                   attention pairs (q_i new tokens after c_i
                                                   cached ones; ~ len^2 / 2 per prompt)
  decode step            base_d(B) + c_d * N   B = batch padded to the decode bucket,
                                               N = sum of context lengths
  KV transfer            base_t(X)             X = bytes moved, padded to the transfer bucket

base(.) is the fitted per-bucket time, interpolated linearly between calibrated buckets and
extrapolated from the last two (so a run whose buckets differ from the calibration's still gets
a number). With two buckets this is DistServe's a + b * tokens + c * sum(len^2) estimator. Fits
are non-negative least squares over one-hot bucket columns and the context column. A profile
is a JSON file; `check_profile` makes sure it describes the run.
"""

from __future__ import annotations

import bisect
import dataclasses
import json

import numpy as np

FORMAT = "pdjax.sim.profile/2"


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
  transfer_waits_for_destination = True  # the engine's copy queues behind dst's step

  def kv_bytes_per_token(self) -> float:
    return self.kv_bytes_token

  def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
    tokens = _pad(self.prefill_buckets, sum(q for q, _ in chunks))
    return self.prefill(tokens, attention_pairs(chunks))

  def decode_s(self, contexts: list[int]) -> float:
    return self.decode(_pad(self.decode_buckets, len(contexts)), sum(contexts))

  def moved_pages(self, num_pages: int) -> int:
    return num_pages   # the engine moves exactly the pages, in bucket-sized pieces

  def transfer_s(self, num_bytes: float) -> float:
    return self.transfer(num_bytes)


def save_profile(path: str, profile: dict) -> None:
  with open(path, "w") as f:
    json.dump(profile, f, indent=1, sort_keys=True)
    f.write("\n")


def load_profile(path: str) -> dict:
  try:
    with open(path) as f:
      profile = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ProfileError(f"sim.profile={path!r} cannot be read: {e}") from None
  if profile.get("format") != FORMAT:
    raise ProfileError(f"sim.profile={path!r} is not a {FORMAT} profile")
  return profile


def check_profile(profile: dict, path: str, *, model: dict, dtype: str, tps) -> None:
  """The profile must describe this model (dataclasses.asdict of its LlamaConfig), dtype and
  every TP degree the run uses."""
  if profile["model"] != json.loads(json.dumps(model)) or profile["dtype"] != dtype:
    raise ProfileError(f"sim.profile={path!r} was calibrated for another model or dtype "
                       f"({profile.get('model_name', '?')}, {profile['dtype']}); "
                       f"run python -m pdjax.calibrate for this one")
  missing = sorted({int(tp) for tp in tps} - {int(tp) for tp in profile["instances"]})
  if missing:
    raise ProfileError(f"sim.profile={path!r} has no fit for tp={missing} "
                       f"(it has tp={sorted(int(t) for t in profile['instances'])})")


def cost_from_profile(profile: dict, tp: int, opts) -> CalibratedCost:
  """The cost of one instance of `tp` chips, padding to the run's buckets (`opts`)."""
  fits = profile["instances"][str(tp)]
  return CalibratedCost(tp=tp, prefill=StepFit.from_json(fits["prefill"]),
                        decode=StepFit.from_json(fits["decode"]),
                        transfer=StepFit.from_json(fits["transfer"]),
                        kv_bytes_token=profile["kv_bytes_per_token"],
                        prefill_buckets=tuple(opts.prefill_buckets),
                        decode_buckets=tuple(opts.decode_buckets),
                        transfer_buckets=tuple(opts.transfer_buckets))
