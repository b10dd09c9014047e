"""Named workload mixes for the planner's map mode: prompt/output length distributions.

Every mix is the `lognormal` synthetic preset (Poisson arrivals; lengths log-normal, sigma 1,
clipped) with its own means and caps. A log-normal's median is exp(mu) and its mean
exp(mu + sigma^2 / 2), so a mix given by published *medians* uses mean = median * e^(1/2):

  sharegpt     prompt mean 161 / output mean 338, caps 1024 / 1024: ShareGPT as sampled in
               the vLLM paper (the DistServe reproduction's mix, configs/distserve_repro.py).
  long_prompt  prompt mean 3000 / output mean 150, caps 7168 / 1024: an assumed document-QA /
               summarization-like mix (20:1), not a measured distribution.
  azure_conv   stand-in for the Azure LLM inference trace 2023, conversation: prompt median
               1020 / output median 129 tokens (as quoted by Splitwise, Patel et al., ISCA'24,
               section on the production traces) -> means 1682 / 213, caps 7168 / 1024.
  azure_code   stand-in for the same trace's code requests: prompt median 1500 / output median
               13 -> means 2473 / 21.4, caps 7168 / 1024.
  config       the config's own workload section, unchanged.
  workload     the same (both names mean the config's workload): a synthetic one runs as
               configured at the map's rates; a trace file (workload.kind azure | mooncake |
               burstgpt | jsonl) is offered as its rows' lengths, resampled, with Poisson
               arrivals at the map's rates (pdjax/planning/workload_mix.py), so a map can be
               drawn for a real trace.

The Azure mixes are synthetic stand-ins from those two medians (the trace files are not
shipped); only the medians are matched, the shapes (sigma 1) and arrivals (Poisson) are ours.
With `--config.workload.kind=azure --config.workload.path=FILE`, the mix `workload` maps the
real trace's lengths instead (`python -m pdjax.run` on that config replays it as recorded).
Pure Python.
"""

from __future__ import annotations

import math

SQRT_E = math.exp(0.5)   # mean / median of a log-normal with sigma 1


def _lognormal(prompt_mean: float, output_mean: float, max_prompt: int, max_output: int) -> dict:
  return {"kind": "synthetic", "preset": "lognormal", "arrival": "poisson",
          "lognormal_prompt_mean": float(prompt_mean),
          "lognormal_output_mean": float(output_mean), "lognormal_sigma": 1.0,
          "lognormal_max_prompt_len": int(max_prompt),
          "lognormal_max_output_len": int(max_output)}


MIXES: dict[str, dict | None] = {
    "sharegpt": _lognormal(161.0, 338.0, 1024, 1024),
    "long_prompt": _lognormal(3000.0, 150.0, 7168, 1024),
    "azure_conv": _lognormal(round(1020 * SQRT_E, 1), round(129 * SQRT_E, 1), 7168, 1024),
    "azure_code": _lognormal(round(1500 * SQRT_E, 1), round(13 * SQRT_E, 1), 7168, 1024),
    "config": None,
    "workload": None,
}


def apply_mix(workload, name: str) -> None:
  """Sets the mix's keys on a config's workload section (in place); "config" and "workload"
  keep it."""
  if name not in MIXES:
    raise KeyError(f"unknown mix {name!r} (known: {', '.join(MIXES)})")
  for key, value in (MIXES[name] or {}).items():
    workload[key] = value


def longest(name: str) -> int:
  """The longest prompt + output the mix draws (0 for the config's own: the config
  decides)."""
  mix = MIXES[name]
  return 0 if mix is None else mix["lognormal_max_prompt_len"] + mix["lognormal_max_output_len"]
