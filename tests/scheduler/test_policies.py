"""Each scheduling policy against fake instances with hand-checkable costs (no model, no jax)."""

import pytest

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req, ok_transfer
from pdjax.request import Status
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.scheduler.policies.base import PathChoice
from pdjax.scheduler.policy_api import Views, step_end_s
from pdjax.scheduler.policy_guard import GuardedPath, GuardedRouter, GuardedStep

DEFAULT_NAMES = dict(prefill_router="least_loaded", decode_router="least_loaded",
                     path="always_disagg", admission="none", colocated_policy="prefill_first",
                     role_switch="none")


def _policies(**names_and_params):
  names = {k: names_and_params.pop(k, v) for k, v in DEFAULT_NAMES.items()}
  params = {"token_budget": 16, "max_prefill_seqs": 4, **names_and_params}
  return policy_lib.build(names, params, seed=0)


def _workers(n, role="colocated", clock=None, **kw):
  clock = clock or ManualClock()
  return [InstanceQueue(FakeInstance(f"{role}-{i}", clock, **kw), role) for i in range(n)]


class TestRouters:

  def test_round_robin_cycles_over_names(self):
    ws = _workers(3)
    router = policy_lib.ROUTERS["round_robin"]()
    assert [router.choose(_req(i, 4, 1), ws).name for i in range(4)] == [
        "colocated-0", "colocated-1", "colocated-2", "colocated-0"]

  def test_random_is_seeded(self):
    ws = _workers(4)
    a = [policy_lib.ROUTERS["random"](seed=7) for _ in range(2)]
    seq0 = [a[0].choose(_req(i, 4, 1), ws).name for i in range(10)]
    seq1 = [a[1].choose(_req(i, 4, 1), ws).name for i in range(10)]
    assert seq0 == seq1 and len(set(seq0)) > 1

  def test_least_loaded_counts_queued_tokens(self):
    ws = _workers(3)
    ws[0].waiting.extend([_req(0, 10, 1)])
    ws[1].waiting.extend([_req(1, 3, 1), _req(2, 3, 1)])   # 6 tokens, two requests
    ws[2].waiting.extend([_req(3, 8, 1)])
    assert policy_lib.ROUTERS["least_loaded"]().choose(_req(9, 4, 1), ws).name == "colocated-1"

  def test_power_of_two_keeps_the_less_loaded_of_its_sample(self):
    ws = _workers(2)
    ws[0].waiting.append(_req(0, 9, 1))
    assert policy_lib.ROUTERS["power_of_two"]().choose(_req(1, 4, 1), ws).name == "colocated-1"

  def test_kv_aware_avoids_the_falsely_idle_instance(self):
    # decode-0 has no queue but its pool is nearly full of long sessions; decode-1 is busier
    # by queue but has KV room. least_loaded picks decode-0, kv_aware picks decode-1.
    ws = _workers(2, role="decode", num_pages=10)
    ws[0].tables.allocate("long-a", 4 * 4)
    ws[0].tables.allocate("long-b", 4 * 4)
    ws[0].running.extend([_req(10, 16, 4), _req(11, 16, 4)])
    ws[1].waiting.append(_req(12, 5, 1))
    new = _req(13, 4, 4)
    assert policy_lib.ROUTERS["least_loaded"]().choose(new, ws).name == "decode-0"
    assert policy_lib.ROUTERS["kv_aware"]().choose(new, ws).name == "decode-1"

  def test_session_sticky_returns_home_while_eligible(self):
    ws = _workers(3)
    router = policy_lib.ROUTERS["session_sticky"]()
    ws[0].waiting.append(_req(0, 20, 1))   # make 0 the most loaded
    first = router.choose(_req(1, 4, 1, session="s"), ws)
    assert first.name == "colocated-1"
    first.waiting.append(_req(2, 50, 1))    # now the most loaded: still home for session s
    assert router.choose(_req(3, 4, 1, session="s"), ws).name == "colocated-1"
    assert router.choose(_req(4, 4, 1, session="t"), ws).name == "colocated-2"
    # Home not eligible (not among candidates): falls back and re-homes the session.
    assert router.choose(_req(5, 4, 1, session="s"), [ws[2]]).name == "colocated-2"
    assert router.choose(_req(6, 4, 1, session="s"), ws).name == "colocated-2"

  @pytest.mark.parametrize("name", ["least_loaded", "kv_aware", "kv_aware_prefix",
                                    "power_of_two", "session_sticky"])
  def test_ties_rotate_over_equally_loaded_instances_seeded(self, name):
    """Equally loaded candidates take turns (they went to the first one every time), from a
    position drawn from the seed: 12 choices over 4 idle instances, 3 each, the same sequence
    for the same seed; power_of_two rotates only where it has nothing to sample (2 or fewer)."""
    ws = _workers(4 if name != "power_of_two" else 2)
    names = lambda router, n: [GuardedRouter(router, Views(), "decode_router").choose(
        _req(i, 4, 1), ws).name[-1] for i in range(n)]
    seed0 = names(policy_lib.ROUTERS[name](seed=0), 12)
    if name == "power_of_two":
      assert seed0 == list("01" * 6)   # seed 0 starts at 50494 % 2
      return
    assert seed0 == list("2301" * 3)   # seed 0 starts at 50494 % 4 = 2, seed 1 at 17611 % 4
    assert names(policy_lib.ROUTERS[name](seed=0), 12) == seed0
    assert names(policy_lib.ROUTERS[name](seed=1), 12) == list("3012" * 3)
    # A busy instance leaves the rotation; the others keep taking turns past it.
    ws[2].waiting.append(_req(9, 8, 1))
    ws[2].running.append(_req(10, 8, 1))   # (kv_aware ranks running before queued tokens)
    assert names(policy_lib.ROUTERS[name](seed=0), 6) == list("301" * 2)


