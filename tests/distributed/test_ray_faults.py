"""The Ray launcher's fault paths of issue 25, each ending with its requests failed or
recomputed and the run going on, never a crash: a step that fails at dispatch inside an actor
with overlap on (the step dispatched ahead on its tokens is not run), a restart whose new
process fails to start, a KV pull that lands after the driver gave up on it (dropped by its
epoch), and an offer nobody pulls (expires). The actors are InstanceActor with test hooks
(`_test_actor_class`): an armed dispatch failure, a stall of the event loop, a page read."""

import dataclasses
import time

import numpy as np
import pytest
import ray

from conftest import tiny_engine_options
from helpers.ray_fixtures import hf_outputs  # noqa: F401  (fixtures)
from pdjax.runner import serve_requests as serving
from pdjax.distributed import ray_transfer
from pdjax.distributed.launcher import RayCluster
from pdjax.distributed.ray_transfer import RayTransfer
from pdjax.distributed.remote import ray_result
from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.models.llama_config import config_from_hf
from pdjax.request import Request, SamplingParams, Status
from pdjax.errors import DeviceError

pytestmark = pytest.mark.slow

PROMPTS = [[1, 5, 9, 14, 27, 3, 88], [1, 100], [1] + list(range(10, 60)), [1, 7, 7, 7, 9],
           [1] + list(range(30, 47)), [1, 64, 32, 16, 8, 4, 2]]
MAX_NEW = [12, 9, 16, 20, 5, 14]
ARRIVALS = [0.0, 0.0, 0.01, 0.02, 0.05, 0.1]
LAUNCH_FAILED = "JaxRuntimeError: INTERNAL: injected launch failure"


def _requests():
  return [Request(id=f"r{i}", arrival_s=a, prompt_ids=p, eos_ids=(2,),
                  sampling=SamplingParams(max_new_tokens=m))
          for i, (p, m, a) in enumerate(zip(PROMPTS, MAX_NEW, ARRIVALS))]


def _test_actor_class():
  """InstanceActor with test hooks. Defined in a function: Ray pickles it by value (the
  actors' processes cannot import tests/)."""
  import time as time_
  import numpy as np_
  from pdjax.distributed.actor import InstanceActor
  from pdjax.errors import DeviceError as DeviceError_

  class TestActor(InstanceActor):

    def __init__(self, spec):
      super().__init__(spec)
      self.fail_at, self.decodes, self.failed_rows = None, 0, None
      launch = self.inst.decode

      def decode(seqs, prev=None):   # decode number fail_at fails at dispatch, as a launch
        self.decodes += 1            # whose JaxRuntimeError device_errors() wraps
        if self.decodes == self.fail_at:
          self.failed_rows = len(seqs)
          raise DeviceError_(LAUNCH_FAILED)
        return launch(seqs, prev)

      self.inst.decode = decode

    async def arm(self, fail_at):
      self.fail_at, self.decodes, self.failed_rows = fail_at, 0, None

    async def failed_rows_(self):
      return self.failed_rows

    async def stall(self, seconds):   # blocks the event loop, as a long compile does
      time_.sleep(seconds)

    async def read_pages(self, pages):
      return np_.asarray(self.inst.kv)[:, :, :, list(pages)]

    async def count_programs(self):
      """Counts calls of this instance's transfer programs from the first call on."""
      if not hasattr(self, "calls"):
        self.calls = {"gather": 0, "scatter": 0}

        def counted(program, name):
          def call(*args):
            self.calls[name] += 1
            return program(*args)
          return call
        for table, name in ((self.inst._gather, "gather"), (self.inst._scatter, "scatter")):
          for key, entry in list(table.items()):
            table[key] = ((counted(entry[0], name),) + tuple(entry[1:])
                          if isinstance(entry, tuple) else counted(entry, name))
      return dict(self.calls)

  return TestActor


@pytest.fixture(scope="module")
def cluster(compile_cache):
  with RayCluster(accelerator="cpu", pull_timeout_s=2.0, compile_cache_dir=compile_cache) as c:
    actor = ray.remote(_test_actor_class())
    c._new_actor = lambda spec: actor.options(**c.actor_options(spec.tp)).remote(spec)
    yield c


