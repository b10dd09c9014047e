"""Tests for pdjax.workload.presets: ranges, fit in 512, token ids, shared prefixes, sessions."""

import numpy as np
import pytest

from pdjax.workload import presets

VOCAB, EOS = 64, (2, 7)


def make(name, n=300, seed=0, **params):
  return presets.PRESETS[name](n, np.random.default_rng(seed), VOCAB, EOS, **params)


def lengths(specs):
  return [(len(s.prompt_ids), s.max_new_tokens) for s in specs]


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_deterministic_valid_ids_and_fit_512(name):
  specs = make(name)
  assert len(specs) == 300 and make(name, n=0) == []
  assert specs == make(name)
  assert lengths(specs) != lengths(make(name, seed=1))
  ids = {t for s in specs for t in s.prompt_ids}
  assert ids <= set(range(1, VOCAB)) - set(EOS)
  assert all(type(t) is int for s in specs for t in s.prompt_ids)
  assert all(len(s.prompt_ids) >= 1 and s.max_new_tokens >= 1 for s in specs)
  assert all(len(s.prompt_ids) + s.max_new_tokens <= 512 for s in specs)


@pytest.mark.parametrize("name, prompt, new", [
    ("chat", (16, 96), (16, 64)),
    ("long_doc_qa", (256, 448), (4, 16)),
    ("rag", (32 + 128 + 8, 32 + 256 + 24), (16, 48)),
])
def test_ranges(name, prompt, new):
  got = lengths(make(name, n=1000))
  assert all(prompt[0] <= p <= prompt[1] and new[0] <= m <= new[1] for p, m in got)
  if name != "rag":   # Inclusive bounds are reachable.
    assert min(p for p, _ in got) == prompt[0] and max(p for p, _ in got) == prompt[1]
  assert {m for _, m in got} == set(range(new[0], new[1] + 1))


def test_mixed_uses_config_ranges():
  specs = make("mixed", chat_fraction=0.5, chat_prompt_len=(4, 8), chat_max_new_tokens=(1, 2),
               doc_prompt_len=(100, 120), doc_max_new_tokens=(10, 12))
  chat = [(p, m) for p, m in lengths(specs) if p <= 8]
  doc = [(p, m) for p, m in lengths(specs) if p > 8]
  assert 100 < len(chat) < 200 and len(chat) + len(doc) == 300
  assert all(4 <= p and 1 <= m <= 2 for p, m in chat)
  assert all(100 <= p <= 120 and 10 <= m <= 12 for p, m in doc)
  defaults = lengths(make("mixed"))
  assert all(16 <= p <= 64 or 192 <= p <= 448 for p, _ in defaults)


def test_mixed_rejects_bad_params():
  with pytest.raises(ValueError, match=r"^chat_fraction must be in \[0, 1\], got 2.0$"):
    make("mixed", chat_fraction=2.0)
  with pytest.raises(ValueError, match=r"^doc_prompt_len is empty: min 9 > max 3$"):
    make("mixed", doc_prompt_len=(9, 3))


def test_rag_shares_system_prefix_and_reuses_passages():
  specs = make("rag", n=200)
  system = specs[0].prompt_ids[:32]
  assert all(s.prompt_ids[:32] == system for s in specs)
  assert len({tuple(s.prompt_ids[32:160]) for s in specs}) <= presets.RAG_PASSAGES


def test_agent_multiturn_sessions_extend_their_prefix():
  specs = make("agent_multiturn", n=301)
  sessions = {}
  for s in specs:
    assert s.session.startswith("sess-")
    sessions.setdefault(s.session, []).append(s)
  assert sum(len(turns) for turns in sessions.values()) == 301
  assert all(1 <= len(turns) <= 4 for turns in sessions.values())
  assert sum(len(turns) >= 2 for turns in sessions.values()) >= len(sessions) - 1
  for turns in sessions.values():
    for prev, cur in zip(turns, turns[1:]):
      grown = len(cur.prompt_ids) - len(prev.prompt_ids)
      assert cur.prompt_ids[:len(prev.prompt_ids)] == prev.prompt_ids   # Exact shared prefix.
      assert prev.max_new_tokens + 8 <= grown <= prev.max_new_tokens + 48
    assert all(8 <= t.max_new_tokens <= 32 for t in turns)
  assert 32 <= min(len(s.prompt_ids) for s in specs)
  order = [int(s.session[5:]) for s in specs]
  assert order != sorted(order)   # Sessions interleave.


def test_agent_multiturn_distinct_sessions_share_nothing():
  specs = make("agent_multiturn", n=40)
  firsts = {}
  for s in specs:
    firsts.setdefault(s.session, s.prompt_ids[:16])
  assert len({tuple(p) for p in firsts.values()}) == len(firsts)


def test_lognormal_means_and_clipping():
  specs = make("lognormal", n=4000, lognormal_prompt_mean=100.0, lognormal_output_mean=40.0,
               lognormal_sigma=0.5, lognormal_max_prompt_len=10_000,
               lognormal_max_output_len=10_000)
  prompts, outputs = zip(*lengths(specs))
  assert np.mean(prompts) == pytest.approx(100.0, rel=0.03)
  assert np.mean(outputs) == pytest.approx(40.0, rel=0.03)
  clipped = lengths(make("lognormal", n=2000, lognormal_max_prompt_len=50,
                         lognormal_max_output_len=20))
  assert max(p for p, _ in clipped) == 50 and max(m for _, m in clipped) == 20