class TestPaths:

  def test_length_hybrid_threshold(self):
    p = policy_lib.PATHS["length_hybrid"](length_threshold=8)
    assert p.choose(_req(0, 7, 1), [], []) == PathChoice("colocated", "decode")
    assert p.choose(_req(1, 8, 1), [], []) == PathChoice("disaggregated", "prefill")

  def test_load_hybrid_falls_back_when_decode_tier_is_saturated(self):
    decode = _workers(1, role="decode")
    p = policy_lib.PATHS["load_hybrid"](saturation=0.5)
    assert p.choose(_req(0, 4, 1), [], decode).path == "disaggregated"
    decode[0].running.extend([_req(1, 4, 1), _req(2, 4, 1)])    # 2 of max_batch 4 = 0.5
    assert p.choose(_req(3, 4, 1), [], decode) == PathChoice("colocated", "prefill")

  def test_length_hybrid_end_to_end_short_prompts_skip_transfer(self):
    clock = ManualClock()
    p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
    driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                    options=OPTS,
                    clock=clock, transfer_fn=ok_transfer,
                    policies=_policies(path="length_hybrid", length_threshold=8))
    short, long_ = driver.run([_req(0, 4, 3), _req(1, 12, 3)]).requests
    assert (short.path, short.prefill_instance, short.decode_instance) == (
        "colocated", "decode-0", "decode-0")
    assert (long_.path, long_.prefill_instance, long_.decode_instance) == (
        "disaggregated", "prefill-0", "decode-0")
    assert short.output_ids == [104, 105, 106] and long_.output_ids == [112, 113, 114]
    assert len(driver.transfers) == 1


class _Signals:
  """A worker as the latency model reads it: hand-set rates, queue and cache (page size 4)."""

  def __init__(self, name, tp=1, queued=0, running=0, cached_pages=0, prefill_tok_s=None,
               decode_step_s=None, transfer_s_per_page=None, running_new_tokens=101):
    import types
    self.name, self.tp, self._queued, self._cached = name, tp, queued, cached_pages
    self.running = [_req(100 + i, 8, running_new_tokens) for i in range(running)]
    self.reserved = {}
    self.prefill_tok_s, self.prefill_drain_tok_s = prefill_tok_s, None
    self.decode_step_s, self.transfer_s_per_page = decode_step_s, transfer_s_per_page
    self.token_interval_s = None
    self.tables = types.SimpleNamespace(page_size=4)
    self.instance = types.SimpleNamespace(cost=None, shares_host=False)
    self.waiting, self.in_flight = [], []

  def queued_tokens(self):
    return self._queued

  def num_running(self):
    return len(self.running)

  def prefix_credit(self, names, salt):
    return self._cached

  def steps_in_flight(self):
    return self.in_flight


