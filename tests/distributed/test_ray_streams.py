"""kv.stream_layers under cluster.launcher=ray: a prefill actor runs the step by layer groups
and offers each group's KV as soon as it is enqueued; each decode actor pulls every group once
(one pull per group, sent with the step). Greedy tokens equal HF's (and so the unstreamed
run's) on TP1->TP1, TP2->TP1 and TP1->TP2 with 1 and 2 (= all) groups, and with chunked
prompts and decode-side prefix hits; exactly the pages needed cross processes; a request
ending at its first token has its pulls revoked on the decode actor (dropped, never landed)
and its offers settled or expired; a decode actor killed while its groups stream loses
nothing; nothing leaks."""

import time

import pytest
import ray

from conftest import tiny_engine_options
from helpers.ray_fixtures import hf_outputs, ray_cluster  # noqa: F401  (fixtures)
from helpers.hf_reference import hf_greedy_outputs
from pdjax.distributed.ray_transfer import RemoteStreamedTransfer
from pdjax.models.llama_config import config_from_hf
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving

pytestmark = pytest.mark.slow

PROMPTS = [[1, 5, 9, 14, 27, 3, 88], [1, 100], [1] + list(range(10, 60)), [1, 7, 7, 7, 9],
           [1] + list(range(30, 47))]
MAX_NEW = [12, 9, 16, 20, 5]
PULL_TIMEOUT_S = 5.0


def _requests(max_new=MAX_NEW):
  return [Request(id=f"r{i}", arrival_s=0.01 * i, prompt_ids=p, eos_ids=(2,),
                  sampling=SamplingParams(max_new_tokens=m))
          for i, (p, m) in enumerate(zip(PROMPTS, max_new))]




def _run(ray_cluster, hf_llama, tiers, groups, requests):
  path, _ = hf_llama
  instances = ray_cluster.build_instances(tiers, config_from_hf(path),
                                          tiny_engine_options(stream_layers=groups),
                                          checkpoint=path)
  try:
    result = serving.serve("disaggregated", instances, requests,
                           transfer_fn=ray_cluster.transfer_fn, stream_layers=groups,
                           stream_min_tokens=0)
    assert serving.kv_pages_leaked(instances) == 0
    return result, instances
  finally:
    ray_cluster.release(instances)


