"""Seeded synthetic workload: short chat requests mixed with long document requests.

Arrivals are a Poisson process (exponential inter-arrival gaps with mean 1/rate). The
chat/doc mix is what makes prefill/decode interference visible: long doc prefills stall
the decode steps of co-located chat requests. Same seed, same list. Built from the
`arrivals.poisson` process and the `presets.mixed` preset, drawn from one Generator in that
order (so `load_workload` with kind=synthetic, preset=mixed, arrival=poisson matches it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdjax.request import Request, SamplingParams
from pdjax.workload import arrivals, presets


def specs_to_requests(times: Sequence[float], specs: Sequence[presets.RequestSpec], *,
                      temperature: float, eos_ids: tuple[int, ...],
                      ignore_eos: bool) -> list[Request]:
  """Pairs arrival times with specs, in order; ids req-00000.."""
  eos_ids = tuple(int(e) for e in eos_ids)
  return [
      Request(id=f"req-{i:05d}", arrival_s=float(t), prompt_ids=list(s.prompt_ids),
              sampling=SamplingParams(temperature=temperature,
                                      max_new_tokens=s.max_new_tokens, ignore_eos=ignore_eos),
              eos_ids=eos_ids, tenant=s.tenant, session=s.session)
      for i, (t, s) in enumerate(zip(times, specs, strict=True))
  ]


def synthetic_requests(*, num_requests: int, rate: float, seed: int, vocab_size: int,
                       chat_fraction: float, chat_prompt_len: tuple[int, int],
                       chat_max_new_tokens: tuple[int, int],
                       doc_prompt_len: tuple[int, int],
                       doc_max_new_tokens: tuple[int, int], temperature: float = 0.0,
                       eos_ids: tuple[int, ...] = (),
                       ignore_eos: bool = False) -> list[Request]:
  """num_requests requests, ids req-00000.., arrivals strictly increasing from the first gap.

  Each request is "chat" with probability chat_fraction, else "doc"; prompt and output
  lengths are uniform in the given inclusive ranges; prompt token ids are uniform in
  [1, vocab_size) minus eos_ids.
  """
  if num_requests < 0:
    raise ValueError(f"num_requests must be >= 0, got {num_requests}")
  rng = np.random.default_rng(seed)
  times = arrivals.poisson(num_requests, rate=rate, rng=rng)
  specs = presets.mixed(num_requests, rng, vocab_size, tuple(eos_ids),
                        chat_fraction=chat_fraction, chat_prompt_len=chat_prompt_len,
                        chat_max_new_tokens=chat_max_new_tokens,
                        doc_prompt_len=doc_prompt_len, doc_max_new_tokens=doc_max_new_tokens)
  return specs_to_requests(times, specs, temperature=temperature, eos_ids=eos_ids,
                           ignore_eos=ignore_eos)
