"""Tests for pdjax.workload.synthetic: determinism, ranges, arrivals, errors."""

import numpy as np
import pytest

from pdjax.request import Status
from pdjax.workload.synthetic import synthetic_requests

BASE = dict(num_requests=200, rate=4.0, seed=0, vocab_size=50, chat_fraction=0.7,
            chat_prompt_len=(4, 16), chat_max_new_tokens=(2, 8),
            doc_prompt_len=(64, 128), doc_max_new_tokens=(16, 32))


def make(**overrides):
  return synthetic_requests(**{**BASE, **overrides})


def as_tuples(reqs):
  return [(r.id, r.arrival_s, r.prompt_ids, r.sampling, r.eos_ids) for r in reqs]


def test_deterministic_per_seed():
  assert as_tuples(make()) == as_tuples(make())
  assert as_tuples(make()) != as_tuples(make(seed=1))


def test_ids_arrivals_and_sampling():
  reqs = make(temperature=0.7, ignore_eos=True, eos_ids=(2,))
  assert [r.id for r in reqs[:3]] == ["req-00000", "req-00001", "req-00002"]
  assert reqs[-1].id == "req-00199"
  arrivals = [r.arrival_s for r in reqs]
  assert arrivals[0] > 0.0
  assert all(b > a for a, b in zip(arrivals, arrivals[1:]))
  assert all(r.sampling.temperature == 0.7 and r.sampling.ignore_eos for r in reqs)
  assert all(r.eos_ids == (2,) and r.status == Status.WAITING for r in reqs)
  assert all(type(t) is int for r in reqs for t in r.prompt_ids)
  assert all(type(r.arrival_s) is float for r in reqs)


def test_lengths_within_ranges_and_mix():
  reqs = make()
  num_chat = 0
  for r in reqs:
    n, m = r.prompt_len, r.sampling.max_new_tokens
    if n <= 16:
      num_chat += 1
      assert 4 <= n and 2 <= m <= 8
    else:
      assert 64 <= n <= 128 and 16 <= m <= 32
  assert 0 < num_chat < 200
  assert min(r.prompt_len for r in reqs) == 4  # Inclusive bounds are reachable.
  assert max(r.prompt_len for r in reqs) == 128


def test_chat_fraction_extremes():
  assert all(4 <= r.prompt_len <= 16 for r in make(chat_fraction=1.0))
  assert all(64 <= r.prompt_len <= 128 for r in make(chat_fraction=0.0))


def test_fixed_lengths():
  reqs = make(chat_fraction=1.0, chat_prompt_len=(5, 5), chat_max_new_tokens=(3, 3))
  assert {(r.prompt_len, r.sampling.max_new_tokens) for r in reqs} == {(5, 3)}


def test_prompt_ids_exclude_eos_and_stay_in_vocab():
  reqs = make(vocab_size=6, eos_ids=(2, 5))
  ids = {t for r in reqs for t in r.prompt_ids}
  assert ids == {1, 3, 4}
  ids = {t for r in make(vocab_size=6) for t in r.prompt_ids}
  assert ids == {1, 2, 3, 4, 5}


def test_mean_inter_arrival_is_one_over_rate():
  reqs = make(num_requests=2000, rate=8.0)
  gaps = np.diff([0.0] + [r.arrival_s for r in reqs])
  assert abs(gaps.mean() - 1 / 8.0) < 0.1 / 8.0


def test_zero_requests():
  assert make(num_requests=0) == []


@pytest.mark.parametrize("overrides, message", [
    (dict(rate=0.0), "rate must be > 0 requests/s, got 0.0"),
    (dict(rate=-1.0), "rate must be > 0 requests/s, got -1.0"),
    (dict(num_requests=-1), "num_requests must be >= 0, got -1"),
    (dict(chat_fraction=1.5), "chat_fraction must be in [0, 1], got 1.5"),
    (dict(chat_fraction=-0.1), "chat_fraction must be in [0, 1], got -0.1"),
    (dict(chat_prompt_len=(8, 4)), "chat_prompt_len is empty: min 8 > max 4"),
    (dict(doc_max_new_tokens=(5, 1)), "doc_max_new_tokens is empty: min 5 > max 1"),
    (dict(doc_prompt_len=(0, 4)), "doc_prompt_len must be >= 1, got min 0"),
    (dict(chat_max_new_tokens=(0, 4)), "chat_max_new_tokens must be >= 1, got min 0"),
    (dict(chat_prompt_len=(4,)), "chat_prompt_len must be a (min, max) pair, got (4,)"),
    (dict(vocab_size=3, eos_ids=(1, 2)),
     "no prompt token ids left in [1, 3) after excluding eos_ids (1, 2)"),
    (dict(vocab_size=1), "no prompt token ids left in [1, 1) after excluding eos_ids ()"),
])
def test_errors(overrides, message):
  with pytest.raises(ValueError) as e:
    make(**overrides)
  assert str(e.value) == message