@pytest.mark.parametrize("tiers,groups", [
    ([("prefill", 1, 1), ("decode", 1, 1)], 2),
    ([("prefill", 1, 2), ("decode", 1, 1)], 2),
    ([("prefill", 1, 1), ("decode", 1, 2)], 1),
], ids=["tp1-to-tp1-2groups", "tp2-to-tp1-2groups", "tp1-to-tp2-1group"])
def test_streamed_through_actors_equals_hf(ray_cluster, hf_llama, hf_outputs, tiers, groups):
  result, _ = _run(ray_cluster, hf_llama, tiers, groups, _requests())
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
  assert [r.output_ids for r in result.requests] == hf_outputs
  # Every prompt streamed: its transfer began at its step's dispatch, before the prefill ended;
  # exactly its pages crossed (page_size 8; k and v, 2 layers, 2 kv heads, head_dim 16,
  # float32: 4096 bytes a page, summed over the groups).
  assert all(r.transfer_start_s < r.prefill_end_s for r in result.requests)
  assert [len(r.transfer_group_ends_s) for r in result.requests] == [groups] * len(PROMPTS)
  # (the groups' pulls run at once: the driver may see a later group land first, so the
  # transfer ends with the last group seen, not necessarily the last group)
  assert all(max(r.transfer_group_ends_s) == r.transfer_s for r in result.requests)
  assert [r.transfer_bytes for r in result.requests] == [-(-len(p) // 8) * 4096 for p in PROMPTS]
  assert len(result.transfers) == len(PROMPTS) and all(t["ok"] for t in result.transfers)


def test_a_request_ending_at_its_first_token_revokes_its_pulls(ray_cluster, hf_llama,
                                                               hf_outputs, monkeypatch):
  """Each request's first token is its EOS: it finishes when its prefill is collected, its
  streamed KV unwanted. Its group pulls are abandoned (revoked on the decode actor unless
  already returned), the decode pages released; every offer is then settled or expires."""
  abandoned = []
  original = RemoteStreamedTransfer.abandon

  def spy(self):
    abandoned.append(self)
    original(self)

  monkeypatch.setattr(RemoteStreamedTransfer, "abandon", spy)
  requests = _requests()
  for r, out in zip(requests, hf_outputs):
    r.eos_ids = (out[0],)
  path, _ = hf_llama
  instances = ray_cluster.build_instances([("prefill", 1, 1), ("decode", 1, 1)],
                                          config_from_hf(path),
                                          tiny_engine_options(stream_layers=2), checkpoint=path)
  try:
    result = serving.serve("disaggregated", instances, requests,
                           transfer_fn=ray_cluster.transfer_fn, stream_layers=2,
                           stream_min_tokens=0)
    assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
    assert [r.output_ids for r in result.requests] == [[o[0]] for o in hf_outputs]
    assert len(abandoned) == len(PROMPTS) and result.transfers == []
    assert serving.kv_pages_leaked(instances) == 0
    src = instances[0]
    deadline = time.time() + ray_cluster.transfer_fn.offer_ttl_s + 5
    while ray.get(src.actor.offer_counts.remote())["held"] and time.time() < deadline:
      time.sleep(0.2)
    assert ray.get(src.actor.offer_counts.remote())["held"] == 0
  finally:
    ray_cluster.release(instances)


def test_a_decode_process_killed_while_its_groups_stream(ray_cluster, hf_llama, hf_outputs):
  """decode-0's process is SIGKILLed right after the first streamed step bound to it is
  dispatched (its group pulls in flight): those pulls fail with the process gone, the request
  is recomputed or moved to decode-1 as for any lost transfer, and every request still ends
  with HF's tokens, nothing leaked."""
  import os
  import signal
  path, _ = hf_llama
  instances = ray_cluster.build_instances([("prefill", 1, 1), ("decode", 2, 1)],
                                          config_from_hf(path),
                                          tiny_engine_options(stream_layers=2), checkpoint=path)
  d0 = next(i for i in instances if i.name == "decode-0")
  streamer = ray_cluster.transfer_fn
  killed = []

  class KillingStreamer:
    def streamed_prefill(self, src, seqs, prev, streams):
      pending = streamer.streamed_prefill(src, seqs, prev, streams)
      if not killed and any(dst is d0 for dst, _, _ in streams):
        killed.append(d0.pid)
        os.kill(d0.pid, signal.SIGKILL)
      return pending

  for inst in instances:
    inst.kv_streamer = KillingStreamer()
  try:
    result = serving.serve("disaggregated", instances, _requests(),
                           transfer_fn=streamer, stream_layers=2, stream_min_tokens=0)
    assert killed
    assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
    assert [r.output_ids for r in result.requests] == hf_outputs
    assert result.faults["instances_killed"] == 1
    # (every request streamed: none decoded on decode-0 before it died, all on decode-1)
    assert {r.decode_instance for r in result.requests} == {"decode-1"}
    assert serving.kv_pages_leaked(instances) == 0
  finally:
    ray_cluster.release(instances)


def test_chunked_prompts_and_decode_side_prefix_hits_stream_only_the_new_pages(ray_cluster,
                                                                               hf_llama):
  """Prefill buckets of 32 tokens (longer prompts prefill in chunks; only the last chunk's step
  streams), the prefix cache on: r1 repeats r0's 51-token prompt and adds 20 tokens after r0
  finished, so the decode actor holds r0's full pages already and only the rest travel, layer
  group by layer group. Tokens equal HF's."""
  path, model = hf_llama
  long = PROMPTS[2]
  prompts, max_new = [long, long + list(range(70, 90))], [6, 6]
  requests = [Request(id=f"r{i}", arrival_s=a, prompt_ids=p, eos_ids=(2,),
                      sampling=SamplingParams(max_new_tokens=m))
              for i, (p, m, a) in enumerate(zip(prompts, max_new, (0.0, 3.0)))]
  instances = ray_cluster.build_instances([("prefill", 1, 2), ("decode", 1, 1)],
                                          config_from_hf(path),
                                          tiny_engine_options(stream_layers=2,
                                                              prefill_buckets=(32,)),
                                          checkpoint=path)
  for inst in instances:
    inst.tables.enable_prefix_cache(0, 0.0, "lru")
  try:
    result = serving.serve("disaggregated", instances, requests,
                           transfer_fn=ray_cluster.transfer_fn, stream_layers=2,
                           stream_min_tokens=0)
    r0, r1 = result.requests
    assert [r.output_ids for r in result.requests] == hf_greedy_outputs(model, prompts, max_new)
    assert r0.finish_s < r1.arrival_s
    assert r1.decode_cached_tokens == 48                   # r0's 6 full pages of 8 tokens
    # r1: 71 prompt tokens = 9 pages, 6 cached on the decode actor: 3 pages travel
    assert [r.transfer_bytes for r in result.requests] == [7 * 4096, 3 * 4096]
    assert all(r.transfer_start_s < r.prefill_end_s for r in result.requests)
    assert serving.kv_pages_leaked(instances) == 0
  finally:
    ray_cluster.release(instances)
