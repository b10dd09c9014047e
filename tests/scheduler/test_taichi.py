"""scheduler.path=taichi (issue 49, item 1): TaiChi's latency shifting between a P-heavy and a
D-heavy instance, on hand-built instances with a hand-checkable cost model (no model, no jax).

The cost model: a prefill step of n tokens costs 0.01 + 0.001 n s, a decode step 0.02 + 0.0001
per context token, a KV page 1,000 bytes over a 1 MB/s link (page size 4). The request: 100
prompt tokens, 11 new (a transfer spreads over 10 intervals), arriving at 0. SLOs: TTFT 1 s,
TPOT 0.1 s (at risk: over 0.9 x). P-heavy chunks 512 tokens, D-heavy 64.
"""

import types

import pytest

from helpers.fake_engine import _req
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.policies.base import PathChoice
from pdjax.scheduler.policy_api import Views
from pdjax.scheduler.policy_guard import GuardedPath


class Cost:
  prefill_s = staticmethod(lambda chunks: 0.01 + 0.001 * sum(q for q, _ in chunks))
  decode_s = staticmethod(lambda contexts: 0.02 + 0.0001 * sum(contexts))
  transfer_s = staticmethod(lambda num_bytes: num_bytes / 1e6)
  moved_pages = staticmethod(lambda pages: pages)


class _Worker:
  """An instance as the latency model reads it: a queue, a batch, a cost model, no cache."""

  def __init__(self, name, role, waiting=(), token_interval_s=None, cost=True):
    self.name, self.role, self.tp, self.max_batch = name, role, 1, 16
    self.waiting, self.running, self.reserved = list(waiting), [], {}
    self.prefill_tok_s = self.prefill_drain_tok_s = self.decode_step_s = None
    self.transfer_s_per_page, self.token_interval_s = None, token_interval_s
    self.tables = types.SimpleNamespace(page_size=4)
    self.instance = types.SimpleNamespace(cost=Cost() if cost else None, shares_host=False,
                                          kv_bytes=lambda pages: pages * 1000)

  def queued_tokens(self):
    return sum(r.prefill_len - r.num_computed_tokens for r in self.waiting)

  def num_running(self):
    return len(self.running) + len(self.reserved)

  def prefix_credit(self, names, salt):
    return 0

  def steps_in_flight(self):
    return []


def _choose(pw, dw):
  policy = policy_lib.PATHS["taichi"](slo_ttft_s=1.0, slo_tpot_s=0.1,
                                      tier_budgets={"prefill": 512, "decode": 64})
  return GuardedPath(policy, Views()).choose(_req(0, 100, 11), [pw], [dw], (pw, dw))


# Predictions shared by the cases below. d_local: 100 tokens on D-heavy in chunks of 64 and 36:
# 0.074 + 0.046 = 0.12 s; TPOT 0.02 + 0.0001 x 100 = 0.03; cost 0.11 (the prompt's seconds)
D_LOCAL = {"ttft_s": 0.12, "tpot_s": 0.03, "cost_s": 0.11, "headroom": 0.6}


def test_ttft_at_risk_goes_where_the_first_token_comes_soonest():
  """P-heavy has 900 prompt tokens waiting: with this one 1,000 tokens in steps of 512 and
  488, 0.522 + 0.498 = 1.02 s > 0.9: TTFT at risk (headroom (0.9 - 1.02) / 1 = -0.12). The
  idle D-heavy pick gives its first token at 0.12 s: the request prefills and decodes there."""
  choice = _choose(_Worker("prefill-0", "prefill", [_req(9, 900, 1)]),
                   _Worker("decode-0", "decode"))
  assert choice == PathChoice("colocated", "decode")
  assert choice.reason == {
      "policy": "taichi", "choice": "colocated", "tier": "decode",
      "why": "ttft at risk: first token soonest on the d_heavy pick",
      "ttft_at_risk": True, "tpot_at_risk": False, "p_heavy": "prefill-0", "d_heavy": "decode-0",
      # remote: the same prefill; 25 pages' 0.025 s transfer over 10 intervals: 0.0325
      "local": {"ttft_s": 1.02, "tpot_s": 0.03, "cost_s": 0.11, "headroom": -0.12},
      "remote": {"ttft_s": 1.02, "tpot_s": 0.0325, "cost_s": 0.135, "headroom": -0.12},
      "d_local": D_LOCAL}