@pytest.fixture(scope="module")
def pair(cluster, hf_llama):
  """prefill-0 and decode-0 (TP1 each), shared by the tests that leave them serving."""
  path, _ = hf_llama
  instances = cluster.build_instances([("prefill", 1, 1), ("decode", 1, 1)],
                                      config_from_hf(path), tiny_engine_options(),
                                      checkpoint=path)
  yield instances
  cluster.release(instances)



def test_a_step_failing_at_dispatch_with_overlap_fails_its_requests_only(cluster, pair,
                                                                         hf_outputs):
  """decode-0's 3rd decode fails at dispatch; with overlap the driver has already dispatched
  the 4th on its tokens. Before the fix that step raised ValueError ('step N takes tokens of
  step N-1, the last dispatched is N-2') out of the run. Now the failed step's requests fail
  with the device error, the step ahead is not run (its requests planned again) and every
  other request finishes with HF's tokens."""
  p0, d0 = pair
  ray.get(d0.actor.arm.remote(3))
  try:
    result = serving.serve("disaggregated", pair, _requests(),
                           transfer_fn=cluster.transfer_fn, overlap=True)
  finally:
    rows = ray.get(d0.actor.failed_rows_.remote())
    ray.get(d0.actor.arm.remote(None))
  failed = [r for r in result.requests if r.status == Status.FAILED]
  assert rows and len(failed) == rows
  assert {r.reason for r in failed} == {f"decode step failed on decode-0: DeviceError: "
                                        f"{LAUNCH_FAILED}"}
  for r, want in zip(result.requests, hf_outputs):
    if r.status == Status.FINISHED:
      assert r.output_ids == want
    else:                    # the tokens it got before the failure are HF's
      assert r.status == Status.FAILED and r.output_ids == want[:len(r.output_ids)]
  assert sum(r.status == Status.FINISHED for r in result.requests) == len(PROMPTS) - rows
  assert result.faults["steps_not_run"] == 1
  assert serving.kv_pages_leaked(pair) == 0


def test_a_restart_whose_new_process_fails_leaves_the_instance_dead(cluster, hf_llama,
                                                                    hf_outputs):
  """colocated-0 is killed at 0 and restarted at 0.05 s; its new process dies starting (it
  is given a spec asking for more devices than it has). Before the fix InstanceLost escaped
  the run; now colocated-0 stays dead and colocated-1 serves everything."""
  from pdjax.distributed.actor import InstanceActor
  path, _ = hf_llama
  instances = cluster.build_instances([("colocated", 2, 1)], config_from_hf(path),
                                      tiny_engine_options(), checkpoint=path)
  c0 = instances[0]
  broken = ray.remote(InstanceActor).options(**cluster.actor_options(1))
  c0._new_actor = lambda spec: broken.remote(dataclasses.replace(spec, tp=4))
  try:
    spec = FaultSpec(kills=(("colocated-0", 0.0),), restart_s=0.05)
    result = serving.serve("colocated", instances, _requests(), injector=FaultInjector(spec))
    assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
    assert [r.output_ids for r in result.requests] == hf_outputs
    assert {r.decode_instance for r in result.requests} == {"colocated-1"}
    f = result.faults
    assert (f["instances_killed"], f["instances_restarted"], f["restarts_failed"]) == (1, 0, 1)
    assert not c0.alive and instances[1].alive
    assert serving.kv_pages_leaked(instances) == 0
  finally:
    cluster.release(instances)


def _prefill(inst, tokens, pages):
  """Writes tokens' KV into pages of inst's pool (a prefill step, as the driver sends)."""
  inst.prefill([(tokens, 0, pages, 0.0, 0, 1.0)]).result()