class TestSloHeadroom:
  """Prompt 100 tokens, 11 new (the transfer spreads over 10), SLOs TTFT 1 s, TPOT 0.1 s, a
  token budget of 16; the prefill pick prefills 200 tok/s; the decode pick steps in 50 ms
  with 2 running (101 new tokens each: a local prefill's 0.5 s stall adds 0.005 s to their
  token interval) and lands a page in 10 ms (25 pages: 0.25 s)."""

  SLO = dict(slo_ttft_s=1.0, slo_tpot_s=0.1, token_budget=16)

  def _choose(self, pw, dw):
    policy = GuardedPath(policy_lib.PATHS["slo_headroom"](**self.SLO), Views())
    return policy.choose(_req(0, 100, 11), [pw], [dw], (pw, dw))

  def _decode(self, **kw):
    return _Signals("decode-0", running=2, decode_step_s=0.05, transfer_s_per_page=0.01, **kw)

  def test_local_wins_when_the_prefill_queue_eats_the_ttft(self):
    # remote: TTFT (100 queued + 100) / 200 = 1.0 -> (0.9 - 1.0) / 1 = -0.1; TPOT 0.05 +
    # 0.25 / 10 = 0.075 -> 0.15. local: TTFT 100 / 200 (borrowed) + 7 steps x 0.05 = 0.85 ->
    # 0.05; TPOT 0.05 -> 0.4, the running batch's 0.055 -> 0.35. Headrooms -0.1 vs 0.05: local.
    choice = self._choose(_Signals("prefill-0", queued=100, prefill_tok_s=200.0), self._decode())
    assert choice == PathChoice("colocated", "decode")
    assert choice.reason == {
        "policy": "slo_headroom", "choice": "colocated", "why": "larger headroom",
        "prefill_instance": "prefill-0", "decode_instance": "decode-0",
        "remote": {"ttft_s": 1.0, "tpot_s": 0.075, "cost_s": 0.75, "headroom": -0.1},
        "local": {"ttft_s": 0.85, "tpot_s": 0.05, "cost_s": 1.5, "headroom": 0.05,
                  "batch_tpot_s": 0.055}}

  @pytest.mark.parametrize("new_tokens,path,batch_tpot,local_headroom", [
      (101, "colocated", 0.055, 0.05), (11, "disaggregated", 0.1, -0.1)])
  def test_a_local_prefill_is_judged_by_the_batch_it_stalls(self, new_tokens, path,
                                                           batch_tpot, local_headroom):
    # remote: TTFT (80 + 100) / 200 = 0.9 -> 0.0 headroom (TPOT 0.075 -> 0.15). local: TTFT
    # 0.85 -> 0.05, its own TPOT 0.05 -> 0.4; its 0.5 s prefill stalls the two running
    # requests: 0.05 + 0.5 / 100 = 0.055 (-> 0.35: local) or 0.05 + 0.5 / 10 = 0.1 with
    # 11-token answers (-> -0.1, below remote's 0.0: remote).
    choice = self._choose(_Signals("prefill-0", queued=80, prefill_tok_s=200.0),
                          self._decode(running_new_tokens=new_tokens))
    assert (choice.path, choice.reason["why"]) == (path, "larger headroom")
    assert choice.reason["remote"]["headroom"] == 0.0
    assert choice.reason["local"] == {"ttft_s": 0.85, "tpot_s": 0.05, "cost_s": 1.5,
                                      "headroom": local_headroom, "batch_tpot_s": batch_tpot}

  def test_remote_wins_with_an_idle_prefill_instance(self):
    # remote: TTFT 0.5 -> 0.4, TPOT 0.075 -> 0.15: 0.15 > local's 0.05
    choice = self._choose(_Signals("prefill-0", prefill_tok_s=200.0), self._decode())
    assert choice == PathChoice("disaggregated", "prefill")
    assert choice.reason["remote"]["headroom"] == 0.15 and choice.reason["why"] == (
        "larger headroom")

  def test_neither_meets_the_slo_the_cheaper_is_taken(self):
    # local: 300 more queued on decode-0: (400 / 200) + 25 x 0.05 = 3.25 -> -2.35; remote -0.1:
    # both negative; cost remote 100 / 200 + 0.25 = 0.75 < local 0.5 x (1 + 2) = 1.5
    choice = self._choose(_Signals("prefill-0", queued=100, prefill_tok_s=200.0),
                          self._decode(queued=300))
    assert choice == PathChoice("disaggregated", "prefill")
    assert choice.reason["why"] == "neither meets the SLOs: cheaper"
    assert choice.reason["local"] == {"ttft_s": 3.25, "tpot_s": 0.05, "cost_s": 1.5,
                                      "headroom": -2.35, "batch_tpot_s": 0.055}

  def test_a_cached_prefix_on_the_decode_pick_shortens_local_and_the_transfer(self):
    # 20 of 25 pages cached on decode-0: local computes 20 tokens (0.1 s + 2 steps x 0.05 =
    # 0.2 -> 0.7 headroom on TTFT; TPOT 0.05 -> 0.4, the batch's 0.05 + 0.1 / 100 -> 0.39), the
    # transfer moves 5 pages (0.05 s)
    choice = self._choose(_Signals("prefill-0", prefill_tok_s=200.0),
                          self._decode(cached_pages=20))
    assert choice.reason["local"] == {"ttft_s": 0.2, "tpot_s": 0.05, "cost_s": 0.3,
                                      "headroom": 0.39, "batch_tpot_s": 0.051}
    assert choice.reason["remote"]["tpot_s"] == 0.055 and choice.path == "colocated"

  def test_unmeasured_rates_go_disaggregated(self):
    choice = self._choose(_Signals("prefill-0"), _Signals("decode-0"))
    assert choice == PathChoice("disaggregated", "prefill")
    assert choice.reason["why"] == "unmeasured: remote, local"
    assert choice.reason["remote"] is None and choice.reason["local"] is None

  def test_a_cost_model_on_the_instances_predicts_step_by_step(self):
    """Instances that carry a cost model (simulated ones): prefill steps of at most 16 tokens
    cost 0.01 + 0.001 per token, a decode step 0.02 + 0.0001 per context token, a page 1,000
    bytes over a 1 MB/s link. prefill-0 has a 20-token prompt waiting: 20 + 100 tokens are 8
    steps (7 of 16, one of 8): 0.08 + 0.12 = 0.2 s; decode-0 runs two 50-token contexts and
    has a step in flight until 0.03 s (the request arrives at 0)."""
    import types

    class Cost:
      prefill_s = staticmethod(lambda chunks: 0.01 + 0.001 * sum(q for q, _ in chunks))
      decode_s = staticmethod(lambda contexts: 0.02 + 0.0001 * sum(contexts))
      transfer_s = staticmethod(lambda num_bytes: num_bytes / 1e6)
      moved_pages = staticmethod(lambda pages: pages)

    inst = types.SimpleNamespace(cost=Cost(), kv_bytes=lambda pages: pages * 1000)
    pw, dw = _Signals("prefill-0"), _Signals("decode-0")
    pw.instance, dw.instance = inst, inst
    pw.waiting, dw.waiting = [_req(9, 20, 1)], []
    dw.in_flight = [types.SimpleNamespace(pending=types.SimpleNamespace(end_s=0.03))]
    dw.running = [_req(7, 49, 111), _req(8, 49, 111)]
    for r in dw.running:
      r.output_ids = [5]                                   # contexts 50 each
    choice = self._choose(pw, dw)
    # remote: TTFT 0.2; TPOT 0.02 + 0.0001 x 200 = 0.04, + 25 pages' 0.025 s / 10 = 0.0425;
    # cost 0.01 + 0.1 + 0.025. local: TTFT 0.03 in flight + 7 steps of 16 (0.07 + 0.1) = 0.2
    # (none waiting there), TPOT 0.04; cost 0.11 x (1 + 2 running); its 0.11 s prefill
    # stalls the running two (111 new tokens each): 0.04 + 0.11 / 110 = 0.041 -> 0.49
    assert choice.reason["remote"] == {"ttft_s": 0.2, "tpot_s": 0.0425, "cost_s": 0.135,
                                       "headroom": 0.475}
    assert choice.reason["local"] == {"ttft_s": 0.2, "tpot_s": 0.04, "cost_s": 0.33,
                                      "headroom": 0.49, "batch_tpot_s": 0.041}
    assert choice == PathChoice("colocated", "decode")

  def test_a_real_steps_end_in_flight_comes_from_the_cost_model(self):
    """On the engine a step in flight has no known end: its start plus the model's seconds
    for its plan. decode-0 started a 16-token prefill chunk of a 49-token prompt at -0.01 s
    with one decode row (context 50) riding along: prefill_s of 17 tokens = 0.027 s, so it
    ends at 0.017 and the local prefill (7 steps of 16: 0.17 s) is predicted at 0.187 s; a
    decode step started at 0 ends at 0.02 + 0.0001 x 50 = 0.025."""
    import types
    from pdjax.scheduler.instance_queue import Step
    from pdjax.scheduler.policies import latency_model
    from pdjax.scheduler.policies.base import StepPlan

    class Cost:
      prefill_s = staticmethod(lambda chunks: 0.01 + 0.001 * sum(q for q, _ in chunks))
      decode_s = staticmethod(lambda contexts: 0.02 + 0.0001 * sum(contexts))

    running = _req(8, 49, 2)
    running.output_ids = [5]                                       # context 50
    step = Step(StepPlan(chunks=[(_req(7, 49, 2), 0, 16)], decodes=[running]), object(),
                -0.01, "mixed")
    assert step_end_s(Cost(), step) == pytest.approx(0.017)
    decode = Step(StepPlan(decodes=[running]), object(), 0.0, "decode")
    assert step_end_s(Cost(), decode) == pytest.approx(0.025)
    dw = _Signals("decode-0")
    dw.waiting, dw.in_flight = [], [step]
    dw.instance = types.SimpleNamespace(cost=Cost(), shares_host=False)
    assert latency_model.modelled_prefill_s(Cost(), Views().instance(dw), 100, 16,
                                            0.0) == pytest.approx(0.187)

  def test_finished_requests_token_intervals_stretch_the_predicted_tpot(self):
    """decode-0's finished requests measured token intervals (from their second token on:
    (1.3 - 1.0) / 2 = 0.15, then (0.6 - 0.5) / 1 = 0.1: EWMA 0.7 x 0.15 + 0.3 x 0.1 = 0.135)
    longer than its 50 ms decode step: both candidates' TPOT use the interval."""
    w = _workers(1, role="decode")[0]
    for times in ([0.0, 1.0, 1.1, 1.3], [0.0, 0.5, 0.6], [0.0, 0.2]):   # (the last: too short)
      r = _req(0, 4, 4)
      r.token_times = times
      w.measure_intervals(r)
    assert abs(w.token_interval_s - 0.135) < 1e-12
    dw = self._decode()
    dw.token_interval_s = 0.135
    choice = self._choose(_Signals("prefill-0", prefill_tok_s=200.0), dw)
    assert choice.reason["local"]["tpot_s"] == 0.135
    assert choice.reason["remote"]["tpot_s"] == 0.16          # 0.135 + 0.25 s / 10

  def test_the_predictors_are_the_admissions(self):
    """predicted_slo and slo_headroom read one latency model: the same TTFT for the same
    worker and tokens."""
    from pdjax.scheduler.policies import latency_model, predicted_slo, slo_headroom
    assert predicted_slo.predicted_ttft_s is latency_model.predicted_ttft_s
    assert slo_headroom.predict_remote is latency_model.predict_remote
    pw = _Signals("prefill-0", queued=100, prefill_tok_s=200.0)
    assert latency_model.predicted_ttft_s(pw, 100) == self._choose(
        pw, self._decode()).reason["remote"]["ttft_s"]


