"""Tests for pdjax.metrics.benefit: net benefit per prompt-length bucket, exact means."""

import pytest

from pdjax.metrics.benefit import net_benefit, request_benefit
from pdjax.request import Request, SamplingParams, Status


def make(rid, prompt_len, token_times, status=Status.FINISHED, transfer_s=0.0):
  r = Request(id=rid, arrival_s=0.0, prompt_ids=[1] * prompt_len,
              sampling=SamplingParams(max_new_tokens=8))
  for i, t in enumerate(token_times):
    r.add_token(10 + i, t)
  r.transfer_s = transfer_s
  r.finish(status, token_times[-1] if token_times else 0.0)
  return r


COLOCATED = [
    make("a", 50, [0.3, 0.4, 0.5]),          # ttft .3, tpot .1
    make("b", 80, [0.5, 0.6]),               # ttft .5, tpot .1
    make("c", 200, [1.0]),                   # ttft 1.0, no tpot
    make("d", 300, [], Status.REJECTED),     # not finished here: left out
    make("e", 60, [0.1, 0.2]),               # missing from the disaggregated run
]
DISAGGREGATED = [
    make("a", 50, [0.2, 0.35, 0.5], transfer_s=0.01),  # saved .1, extra .05*2, net -.01
    make("b", 80, [0.3, 0.42], transfer_s=0.02),       # saved .2, extra .02, net .16
    make("c", 200, [0.4], transfer_s=0.05),            # saved .6, extra 0, net .55
    make("d", 300, [0.4, 0.5], transfer_s=0.05),
    make("f", 10, [0.1, 0.2]),                         # only here: left out
]


def test_request_benefit():
  got = request_benefit(COLOCATED[0], DISAGGREGATED[0])
  assert got == {"prefill_saved_s": pytest.approx(0.1), "kv_transfer_s": 0.01,
                 "decode_extra_s": pytest.approx(0.1), "net_s": pytest.approx(-0.01)}
  assert request_benefit(COLOCATED[3], DISAGGREGATED[3]) is None


def test_net_benefit_buckets_exact_means():
  rows = net_benefit(COLOCATED, DISAGGREGATED, [100, 0])  # edges sorted
  assert [(r["lo"], r["hi"], r["n"]) for r in rows] == [(0, 100, 2), (100, None, 1)]
  small, large = rows
  assert small["prefill_saved_s"] == pytest.approx(0.15)
  assert small["kv_transfer_s"] == pytest.approx(0.015)
  assert small["decode_extra_s"] == pytest.approx(0.06)
  assert small["net_s"] == pytest.approx(0.075)
  assert large["prefill_saved_s"] == pytest.approx(0.6)
  assert large["kv_transfer_s"] == pytest.approx(0.05)
  assert large["decode_extra_s"] == 0.0
  assert large["net_s"] == pytest.approx(0.55)


def test_net_benefit_empty_buckets_and_short_prompts():
  rows = net_benefit(COLOCATED, DISAGGREGATED, [60, 100, 150])
  assert [(r["lo"], r["hi"], r["n"]) for r in rows] == [(60, 100, 1), (100, 150, 0),
                                                         (150, None, 1)]
  assert rows[0]["net_s"] == pytest.approx(0.16)       # only b; a (50) is below 60
  assert all(rows[1][k] is None for k in ("prefill_saved_s", "kv_transfer_s",
                                          "decode_extra_s", "net_s"))
  assert [r["n"] for r in net_benefit([], [], [0])] == [0]
  with pytest.raises(ValueError):
    net_benefit(COLOCATED, DISAGGREGATED, [])
