"""Re-meshing with the Ray launcher (distributed/remesh.py): the decode tier's two TP1 actors
replaced mid-run by one TP2 actor while requests decode, then split back into two TP1 actors;
every request's KV moved actor to actor, greedy tokens equal HF's, every request finished,
every pool empty, the replaced processes gone. A new actor that fails to start leaves the old
ones serving."""

import os

import pytest

from conftest import tiny_engine_options
from helpers.remesh_policies import WhenDecoding
from helpers.ray_fixtures import hf_outputs, ray_cluster  # noqa: F401  (fixtures)
from pdjax.distributed.remesh import RayRemeshBuilder
from pdjax.models.llama_config import config_from_hf
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving
from pdjax.scheduler import policies as policy_lib
from pdjax.errors import DeviceError

pytestmark = pytest.mark.slow

PULL_TIMEOUT_S = 30.0   # (a loaded 2-core machine: a pull must not time out while actors start)

PROMPTS = [[1, 5, 9, 14, 27, 3, 88], [1, 100], [1] + list(range(10, 60)), [1, 7, 7, 7, 9],
           [1] + list(range(30, 47)), [1, 64, 32, 16, 8, 4, 2]]
MAX_NEW = [24, 20, 28, 32, 22, 26]
NAMES = dict(prefill_router="least_loaded", decode_router="least_loaded", path="always_disagg",
             admission="none", colocated_policy="prefill_first", role_switch="none")


def _requests():
  return [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p, eos_ids=(),
                  sampling=SamplingParams(max_new_tokens=m))
          for i, (p, m) in enumerate(zip(PROMPTS, MAX_NEW))]


@pytest.fixture
def actors(ray_cluster, hf_llama):
  path, _ = hf_llama
  instances = ray_cluster.build_instances([("prefill", 1, 1), ("decode", 2, 1)],
                                          config_from_hf(path), tiny_engine_options(),
                                          checkpoint=path, remesh_tps={"decode": (1, 2)})
  builder = RayRemeshBuilder(ray_cluster, instances)
  yield instances, builder
  ray_cluster.release(builder.live + instances)


def _serve(ray_cluster, instances, builder, policy):
  policies = policy_lib.build(NAMES, dict(token_budget=128, max_prefill_seqs=4))
  policies.role_switch = policy
  return serving.serve("disaggregated", instances, _requests(), policies=policies,
                       transfer_fn=ray_cluster.transfer_fn, remesh_builder=builder)


def _gone(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  with open(f"/proc/{pid}/stat") as f:   # (a zombie until Ray reaps it)
    return f.read().split(")")[1].split()[0] == "Z"


def test_merge_and_split_replace_the_actors_and_keep_every_token(ray_cluster, actors,
                                                                 hf_outputs):
  instances, builder = actors
  old_pids = [i.pid for i in instances[1:]]
  result = _serve(ray_cluster, instances, builder, WhenDecoding())
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS), [
      (r.id, r.reason, r.fallbacks) for r in result.requests]
  assert [r.output_ids for r in result.requests] == hf_outputs
  merge, split = result.remesh_events
  assert (merge["ok"], merge["from"], merge["to"]) == (True, "2x1", "1x2")
  assert (split["ok"], split["from"], split["to"]) == (True, "1x2", "2x1")
  assert merge["migrated"] >= 4 and merge["recomputed"] == 0 and split["recomputed"] == 0
  assert merge["phases_s"]["reshard"] == 0.0 and merge["phases_s"]["compile"] > 0
  assert serving.kv_pages_leaked(result.instances) == 0
  serving_now = [i for i in builder.live if i.role == "decode"]
  assert [i.tp for i in serving_now] == [1, 1] and all(i.alive for i in serving_now)
  assert all(_gone(pid) for pid in old_pids)
  assert len({i.pid for i in serving_now} | set(old_pids)) == 4   # new processes each time


def test_a_failed_start_leaves_the_old_actors_serving(ray_cluster, actors, hf_outputs,
                                                      monkeypatch):
  instances, builder = actors

  def failing_start(self):
    raise DeviceError(f"{self.name}: injected start failure")

  from pdjax.distributed.remote import RemoteInstance
  monkeypatch.setattr(RemoteInstance, "start", failing_start)
  result = _serve(ray_cluster, instances, builder, WhenDecoding())
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS), [
      (r.id, r.reason, r.fallbacks) for r in result.requests]
  assert [r.output_ids for r in result.requests] == hf_outputs
  failed, = result.remesh_events
  assert failed["ok"] is False and "injected start failure" in failed["error"]
  assert [i.name for i in builder.live] == ["prefill-0", "decode-0", "decode-1"]
  assert serving.kv_pages_leaked(result.instances) == 0
