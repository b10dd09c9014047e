"""The one workload entry point: a config's `workload` section in, Requests and problems out.

`kind` picks the source: `synthetic` (an arrival process times a preset mix), a trace file
(`azure`, `mooncake`, `burstgpt`, `jsonl`) replayed through grain, or `python`: rows from the
researcher's own function (`path = "module:function"`, see from_code). Every source is fitted into
max_model_len the same way (see limits) and reports what it skipped or cut as problem lines;
the run goes on. Keys missing from `w` take their defaults from `default_workload_config()`.
"""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from pdjax.request import Request
from pdjax.workload.arrivals import ARRIVALS, arrival_times
from pdjax.workload.from_code import read_python, workload_function
from pdjax.workload.limits import check_max_model_len, fit_lengths, truncation_note
from pdjax.workload.presets import PRESETS, RequestSpec
from pdjax.workload.replay import replay
from pdjax.workload.synthetic import specs_to_requests
from pdjax.workload.traces import READERS

KINDS = ("synthetic",) + tuple(READERS) + ("python",)
MIXED_KEYS = ("chat_fraction", "chat_prompt_len", "chat_max_new_tokens", "doc_prompt_len",
              "doc_max_new_tokens")
LOGNORMAL_KEYS = ("lognormal_prompt_mean", "lognormal_output_mean", "lognormal_sigma",
                  "lognormal_max_prompt_len", "lognormal_max_output_len")


# Arrivals stay where a float64 clock resolves microseconds: 10M requests at MIN_RATE span
# 1e11 s (resolution 15 us). At workload.rate=1e-300 the clock stood still (1e300 + 60 ==
# 1e300): every KV lease expired at once and no disaggregated request finished.
MIN_RATE = 1e-4
MAX_TIME_SCALE = 1e6


def default_workload_config() -> ml_collections.ConfigDict:
  """Every workload key with its default."""
  w = ml_collections.ConfigDict()
  w.kind = "synthetic"              # synthetic | azure | mooncake | burstgpt | jsonl | python
  w.path = ""                       # trace file (kinds other than synthetic); python:
                                    #   "module:function" called as function(config, rng)
  w.preset = "mixed"                # synthetic: mixed | chat | long_doc_qa | rag |
                                    #   agent_multiturn | lognormal
  w.arrival = "poisson"             # synthetic arrivals: poisson | gamma | onoff | ramp
  w.rate = 8.0                      # requests per second (synthetic)
  w.num_requests = 64               # synthetic: how many; traces: first N good rows (0 = all)
  w.time_scale = 1.0                # multiplies inter-arrival gaps (0.5 = twice as fast)
  w.burstiness = 1.0                # gamma shape: 1 = Poisson, < 1 burstier
  w.on_s = 2.0                      # onoff: seconds on (arrivals at rate)
  w.off_s = 2.0                     # onoff: seconds off (no arrivals)
  w.ramp_to_rate = 16.0             # ramp: rate at the last arrival
  w.ignore_eos = False              # generate max_new_tokens even past an EOS token
  w.tenants = 1                     # synthetic: requests spread over tenant-0..; by session
  w.chat_fraction = 0.75            # mixed preset: share of chat requests
  w.chat_prompt_len = (16, 64)      # mixed preset: chat prompt tokens (low, high), uniform
  w.chat_max_new_tokens = (16, 48)  # mixed preset: chat max_new_tokens (low, high), uniform
  w.doc_prompt_len = (192, 448)     # mixed preset: document prompt tokens (low, high), uniform
  w.doc_max_new_tokens = (8, 24)    # mixed preset: document max_new_tokens (low, high), uniform
  w.lognormal_prompt_mean = 128.0   # lognormal preset: mean prompt tokens (before clipping)
  w.lognormal_output_mean = 64.0    # lognormal preset: mean max_new_tokens (before clipping)
  w.lognormal_sigma = 1.0           # lognormal preset: sigma of log length
  w.lognormal_max_prompt_len = 384  # lognormal preset: longer draws are clipped
  w.lognormal_max_output_len = 128  # lognormal preset: longer draws are clipped
  return w


_DEFAULTS = default_workload_config().to_dict()


def _get(w, key: str):
  return w.get(key, _DEFAULTS[key])


def _why(key: str, value, why: str) -> str:
  return f"workload.{key}={value!r} {why}"


