"""An arrival ends the driver's wait for the steps in flight: a request that arrives while one
instance computes starts at once on an idle one, not when the busy instance's step ends (the
wait woke only for steps, events and leases, so every run queued such arrivals behind a step
they did not need: the simulator's TTFTs and the engine's alike, and a wall-clock run could
meet an event, e.g. a tenant flush, before an arrival it should have met after)."""

import random
import threading
import time

from pdjax import config as config_lib
from pdjax.runner.execute import execute
from pdjax.scheduler.clock import WallClock
from pdjax.scheduler.driver import Driver

from helpers import sim_snapshots
from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req
from helpers.host_tier_trace import write_trace


def test_the_simulator_starts_an_arrival_on_the_idle_instance_at_its_arrival(tmp_path):
  """r0 (120 tokens) prefills on colocated-0 from 0 s; r1 (8 tokens) arrives 0.1 ms later,
  before r0's step ends, and colocated-1 is idle: r1's prefill starts at its arrival."""
  rng = random.Random(0)
  path = tmp_path / "two.jsonl"
  write_trace(path, [
      {"arrival_s": 0.0, "prompt_ids": [rng.randrange(3, 500) for _ in range(120)],
       "output_len": 1},
      {"arrival_s": 0.0001, "prompt_ids": [rng.randrange(3, 500) for _ in range(8)],
       "output_len": 1}])
  cfg = sim_snapshots._config({
      "mode": "colocated", "workload.kind": "jsonl", "workload.path": str(path),
      "workload.num_requests": 2, "cluster.colocated.instances": 2,
      "scheduler.prefill_router": "round_robin", "scheduler.decode_router": "round_robin"})
  _, result, _ = execute(cfg, config_lib.validate(cfg), "colocated", None, quiet=True)
  r0, r1 = result.requests
  assert (r0.prefill_instance, r1.prefill_instance) == ("colocated-0", "colocated-1")
  assert r0.prefill_end_s > r1.arrival_s            # (r0's step was still computing)
  assert r1.prefill_start_s == r1.arrival_s == 0.0001


HELD_S = 10.0


class _HeldPending:
  """A step that completes only once `release` is set (or after HELD_S, so that a driver that
  never releases it still ends, in the wrong order for the test to see)."""

  def __init__(self, release: threading.Event, tokens):
    self.release, self.tokens, self.t0 = release, tokens, time.monotonic()

  def ready(self):
    return self.release.is_set() or time.monotonic() - self.t0 > HELD_S

  def result(self):
    self.release.wait(HELD_S)
    return self.tokens


class _WallClock(WallClock):
  def advance(self, dt):   # (the fakes' steps advance a manual clock; wall time runs alone)
    pass


class _FirstStepHeld(FakeInstance):
  """The run's first prefill (on whichever instance the router picks) is done only when
  another instance has been given a prefill."""

  def __init__(self, name, clock, shared: dict):
    super().__init__(name, clock)
    self.shared = shared

  def prefill(self, seqs):
    if self.shared.setdefault("held_by", self.name) == self.name and not self.calls:
      self.calls.append(("prefill", [len(s[0]) for s in seqs]))
      return _HeldPending(self.shared["release"], [100 + s[1] + len(s[0]) for s in seqs])
    self.shared["release"].set()
    return super().prefill(seqs)


def test_on_the_wall_clock_an_arrival_does_not_wait_for_another_instances_step():
  """r0's step ends only after the other instance has started r1 (arriving at 0.05 s), so the
  order is the driver's, not the machine's speed: r1 starts before r0's step ends."""
  clock, shared = _WallClock(), {"release": threading.Event()}
  insts = [_FirstStepHeld(f"colocated-{i}", clock, shared) for i in range(2)]
  driver = Driver("colocated", [InstanceQueue(i, "colocated") for i in insts], options=OPTS,
                  clock=clock)
  r0, r1 = driver.run([_req(0, 4, 1, arrival=0.0), _req(1, 4, 1, arrival=0.05)]).requests
  assert r0.prefill_instance != r1.prefill_instance
  assert r1.prefill_start_s < r0.prefill_end_s < HELD_S
  assert (r0.output_ids, r1.output_ids) == ([104], [104])
