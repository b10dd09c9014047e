"""The driver's running counters (scheduler/tally.py), which /metrics exposes: counted when
they happen, so a counter never decreases (issue 25: the prefix-hit counter, derived from the
requests, dropped when a request prefilled with hits was recomputed after its instance died)."""

import dataclasses
import types

from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.request import Status
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.server.prometheus import engine_state

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req


def test_prefix_hits_stay_counted_on_an_instance_that_died():
  clock = ManualClock()
  insts = [FakeInstance(f"colocated-{i}", clock) for i in range(2)]
  for inst in insts:
    inst.tables.enable_prefix_cache()
  policies = policy_lib.build(dict(prefill_router="round_robin", decode_router="round_robin",
                                   path="always_colocated", admission="none",
                                   colocated_policy="prefill_first", role_switch="none"),
                              dict(token_budget=16, max_prefill_seqs=4))
  # r0 leaves its 12-token prompt (3 pages) in colocated-0's cache; r_other goes to
  # colocated-1; r1 (r0's prompt + 24 tokens) hits those 12 tokens on colocated-0 at 0.2 and
  # prefills its first 16-token chunk there (to 0.3); colocated-0 dies at 0.25, before r1's
  # first token: r1 is recomputed on colocated-1 with no hit.
  r0, other, r1 = _req(0, 12, 1), _req(9, 4, 1), _req(1, 36, 2, arrival=0.2)
  other.prompt_ids = [5] * 4
  r1.prompt_ids = [7] * 12 + [8] * 24
  driver = Driver("colocated", [InstanceQueue(inst, "colocated") for inst in insts],
                  options=dataclasses.replace(OPTS, max_model_len=64), clock=clock,
                  policies=policies,
                  injector=FaultInjector(FaultSpec(kills=(("colocated-0", 0.25),))))
  result = driver.run([r0, other, r1])
  assert [r.status for r in result.requests] == [Status.FINISHED] * 3
  assert insts[0].calls == [("prefill", [12]), ("prefill", [16])]
  assert (r1.cached_tokens, r1.fallbacks) == (0, ["instance_died:rerouted"])
  assert insts[1].calls == [("prefill", [4]), ("prefill", [16]), ("prefill", [16]),
                            ("prefill", [4]), ("decode", [36])]   # r1 recomputed whole
  state = engine_state(types.SimpleNamespace(workers=driver.workers, transfers=[],
                                             preemptions=0, role_switches=[],
                                             tally=result.tally))
  assert [(i.name, i.prefix_queries, i.prefix_hits) for i in state.instances] == [
      ("colocated-0", 48, 12), ("colocated-1", 40, 0)]
  assert state.fallbacks == {"instance_died:rerouted": 1}