class TestAdmission:

  def test_queue_bound_rejects_exactly_past_the_bound(self):
    clock = ManualClock()
    driver = Driver("colocated", _workers(1, clock=clock), options=OPTS, clock=clock,
                    policies=_policies(admission="queue_bound", max_queue=2))
    reqs = driver.run([_req(i, 4, 1) for i in range(3)]).requests
    assert [r.status for r in reqs] == [Status.FINISHED, Status.FINISHED, Status.REJECTED]
    assert reqs[2].reason == "queue full: colocated-0 has 2 waiting (scheduler.max_queue=2)"

  def test_predicted_slo_uses_measured_throughput(self):
    w = _workers(1)[0]
    policy = policy_lib.ADMISSIONS["predicted_slo"](slo_ttft_s=1.0, slo_tpot_s=0.05)
    disagg = PathChoice("disaggregated", "prefill")
    assert policy.check(_req(0, 100, 1), w, disagg, []) is None      # nothing measured yet
    w.prefill_tok_s = 100.0
    w.waiting.append(_req(1, 60, 1))
    assert policy.check(_req(2, 40, 1), w, disagg, []) is None        # (60 + 40) / 100 = 1.0
    assert policy.check(_req(3, 41, 1), w, disagg, []) == (
        "predicted TTFT 1.01 s > slo.ttft_s 1.00 s")
    d = _workers(1, role="decode")[0]
    d.decode_step_s = 0.06
    assert policy.check(_req(4, 1, 1), w, disagg, [d]) == (
        "predicted TPOT 0.060 s > slo.tpot_s 0.050 s")


  def test_drain_rate_counts_the_time_between_prefill_steps(self):
    """Two prefill steps of 100 tokens with a 1 s decode step between them, the queue never
    empty: per-step throughput says 100 tok/s, the drain rate 100 / 2 s after the second."""
    from pdjax.scheduler.policies.base import StepPlan
    from pdjax.scheduler.instance_queue import Step
    w = _workers(1)[0]
    a, b, c = _req(0, 100, 1), _req(1, 100, 1), _req(2, 100, 1)
    w.waiting.extend([a, b, c])
    w.measure(Step(StepPlan(chunks=[(a, 0, 100)]), None, 0.0, "prefill"), 1.0)
    w.waiting.remove(a)
    assert (w.prefill_tok_s, w.prefill_drain_tok_s) == (100.0, 100.0)
    w.measure(Step(StepPlan(decodes=[a]), None, 1.0, "decode"), 2.0)
    w.measure(Step(StepPlan(chunks=[(b, 0, 100)]), None, 2.0, "prefill"), 3.0)
    w.waiting.remove(b)
    assert w.prefill_tok_s == 100.0
    assert w.prefill_drain_tok_s == pytest.approx(0.3 * 50.0 + 0.7 * 100.0)   # EWMA, new 0.3
    w.measure(Step(StepPlan(chunks=[(c, 0, 100)]), None, 10.0, "prefill"), 11.0)
    w.waiting.remove(c)
    assert w._drain_from is None   # queue empty: the next backlog starts its own clock


