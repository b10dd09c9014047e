"""The policy API (issue 46): policies see read-only views; a write or a read past the API
raises; every built-in policy runs on the simulator through the views alone; the guard rejects
answers the driver cannot use, naming the key and the policy."""

import pytest

from helpers.checked_run import checked_run
from helpers.fake_engine import FakeInstance, InstanceQueue, _req
from pdjax.configs import default
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.policies.base import PathChoice, StepPlan
from pdjax.scheduler.policy_api import Slo, Views
from pdjax.scheduler.policy_guard import (GuardedPath, GuardedRoleSwitch, GuardedRouter,
                                          GuardedStep, PolicyAnswerError)


def _queues(n=2, role="decode"):
  clock = ManualClock()
  return [InstanceQueue(FakeInstance(f"{role}-{i}", clock), role) for i in range(n)]


def test_views_publish_the_state_and_refuse_writes():
  q = _queues(1)[0]
  waiting, running = _req(1, 10, 3), _req(2, 6, 4)
  q.waiting.append(waiting)
  q.running.append(running)
  views = Views(Slo(1.0, 0.1))
  w, r = views.instance(q), views.request(waiting)
  assert (w.name, w.role, w.tp, w.max_batch, w.page_size) == ("decode-0", "decode", 1, 4, 4)
  assert (w.num_waiting(), w.queued_tokens(), w.num_running()) == (1, 10, 1)
  assert [v.id for v in w.waiting] == ["r1"] and [v.id for v in w.running] == ["r2"]
  assert (w.free_pages(), w.total_pages(), w.used_pages(), w.pages_for(9)) == (32, 32, 0, 3)
  assert w.waiting[0] is r and views.instance(q) is w          # one view per object
  assert (r.prompt_len, r.max_len, r.output_len, r.slo) == (10, 13, 0, Slo(1.0, 0.1))
  assert not w.admitted(r) and w.keeps(r)
  with pytest.raises(AttributeError) as e:
    w.max_batch = 64
  assert str(e.value) == ("InstanceView.max_batch is read-only: a policy reads the driver's "
                          "state, it does not change it (pdjax/scheduler/policy_api.py)")
  with pytest.raises(AttributeError) as e:
    r.status = "finished"
  assert str(e.value).startswith("RequestView.status is read-only")
  with pytest.raises(AttributeError) as e:
    w.tables.free("r1")                                        # reaching past the API
  assert str(e.value) == ("InstanceView has no 'tables': a policy reads only what "
                          "pdjax/scheduler/policy_api.py publishes")
  with pytest.raises(AttributeError):
    r.output_ids.append(5)                                     # a tuple: no append
  assert waiting.output_ids == [] and q.max_batch == 4


class _ReachesPast:
  """A router that reads the driver's own page tables."""

  def choose(self, req, candidates):
    return min(candidates, key=lambda w: w.tables.num_free_pages)


def test_a_policy_reaching_past_the_api_fails_the_run():
  cfg = default.get_config("smoke")
  cfg.backend, cfg.mode = "sim", "disaggregated"
  policies = policy_lib.build(dict(prefill_router="least_loaded", decode_router="least_loaded",
                                   path="always_disagg", admission="none",
                                   colocated_policy="prefill_first", role_switch="none"),
                              dict(token_budget=64, max_prefill_seqs=4))
  policies.decode_router = _ReachesPast()
  from pdjax.runner.serve_requests import serve
  from pdjax.runner import build
  from pdjax import config as config_lib
  mode, instances, kwargs = build.build_run(cfg, config_lib.validate(cfg), "disaggregated", None)
  kwargs["policies"] = policies
  requests = [_req(i, 8, 2) for i in range(3)]
  with pytest.raises(AttributeError) as e:
    serve(mode, instances, requests, **kwargs)
  assert str(e.value) == ("InstanceView has no 'tables': a policy reads only what "
                          "pdjax/scheduler/policy_api.py publishes")


BUILT_INS = ([("prefill_router", n) for n in policy_lib.ROUTERS]
             + [("path", n) for n in policy_lib.PATHS]
             + [("admission", n) for n in policy_lib.ADMISSIONS]
             + [("colocated_policy", n) for n in policy_lib.COLOCATED]
             + [("role_switch", n) for n in policy_lib.ROLE_SWITCH])


