"""Seeded synthetic workload: short chat requests mixed with long document requests.

Arrivals are a Poisson process (exponential inter-arrival gaps with mean 1/rate). The
chat/doc mix is what makes prefill/decode interference visible: long doc prefills stall
the decode steps of co-located chat requests. Same seed, same list.
"""

from __future__ import annotations

import numpy as np

from pdjax.request import Request, SamplingParams


def _check_range(name: str, bounds: tuple[int, int], minimum: int) -> tuple[int, int]:
  if len(bounds) != 2:
    raise ValueError(f"{name} must be a (min, max) pair, got {bounds!r}")
  lo, hi = int(bounds[0]), int(bounds[1])
  if lo > hi:
    raise ValueError(f"{name} is empty: min {lo} > max {hi}")
  if lo < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got min {lo}")
  return lo, hi


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
  if not rate > 0:
    raise ValueError(f"rate must be > 0 requests/s, got {rate}")
  if not 0.0 <= chat_fraction <= 1.0:
    raise ValueError(f"chat_fraction must be in [0, 1], got {chat_fraction}")
  chat_prompt = _check_range("chat_prompt_len", chat_prompt_len, 1)
  chat_new = _check_range("chat_max_new_tokens", chat_max_new_tokens, 1)
  doc_prompt = _check_range("doc_prompt_len", doc_prompt_len, 1)
  doc_new = _check_range("doc_max_new_tokens", doc_max_new_tokens, 1)
  eos_ids = tuple(int(e) for e in eos_ids)
  allowed = np.setdiff1d(np.arange(1, max(vocab_size, 1)), np.asarray(eos_ids, int))
  if allowed.size == 0:
    raise ValueError(
        f"no prompt token ids left in [1, {vocab_size}) after excluding eos_ids {eos_ids}")

  rng = np.random.default_rng(seed)
  arrivals = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
  for i in range(1, num_requests):  # Guard against a zero gap lost to rounding.
    if arrivals[i] <= arrivals[i - 1]:
      arrivals[i] = np.nextafter(arrivals[i - 1], np.inf)
  is_chat = rng.random(num_requests) < chat_fraction

  requests = []
  for i in range(num_requests):
    prompt_range, new_range = (chat_prompt, chat_new) if is_chat[i] else (doc_prompt,
                                                                          doc_new)
    prompt_len = int(rng.integers(prompt_range[0], prompt_range[1] + 1))
    max_new_tokens = int(rng.integers(new_range[0], new_range[1] + 1))
    prompt_ids = allowed[rng.integers(0, allowed.size, size=prompt_len)]
    requests.append(Request(
        id=f"req-{i:05d}",
        arrival_s=float(arrivals[i]),
        prompt_ids=[int(t) for t in prompt_ids],
        sampling=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                ignore_eos=ignore_eos),
        eos_ids=eos_ids,
    ))
  return requests