class TestColocatedPolicies:

  def test_chunked_prefill_never_exceeds_budget_and_does_not_stall_decodes(self):
    clock = ManualClock()
    inst = FakeInstance("colocated-0", clock, num_pages=64)
    driver = Driver("colocated", [InstanceQueue(inst, "colocated", max_batch=8)], options=OPTS,
                    clock=clock, policies=_policies(colocated_policy="chunked_prefill",
                                                    chunk_budget=6, max_prefill_seqs=9))
    reqs = [_req(0, 5, 6), _req(1, 14, 3, arrival=0.105), _req(2, 3, 2, arrival=0.105)]
    result = driver.run(reqs)
    assert all(r.status == Status.FINISHED for r in reqs)
    assert max(s["num_tokens"] for s in result.steps) <= 6
    # r1's 14-token prompt is spread over steps that also carry r0's decode rows.
    mixed = [s for s in result.steps if s["kind"] == "mixed"]
    assert len(mixed) >= 2
    assert [r.output_ids for r in reqs] == [[105, 106, 107, 108, 109, 110], [114, 115, 116],
                                            [103, 104]]
    assert inst.tables.num_used_pages == 0

  def test_prefill_first_runs_whole_prompts_before_decodes(self):
    clock = ManualClock()
    inst = FakeInstance("colocated-0", clock)
    driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock,
                    policies=_policies())
    driver.run([_req(0, 4, 3), _req(1, 6, 2, arrival=0.105)])
    assert inst.calls == [("prefill", [4]), ("decode", [4]), ("prefill", [6]),
                          ("decode", [5, 6]), ]


