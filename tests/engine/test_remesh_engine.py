"""Re-meshing the real engine's decode tier mid-run (scheduler/remesh.py driving
engine/remesh.py): two TP1 instances merged into one TP2 instance while requests decode, then
split back, greedy tokens equal to the same run without re-meshing, every request finished,
every pool empty, the devices reused; a failure while resharding leaves the old instances
serving."""

import jax
import numpy as np
import pytest

from conftest import tiny_engine_options
from helpers.remesh_policies import WhenDecoding
from pdjax.engine.cluster import build_instances
from pdjax.engine.instance import Instance
from pdjax.engine.remesh import EngineRemeshBuilder
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner.serve_requests import serve
from pdjax.scheduler import policies as policy_lib
from pdjax.errors import DeviceError

NAMES = dict(prefill_router="least_loaded", decode_router="least_loaded", path="always_disagg",
             admission="none", colocated_policy="prefill_first", role_switch="none")


def _requests():
  prompts = [[3, 17, 5, 9, 11, 2, 40, 41, 7], [23, 5, 5, 61, 2], [8, 8, 1, 30, 12, 4],
             [9, 10, 11], [44, 3, 2, 1, 7, 7, 7, 19, 20, 21], [5, 6]]
  return [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p,
                  sampling=SamplingParams(max_new_tokens=24 + 4 * i))
          for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def cluster(tiny_model):
  cfg, params = tiny_model
  opts = tiny_engine_options(lazy_compile=True)
  instances = build_instances([("prefill", 1, 1), ("decode", 2, 1)], cfg, params, opts)
  builder = EngineRemeshBuilder(cfg, {"prefill": opts, "decode": opts}, instances)
  assert builder.precompile({"decode": [(1, 2), (2, 1)]}, params) == 1   # the TP2 standby
  base = serve("disaggregated", instances, _requests(),
               policies=policy_lib.build(NAMES, dict(token_budget=128, max_prefill_seqs=4)))
  return cfg, params, instances, builder, {r.id: r.output_ids for r in base.requests}


def _serve(instances, builder, running=4):
  policies = policy_lib.build(NAMES, dict(token_budget=128, max_prefill_seqs=4))
  policies.role_switch = WhenDecoding(running)
  return serve("disaggregated", instances, _requests(), policies=policies,
               remesh_builder=builder)


def test_merge_and_split_mid_decode_keep_every_token(cluster):
  cfg, params, instances, builder, expected = cluster
  decode_devices = [d for i in instances[1:] for d in i.mesh.devices.flat]
  result = _serve(instances, builder)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 6
  assert {r.id: r.output_ids for r in result.requests} == expected
  merge, split = result.remesh_events
  assert (merge["from"], merge["to"], merge["ok"]) == ("2x1", "1x2", True)
  assert (split["from"], split["to"], split["ok"]) == ("1x2", "2x1", True)
  assert merge["migrated"] >= 4 and split["migrated"] >= 2
  assert merge["recomputed"] == split["recomputed"] == 0
  assert merge["phases_s"]["compile"] < 0.5   # standby: programs compiled at start-up
  for inst in result.instances:
    assert inst.tables.num_used_pages == 0 and not len(inst.tables), inst.name
  # devices reused: the merged instance spanned both decode devices; the split's two
  # instances are the original ones, on their own devices again, and serve; none is left
  # on a freed mesh
  merged = [i for i in result.instances if i.tp == 2]
  assert len(merged) == 1 and list(merged[0].mesh.devices.flat) == decode_devices
  assert merged[0].params is None and merged[0].kv is None      # released, standing by
  final = [i for i in result.instances if i.role == "decode" and i.params is not None]
  assert sorted(i.name for i in final) == ["decode-m2-0", "decode-m2-1"]
  assert [d for i in final for d in i.mesh.devices.flat] == decode_devices
  # the weights came back intact (resharded twice, device to device)
  got = jax.tree_util.tree_leaves(final[1].params)
  from pdjax.models.param_layout import to_layout
  want = jax.tree_util.tree_leaves(to_layout(params, cfg.num_layers, final[1].param_layout))
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), b)


def test_a_failed_reshard_leaves_the_old_instances_serving(cluster, monkeypatch):
  _, _, instances, builder, expected = cluster
  live = [i for i in builder.live if i.role == "decode"]

  def fail(self, sources):
    raise DeviceError("RESOURCE_EXHAUSTED: out of memory while resharding")
  monkeypatch.setattr(Instance, "load", fail)
  result = _serve([instances[0]] + live, builder)
  assert {r.id: r.output_ids for r in result.requests} == expected
  event, = result.remesh_events
  assert event["ok"] is False
  assert event["error"] == "DeviceError: RESOURCE_EXHAUSTED: out of memory while resharding"
  assert sorted({r.decode_instance for r in result.requests}) == sorted(i.name for i in live)
  assert all(i.params is not None for i in live)