@pytest.mark.parametrize("key,name", BUILT_INS, ids=[f"{k}={n}" for k, n in BUILT_INS])
def test_every_built_in_runs_through_the_views_alone(key, name):
  """Each built-in, on a simulated run that gives it state to read (a shared prefix cache,
  queues, a tight SLO): a read past the API would raise AttributeError here."""
  cfg = default.get_config("smoke")
  cfg.backend, cfg.progress = "sim", False
  cfg.mode = "colocated" if key == "colocated_policy" else "disaggregated"
  cfg.workload.num_requests, cfg.workload.rate = 24, 60.0
  cfg.workload.preset = "agent_multiturn"           # sessions and shared prefixes
  cfg.kv.prefix_cache = True
  cfg.slo.ttft_s, cfg.slo.tpot_s = 0.05, 0.002
  cfg.scheduler[key] = name
  if key == "prefill_router":
    cfg.scheduler.decode_router = name
  if name == "remesh":
    cfg.scheduler.remesh_schedule = "decode:2x2@0.05"
  if name == "queue_balance":
    cfg.scheduler.role_switch_interval_s = 0.01
  if key == "admission":   # rejections are fine; every request still ends
    from pdjax import config as config_lib
    from pdjax.runner.execute import execute
    _, result, _ = execute(cfg, config_lib.validate(cfg), "disaggregated", None, quiet=True)
    assert {r.status.value for r in result.requests} <= {"finished", "rejected"}
    assert len(result.requests) == 24
    return
  checked_run(cfg, cfg.mode)


def test_the_guard_rejects_answers_the_driver_cannot_use():
  qs = _queues(2)
  req = _req(0, 8, 2)

  class Outside:
    def choose(self, req, candidates):
      return _queues(1)[0]          # an instance it was not shown

  class NoneWithCandidates:
    def choose(self, req, candidates):
      return None

  class BadPath:
    def choose(self, req, prefill_tier, decode_tier):
      return "disaggregated"

  class BadStep:
    def plan(self, worker, admit):
      return StepPlan(decodes=[req])   # the driver's own request, not a view it was shown

  class BadRole:
    def decide(self, now, prefill_tier, decode_tier, transfer_backlog):
      return [(decode_tier[0], "colocated")]

  with pytest.raises(PolicyAnswerError) as e:
    GuardedRouter(Outside(), Views(), "decode_router").choose(req, qs)
  assert str(e.value) == (
      "scheduler.decode_router (test_policy_api:test_the_guard_rejects_answers_the_driver_"
      "cannot_use.<locals>.Outside) answered an object of type InstanceQueue, which is not "
      "one of the instances it was shown ['decode-0', 'decode-1']")
  with pytest.raises(PolicyAnswerError) as e:
    GuardedRouter(NoneWithCandidates(), Views(), "prefill_router").choose(req, qs)
  assert str(e.value).endswith("NoneWithCandidates) chose None among 2 candidates "
                               "['decode-0', 'decode-1'] (None only when there are none)")
  assert GuardedRouter(NoneWithCandidates(), Views(), "prefill_router").choose(req, []) is None
  with pytest.raises(PolicyAnswerError) as e:
    GuardedPath(BadPath(), Views()).choose(req, qs, qs)
  assert str(e.value).endswith("BadPath) returned 'disaggregated': a PathChoice of (path, "
                               "tier) in ['disaggregated/prefill', 'colocated/prefill', "
                               "'colocated/decode'] is expected")
  assert GuardedPath(policy_lib.PATHS["always_disagg"](), Views()).choose(
      req, qs, qs) == PathChoice("disaggregated", "prefill")
  with pytest.raises(PolicyAnswerError) as e:
    GuardedStep(BadStep(), Views()).plan(qs[0], admit=lambda r: True)
  assert str(e.value).endswith("BadStep) planned an object of type Request ('r0'), which is "
                               "not a request it was shown")
  with pytest.raises(PolicyAnswerError) as e:
    GuardedRoleSwitch(BadRole(), Views()).decide(0.0, [], qs, 0)
  assert str(e.value).endswith("BadRole) asked for role 'colocated', not one of "
                               "['prefill', 'decode']")