def test_role_switching_moves_an_idle_prefill_instance_and_keeps_every_request():
  clock = ManualClock()
  ps = [InstanceQueue(FakeInstance(f"prefill-{i}", clock), "prefill") for i in range(2)]
  ds = [InstanceQueue(FakeInstance("decode-0", clock, num_pages=6), "decode", max_batch=1)]
  driver = Driver("disaggregated", ps + ds, options=OPTS, clock=clock,
                  transfer_fn=ok_transfer,
                  policies=_policies(role_switch="queue_balance", interval_s=0.0))
  reqs = [_req(i, 4, 6) for i in range(4)]
  result = driver.run(reqs)
  assert [r.status for r in reqs] == [Status.FINISHED] * 4
  assert all(r.output_ids == list(range(104, 110)) for r in reqs)
  assert result.role_switches and result.role_switches[0]["to"] == "decode"
  assert {r.decode_instance for r in reqs} >= {"decode-0", result.role_switches[0]["instance"]}
  assert all(w.tables.num_used_pages == 0 for w in ps + ds)


def test_unknown_policy_name_is_one_line():
  with pytest.raises(ValueError) as e:
    _policies(prefill_router="fastest")
  assert str(e.value) == ("scheduler.prefill_router='fastest' is not one of ['kv_aware', "
                          "'kv_aware_prefix', 'least_loaded', 'power_of_two', 'random', "
                          "'round_robin', 'session_sticky', 'weighted'] (or a module:Attr "
                          "import path)")