def validate_workload(w) -> str | None:
  """None when w is usable, else one line naming the first bad key."""
  kind = _get(w, "kind")
  if kind not in KINDS:
    return _why("kind", kind, f"is not one of {list(KINDS)}")
  checks = [
      ("num_requests", lambda v: v >= 0, "must be >= 0"),
      ("time_scale", lambda v: 0 < v <= MAX_TIME_SCALE,
       f"must be > 0 and at most {MAX_TIME_SCALE:g} (times stretched further lose the clock's "
       f"precision)"),
  ]
  if kind == "synthetic":
    checks += [
        ("preset", lambda v: v in PRESETS, f"is not one of {list(PRESETS)}"),
        ("arrival", lambda v: v in ARRIVALS, f"is not one of {list(ARRIVALS)}"),
        ("rate", lambda v: MIN_RATE <= v < float("inf"),
         f"must be >= {MIN_RATE:g} requests per second (arrivals further apart lose the "
         f"clock's precision: at 1e-300 every duration rounded away)"),
        ("tenants", lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1"),
    ]
    arrival = _get(w, "arrival")
    if arrival == "gamma":
      checks.append(("burstiness", lambda v: 0 < v < float("inf"), "must be > 0"))
    if arrival == "onoff":
      checks += [("on_s", lambda v: 0 < v < float("inf"), "must be > 0 seconds"),
                 ("off_s", lambda v: 0 <= v < float("inf"), "must be >= 0 seconds")]
    if arrival == "ramp":
      checks.append(("ramp_to_rate", lambda v: MIN_RATE <= v < float("inf"),
                     f"must be >= {MIN_RATE:g} requests per second"))
    if _get(w, "preset") == "mixed":
      checks.append(("chat_fraction", lambda v: 0.0 <= v <= 1.0, "must be within [0, 1]"))
      checks += [(key, lambda v: len(v) == 2 and 1 <= v[0] <= v[1],
                  "must be (low, high) with 1 <= low <= high") for key in MIXED_KEYS[1:]]
    if _get(w, "preset") == "lognormal":
      checks += [(key, lambda v: 0 < v < float("inf"), "must be a finite number > 0")
                 for key in LOGNORMAL_KEYS[:3]]
      checks += [(key, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1")
                 for key in LOGNORMAL_KEYS[3:]]
  else:
    path = _get(w, "path")
    if not path:
      return _why("path", path, f"is required for kind={kind}")
    if kind == "python":
      try:
        workload_function(path)
      except ValueError as e:
        return str(e)
    elif not os.path.isfile(path):
      return _why("path", path, "does not exist" if not os.path.exists(path)
                  else "is not a file")
  for key, ok, why in checks:
    value = _get(w, key)
    try:
      good = bool(ok(tuple(value) if isinstance(value, list) else value))
    except (TypeError, ValueError):
      good = False
    if not good:
      return _why(key, tuple(value) if isinstance(value, list) else value, why)
  return None


def _synthetic(w, *, seed: int, vocab_size: int,
               eos_ids: tuple[int, ...]) -> tuple[list[float], list[RequestSpec]]:
  rng = np.random.default_rng(seed)
  n = int(_get(w, "num_requests"))
  times = arrival_times(_get(w, "arrival"), n, rate=_get(w, "rate"), rng=rng,
                        burstiness=_get(w, "burstiness"), on_s=_get(w, "on_s"),
                        off_s=_get(w, "off_s"), ramp_to_rate=_get(w, "ramp_to_rate"))
  preset = _get(w, "preset")
  params = ({k: _get(w, k) for k in MIXED_KEYS} if preset == "mixed" else
            {k: _get(w, k) for k in LOGNORMAL_KEYS} if preset == "lognormal" else {})
  for k in MIXED_KEYS[1:]:
    if k in params:
      params[k] = tuple(params[k])
  specs = PRESETS[preset](n, rng, vocab_size, eos_ids, **params)
  return times, specs


def _tenants(specs, n: int) -> list[str]:
  """Each synthetic request's tenant: with n > 1, tenant-<k> by order of first appearance of
  its session (a session stays with one tenant), or of the request itself without one."""
  if n <= 1:
    return [spec.tenant for spec in specs]
  index: dict[str, int] = {}
  out = []
  for i, spec in enumerate(specs):
    key = spec.session or f"#{i}"
    out.append(f"tenant-{index.setdefault(key, len(index)) % n}")
  return out


def load_workload(w, *, seed: int, vocab_size: int, eos_ids: tuple[int, ...],
                  max_model_len: int,
                  temperature: float = 0.0) -> tuple[list[Request], list[str]]:
  """Requests sorted by arrival (ids req-00000.. in that order; a JSONL row's own id is kept)
  and the problems list.

  Raises ValueError with validate_workload's line when w is unusable.
  """
  error = validate_workload(w)
  if error:
    raise ValueError(error)
  check_max_model_len(max_model_len)
  eos_ids = tuple(int(e) for e in eos_ids)
  kind, ignore_eos = _get(w, "kind"), bool(_get(w, "ignore_eos"))
  time_scale = float(_get(w, "time_scale"))
  if kind != "synthetic":
    cap = int(_get(w, "num_requests")) or None
    if kind == "python":
      rows, problems = read_python(_get(w, "path"), workload=w, seed=seed, num_requests=cap,
                                   vocab_size=vocab_size)
    else:
      extra = {"vocab_size": vocab_size} if kind == "jsonl" else {}
      rows, problems = READERS[kind](_get(w, "path"), num_requests=cap, **extra)
    requests, more = replay(rows, source=os.path.basename(_get(w, "path")), seed=seed,
                            vocab_size=vocab_size, eos_ids=eos_ids,
                            max_model_len=max_model_len, time_scale=time_scale,
                            temperature=temperature, ignore_eos=ignore_eos)
    return requests, problems + more

  times, specs = _synthetic(w, seed=seed, vocab_size=vocab_size, eos_ids=eos_ids)
  fitted, truncated = [], 0
  tenant_of = _tenants(specs, int(_get(w, "tenants")))
  for spec, tenant in zip(specs, tenant_of):
    prompt_len, new = fit_lengths(len(spec.prompt_ids), spec.max_new_tokens, max_model_len)
    truncated += (prompt_len, new) != (len(spec.prompt_ids), spec.max_new_tokens)
    fitted.append(RequestSpec(spec.prompt_ids[:prompt_len], new, tenant, spec.session))
  times = [t * time_scale for t in times]   # Synthetic gaps run from 0.
  requests = specs_to_requests(times, fitted, temperature=temperature, eos_ids=eos_ids,
                               ignore_eos=ignore_eos)
  problems = []
  if truncated:
    problems.append(truncation_note(f"synthetic:{_get(w, 'preset')}", truncated, len(specs),
                                    max_model_len))
  return requests, problems