def test_a_pull_the_driver_gave_up_on_is_dropped_not_landed(pair, monkeypatch):
  """The driver's deadline (2 s + 0.2 s grace from the offer's dispatch, at 0.5 s) passes
  while decode-0's event loop is stalled (3.5 s) and prefill-0's offer waits behind its own
  stall (4.5 s). The driver frees the destination pages and a new request prefills into them
  (its step waits behind the stall, then runs while the pull waits for its pieces). Before
  the fix the late pull then landed (its own deadline runs from its start, at 3.5 s) over the
  new request's KV; now the step names the revoked epoch and the pull is dropped."""
  monkeypatch.setattr(ray_transfer, "DEADLINE_GRACE_S", 0.2)
  p0, d0 = pair
  _prefill(p0, list(range(3, 19)), [1, 2])
  offered_kv = ray.get(p0.actor.read_pages.remote([1, 2]))
  transfer = RayTransfer(timeout_s=2.0)
  ray.get([d0.actor.offer_counts.remote(), p0.actor.offer_counts.remote()])   # both idle
  d0.actor.stall.remote(3.5)
  p0.actor.stall.remote(4.5)
  time.sleep(0.5)                         # both stalls under way
  late = transfer(p0, [1, 2], d0, [5, 6])
  while not late.ready():
    time.sleep(0.01)
  with pytest.raises(DeviceError, match=r"KV pull prefill-0->decode-0 not acknowledged in 2.2 s"):
    late.result()
  _prefill(d0, list(range(40, 56)), [5, 6])   # the pages' new owner
  owner_kv = ray.get(d0.actor.read_pages.remote([5, 6]))
  assert not np.array_equal(owner_kv, offered_kv)
  ray.wait([late.pull], timeout=10.0)
  assert np.array_equal(ray.get(d0.actor.read_pages.remote([5, 6])), owner_kv)
  with pytest.raises(DeviceError, match=r"KV pull from \S+ dropped: the driver gave up on it"):
    ray_result(late.pull, "decode-0")
  # The same pair still moves KV: a pull in time lands.
  assert transfer(p0, [1, 2], d0, [5, 6]).result().bytes == 2 * 4096
  assert np.array_equal(ray.get(d0.actor.read_pages.remote([5, 6])), offered_kv)
  assert d0.revoked() == ()               # the late pull returned: nothing left to send,
  assert ray.get(p0.actor.offer_counts.remote())["held"] == 0   # and its offer is settled


def test_a_transfer_is_one_offer_and_one_pull_with_one_program_each_side(pair):
  """11 pages (pieces 8 + 2 + 1) move with one offer call and one pull call: one gather
  program on the source, one scatter program on the destination (before issue 28: a gather
  and a scatter per piece), exactly 11 pages' bytes, the pages equal the source's."""
  p0, d0 = pair
  src_pages, dst_pages = list(range(12, 23)), list(range(30, 41))
  _prefill(p0, [1] + list(range(3, 90)), src_pages)
  before = ray.get([p0.actor.count_programs.remote(), d0.actor.count_programs.remote()])
  result = RayTransfer(timeout_s=5.0)(p0, src_pages, d0, dst_pages).result()
  after = ray.get([p0.actor.count_programs.remote(), d0.actor.count_programs.remote()])
  assert result.bytes == 11 * d0.page_bytes
  assert (after[0]["gather"] - before[0]["gather"], after[1]["scatter"] - before[1]["scatter"],
          after[0]["scatter"] - before[0]["scatter"]) == (1, 1, 0)
  assert np.array_equal(ray.get(d0.actor.read_pages.remote(dst_pages)),
                        ray.get(p0.actor.read_pages.remote(src_pages)))


def test_an_offer_never_pulled_expires(pair, monkeypatch):
  """Offers live for the pull deadline plus the driver's grace (0.5 + 0.2 s here). One pulled
  in time lands and is settled (it never expires); one nobody pulls expires on the source,
  which takes it back from its own server: a pull after that finds nothing (before the fix
  the offer stayed on the source forever, and this pull got it)."""
  monkeypatch.setattr(ray_transfer, "DEADLINE_GRACE_S", 0.2)
  p0, d0 = pair
  before = ray.get(p0.actor.offer_counts.remote())
  assert before["held"] == 0
  transfer = RayTransfer(timeout_s=0.5)
  assert transfer(p0, [1], d0, [7]).result().bytes == 4096
  offered = transfer.offer(p0, [1], d0)
  assert ray.get(offered[1]) == 4096      # gathered and offered (one page)
  time.sleep(1.0)
  assert ray.get(p0.actor.offer_counts.remote()) == {"held": 0,
                                                     "expired": before["expired"] + 1}
  expired = transfer.pull(p0, d0, [7], offered)
  with pytest.raises(DeviceError, match=rf"KV pull from {p0.address} not complete after 0.5 s"):
    expired.result()
  assert transfer.offer_ttl_s == pytest.approx(0.7)