def test_predicted_slo_headroom_admits_within_a_fraction_of_the_slo():
  w = _workers(1)[0]
  policy = policy_lib.ADMISSIONS["predicted_slo"](slo_ttft_s=1.0, slo_tpot_s=0.05, headroom=0.8)
  w.prefill_tok_s = 100.0
  disagg = PathChoice("disaggregated", "prefill")
  assert policy.check(_req(0, 80, 1), w, disagg, []) is None           # 0.80 s
  assert policy.check(_req(1, 81, 1), w, disagg, []) == (
      "predicted TTFT 0.81 s > 0.8 x slo.ttft_s 0.80 s")


class TestLocalChunked:
  """scheduler.local_prefill=chunked: the prefill tier plans whole prompts, a decode instance
  chunks a kept prompt into its running batch (chunk budget 8, token budget 16)."""

  def _policy(self):
    from pdjax.scheduler.policies.chunked_prefill import ChunkedPrefill
    from pdjax.scheduler.policies.local_chunked import LocalChunked
    from pdjax.scheduler.policies.prefill_first import PrefillFirst
    return GuardedStep(LocalChunked(PrefillFirst(token_budget=16, max_prefill_seqs=4),
                                    ChunkedPrefill(chunk_budget=8, max_prefill_seqs=5)), Views())

  def test_prefill_tier_whole_decode_tier_chunked(self):
    prefill, decode = _workers(1, role="prefill")[0], _workers(1, role="decode")[0]
    running = _req(0, 4, 8)
    decode.running.append(running)
    for w in (prefill, decode):
      w.waiting.append(_req(1, 12, 4))
    whole = self._policy().plan(prefill, admit=lambda r: True)
    assert [(r.id, a, b) for r, a, b in whole.chunks] == [("r1", 0, 12)] and whole.decodes == []
    chunked = self._policy().plan(decode, admit=lambda r: True)
    assert [(r.id, a, b) for r, a, b in chunked.chunks] == [("r1", 0, 7)]
    assert chunked.decodes == [running]


def test_policies_for_builds_local_chunked_from_the_config():
  from pdjax import config as config_lib
  from pdjax.engine import options as options_lib
  from pdjax.runner.build import policies_for
  from pdjax.scheduler.policies.local_chunked import LocalChunked
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.scheduler.path = "slo_headroom"
  opts = options_lib.engine_options(cfg, chunked=True)
  assert not isinstance(policies_for(cfg, "disaggregated", opts).step, LocalChunked)
  cfg.scheduler.local_prefill = "chunked"
  got = policies_for(cfg, "disaggregated", opts)
  assert isinstance(got.step, LocalChunked)
  assert (got.step.whole.max_seqs, got.step.chunked.budget) == (
      cfg.scheduler.max_prefill_seqs, cfg.scheduler.chunk_budget)
  assert got.path.local_budget == cfg.scheduler.chunk_budget
  # colocated runs never take it
  assert not isinstance(policies_for(cfg, "colocated", opts).step, LocalChunked)
