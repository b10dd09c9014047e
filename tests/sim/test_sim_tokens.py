"""Simulated tokens come from the simulated KV (a digest per page of the tokens written there),
so the simulator's "same tokens" checks see KV routed to the wrong request: tokens depend on
the prompt, not only on the position, and moving the wrong pages changes them."""

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.models.llama_config import PRESETS
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.instance import build_sim_instances, sim_transfer


def _serve(mode, tiers, requests, transfer_fn=sim_transfer):
  clock = ManualClock()
  insts = build_sim_instances(tiers, PRESETS["tiny"], tiny_engine_options(), hardware="a100",
                              clock=clock)
  return serving.serve(mode, insts, requests, clock=clock, transfer_fn=transfer_fn).requests


def _requests():
  prompts = [[5] * 20, [6] * 20, [5] * 20]   # 3 pages of 8 each; the first and last are equal
  return [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p,
                  sampling=SamplingParams(max_new_tokens=6)) for i, p in enumerate(prompts)]


def test_tokens_follow_the_prompt_not_the_position():
  a, b, c = _serve("colocated", [("colocated", 1, 1)], _requests())
  assert a.output_ids == c.output_ids != b.output_ids
  assert len(set(a.output_ids)) == 6   # not a constant stream


def test_same_tokens_in_every_mode_and_wrong_pages_show():
  colocated = [r.output_ids for r in _serve("colocated", [("colocated", 2, 1)], _requests())]
  tiers = [("prefill", 1, 1), ("decode", 2, 1)]
  disagg = [r.output_ids for r in _serve("disaggregated", tiers, _requests())]
  assert disagg == colocated

  def misrouted(src, src_pages, dst, dst_pages):   # moves the pages in the wrong order
    return sim_transfer(src, src_pages[::-1], dst, dst_pages)

  wrong = _serve("disaggregated", tiers, _requests(), transfer_fn=misrouted)
  assert [r.status for r in wrong] == [Status.FINISHED] * 3
  assert [r.output_ids[0] for r in wrong] == [o[0] for o in colocated]   # sampled on prefill
  assert all(w.output_ids[1:] != o[1:] for w, o in zip(wrong, colocated))