def test_tpot_at_risk_decodes_where_steps_are_shortest():
  """P-heavy is idle (first token at 0.11 s) but its finished requests measured 0.2 s between
  tokens (its big chunks stretch every decode step): TPOT at risk (0.2 > 0.09). On the D-heavy
  pick a token takes 0.03 s plus the transfer's 0.0025: the KV moves there."""
  choice = _choose(_Worker("prefill-0", "prefill", token_interval_s=0.2),
                   _Worker("decode-0", "decode"))
  assert choice == PathChoice("disaggregated", "prefill")
  assert choice.reason == {
      "policy": "taichi", "choice": "disaggregated", "tier": "prefill",
      "why": "tpot at risk: shortest steps on the d_heavy pick",
      "ttft_at_risk": False, "tpot_at_risk": True, "p_heavy": "prefill-0", "d_heavy": "decode-0",
      "local": {"ttft_s": 0.11, "tpot_s": 0.2, "cost_s": 0.11, "headroom": -1.1},
      "remote": {"ttft_s": 0.11, "tpot_s": 0.0325, "cost_s": 0.135, "headroom": 0.575},
      "d_local": D_LOCAL}


@pytest.mark.parametrize("p_waiting,d_waiting,interval,why", [
    ((), (), None, "within the SLOs: local"),
    # TTFT at risk on P-heavy (1.02 s), worse on D-heavy (1,000 tokens in chunks of 64)
    ((900,), (900,), None, "at risk, but the p_heavy pick is the best: local"),
])
def test_otherwise_it_stays_local(p_waiting, d_waiting, interval, why):
  choice = _choose(_Worker("prefill-0", "prefill", [_req(9, n, 1) for n in p_waiting],
                           token_interval_s=interval),
                   _Worker("decode-0", "decode", [_req(8, n, 1) for n in d_waiting]))
  assert choice == PathChoice("colocated", "prefill")
  assert choice.reason["why"] == why and choice.reason["choice"] == "colocated"


def test_unmeasured_stays_local():
  """Without a cost model and before any rate is measured nothing can be predicted: the
  request stays on its P-heavy instance (no transfer)."""
  choice = _choose(_Worker("prefill-0", "prefill", cost=False),
                   _Worker("decode-0", "decode", cost=False))
  assert choice == PathChoice("colocated", "prefill")
  assert (choice.reason["why"], choice.reason["local"], choice.reason["remote"]) == (
      "unmeasured: local", None, None)


def test_within_the_slos_it_goes_where_the_headroom_is_larger():
  """P-heavy has 300 prompt tokens waiting: this one's first token at 0.01 + 0.4 = 0.41 s
  (headroom min((0.9 - 0.41) / 1, (0.09 - 0.03) / 0.1) = 0.49), within the SLOs; the idle
  D-heavy pick gives it at 0.12 s (headroom 0.6): it prefills and decodes there, so the D-heavy
  instances' chips serve requests too (before, everything not at risk stayed on P-heavy and a
  1P + 1D split of 70B sharegpt sustained half chunked 2xTP4's rate)."""
  choice = _choose(_Worker("prefill-0", "prefill", [_req(9, 300, 1)]),
                   _Worker("decode-0", "decode"))
  assert choice == PathChoice("colocated", "decode")
  assert (choice.reason["why"], choice.reason["local"], choice.reason["d_local"]) == (
      "within the SLOs: more headroom on the d_heavy pick",
      {"ttft_s": 0.41, "tpot_s": 0.03, "cost_s": 0.11, "headroom": 0.49}, D_LOCAL)


def test_a_chunked_step_carries_the_running_decodes():
  """Two requests of 50 prompt tokens decode on D-heavy: each step there carries their two
  decode rows (one token each of the 64-token budget: 62 prompt tokens, then 38) and their
  decode step, 0.02 + 0.0001 x 100 = 0.03 s: (0.072 + 0.03) + (0.048 + 0.03) = 0.18 s to the
  first token (without the rows: 0.12). TPOT: a step with it, 0.02 + 0.0001 x 200 = 0.04."""
  dw = _Worker("decode-0", "decode")
  dw.running = [_req(5, 50, 8), _req(6, 50, 8)]
  choice = _choose(_Worker("prefill-0", "prefill"), dw)
  assert choice.reason["d_local"]["ttft_s"] == 0.18
  assert choice.reason["d_local"]["tpot_s"] == 0.04
