"""slo_headroom's online TTFT correction (scheduler.latency_feedback) and the host-sharing wait
of the latency model: hand-built states and a fake-engine run with known step times."""

import types

import pytest

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req, ok_transfer
from pdjax import config as config_lib
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.scheduler.policies import latency_model
from pdjax.scheduler.policy_api import Views
from pdjax.scheduler.policies.latency_feedback import LatencyFeedback, size_class


def test_size_classes_are_powers_of_two_from_128():
  assert [size_class(n) for n in (1, 127, 128, 129, 256, 257, 1513, 2048, 2049)] == [
      7, 7, 7, 8, 8, 9, 11, 11, 12]


def test_the_correction_is_the_median_of_the_last_window_residuals():
  fb = LatencyFeedback(3)
  assert fb.correction_s("local", 7) == 0.0                       # nothing learned yet
  for residual in (0.010, 0.002, 0.004):
    fb.learn("local", 7, residual)
  assert fb.correction_s("local", 7) == 0.004                     # median of 10, 2, 4 ms
  fb.learn("local", 7, 0.001)                                     # 10 ms leaves the window
  assert fb.correction_s("local", 7) == 0.002                     # median of 2, 4, 1
  # an unseen size class borrows its path's residuals of any size; another path has none
  fb.learn("local", 11, 0.030)
  assert fb.correction_s("local", 9) == 0.004                     # median of 4, 1, 30 ms
  assert fb.correction_s("remote", 7) == 0.0
  with pytest.raises(ValueError, match="latency feedback window 0 < 1"):
    LatencyFeedback(0)


class Cost:
  """A prefill step 0.04 s whatever its size, a decode step 0.005 s, a page 1,000 bytes over
  a 1 MB/s link."""
  prefill_s = staticmethod(lambda chunks: 0.04)
  decode_s = staticmethod(lambda contexts: 0.005)
  transfer_s = staticmethod(lambda num_bytes: num_bytes / 1e6)
  moved_pages = staticmethod(lambda pages: pages)


def _run(feedback: int):
  """Two 8-token prompts, 3 new tokens each, at 0 and 1 s, on one prefill and one decode
  fake instance (a prefill step takes 0.1 s there) whose cost model says 0.04 s. SLO TTFT 10 s,
  TPOT 10 ms: local's TPOT 5 ms (headroom 0.4) beats remote's 5 ms + 2 pages' 2 ms / 2 (0.3),
  so both stay on decode-0."""
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  for inst in (p, d):
    inst.cost, inst.kv_bytes = Cost(), lambda pages: pages * 1000
  names = dict(prefill_router="least_loaded", decode_router="least_loaded",
               path="slo_headroom", admission="none", colocated_policy="prefill_first",
               role_switch="none")
  policies = policy_lib.build(names, dict(token_budget=16, max_prefill_seqs=4, slo_ttft_s=10.0,
                                          slo_tpot_s=0.01, latency_feedback=feedback))
  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                  options=OPTS, clock=clock, transfer_fn=ok_transfer, policies=policies)
  return driver.run([_req(0, 8, 3), _req(1, 8, 3, arrival=1.0)]).requests


def test_the_next_prediction_adds_what_the_first_token_measured_beyond_the_last():
  first, second = _run(feedback=4)
  assert [r.path for r in (first, second)] == ["colocated", "colocated"]
  assert first.ttft_s == pytest.approx(0.1)                   # the fake's 0.1 s prefill step
  # the first: nothing learned; the second: 0.04 predicted + (0.1 - 0.04) learned on local
  assert first.path_reason["local"]["ttft_s"] == 0.04
  assert first.path_reason["local"]["feedback"] == {"size_class": 7, "ttft_s": 0.0}
  assert second.path_reason["local"]["ttft_s"] == 0.1
  assert second.path_reason["local"]["feedback"] == {"size_class": 7, "ttft_s": 0.06}
  # TTFT headroom (9 - 0.1) / 10 = 0.89; TPOT binds: the first's token intervals on decode-0
  # measured the fake's 10 ms decode step (0.009 - 0.01) / 0.01
  assert second.path_reason["local"]["headroom"] == -0.1
  assert second.path_reason["remote"]["feedback"] == {"size_class": 7, "ttft_s": 0.0}
  # off: the model's own prediction, no feedback field
  first, second = _run(feedback=0)
  assert second.path_reason["local"] == {"ttft_s": 0.04, "tpot_s": 0.01, "cost_s": 0.04,
                                         "headroom": -0.1}


def test_a_recovered_request_teaches_nothing():
  policy = policy_lib.PATHS["slo_headroom"](latency_feedback=4)
  req = _req(0, 8, 3)
  req.path, req.token_times = "colocated", [0.5]
  req.path_reason = {"local": {"ttft_s": 0.04, "feedback": {"size_class": 7, "ttft_s": 0.0}}}
  req.fallbacks = ["recompute"]
  policy.observe_first_token(req)
  assert policy.feedback.correction_s("local", 7) == 0.0
  req.fallbacks = []
  policy.observe_first_token(req)
  assert policy.feedback.correction_s("local", 7) == pytest.approx(0.46)


def test_instances_sharing_the_host_wait_for_each_others_steps_in_flight():
  """decode-0 is idle; prefill-1, on the same cores, has a step in flight until 0.3 s (known
  end): decode-0's prefill of 0.04 s is predicted at 0.34 s when they share the host, 0.04 s
  when each has its own devices."""
  def worker(name, shares, in_flight=()):
    q = types.SimpleNamespace(name=name, waiting=[], steps_in_flight=lambda: list(in_flight))
    q.instance = types.SimpleNamespace(cost=Cost(), shares_host=shares)
    return Views().instance(q)     # (policies read instances through the policy API's views)
  step = types.SimpleNamespace(pending=types.SimpleNamespace(end_s=0.3))
  for shares, expected in ((True, 0.34), (False, 0.04)):
    dw, busy = worker("decode-0", shares), worker("prefill-1", shares, [step])
    wait = latency_model.host_wait_s(dw, [busy, dw], 0.0)
    assert wait == pytest.approx(expected - 0.04)
    assert latency_model.modelled_prefill_s(Cost(), dw, 8, 16, 0.0, wait) == pytest.approx(
        expected)


def test_the_config_key_auto_is_on_for_the_engine_off_for_the_simulator():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  assert cfg.scheduler.latency_feedback == -1
  assert config_lib.latency_feedback(cfg) == 16
  cfg.backend = "sim"
  assert config_lib.latency_feedback(cfg) == 0
  cfg.scheduler.latency_feedback = 8
  assert config_lib.latency_feedback(cfg) == 8
  cfg.scheduler.latency_feedback = -2
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == "scheduler.latency_feedback=-2 must be >= 0 (requests), or -1 (auto)"
