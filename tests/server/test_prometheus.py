"""pdjax/server/prometheus.py: the /metrics numbers of a simulated run equal summary.json's, and
the counters fed from driver snapshots take the snapshot's values (never double count)."""

import dataclasses
import math
import subprocess
import sys
import types

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdjax import config as config_lib
from pdjax.kv.pages import BlockTables
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner.execute import execute
from pdjax.scheduler.instance_queue import InstanceQueue
from pdjax.scheduler.tally import Tally
from pdjax.server.prometheus import EngineState, InstanceState, ServerMetrics, engine_state

MODEL = "tiny"


@pytest.fixture(scope="module")
def run():
  """(summary, RunResult, instances) of a small disaggregated sim run with prefix hits, failed
  transfers recomputed on decode, cancellations and preemptions."""
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.backend, cfg.mode = "sim", "disaggregated"
  cfg.workload.num_requests, cfg.workload.preset, cfg.workload.rate = 40, "rag", 200.0
  cfg.kv.prefix_cache, cfg.kv.pages_per_instance, cfg.kv.transfer_retries = True, 32, 0
  cfg.kv.max_model_len = 512     # 32 pages hold one sequence
  cfg.faults.transfer_fail_prob, cfg.faults.cancel_prob = 0.3, 0.1
  mcfg = config_lib.validate(cfg)
  return execute(cfg, mcfg, "disaggregated", None, quiet=True)


def _driver_of(result, instances):
  """What engine_state reads of a Driver, rebuilt from a finished run."""
  return types.SimpleNamespace(workers=[InstanceQueue(i, i.role, 1) for i in instances],
                               transfers=result.transfers, preemptions=result.preemptions,
                               role_switches=result.role_switches, tally=result.tally)


def _scrape(metrics: ServerMetrics) -> dict:
  """(sample name, frozenset of labels) -> value, parsed back from the rendered text."""
  body, content_type = metrics.render()
  assert content_type.startswith("text/plain")
  return {(s.name, frozenset(s.labels.items())): s.value
          for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _value(samples: dict, name: str, **labels) -> float:
  """Sum of the samples called `name` whose labels include `labels`."""
  return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


@pytest.fixture(scope="module")
def scraped(run):
  summary, result, instances = run
  metrics = ServerMetrics(model_name=MODEL)
  metrics.update(engine_state(_driver_of(result, instances)))
  for r in result.requests:
    metrics.request_finished(r)
  return _scrape(metrics)


def test_the_run_exercises_every_counter(run):
  summary, _, _ = run
  assert summary["requests"]["cancelled"] and summary["preemptions"]
  assert summary["kv_transfer"]["failures"] and summary["faults"]["fell_back"]
  assert summary["kv_cache"]["saved_prefill_tokens"]


def test_latency_histograms_match_the_requests(run, scraped):
  _, result, _ = run
  done = [r for r in result.requests if r.status is Status.FINISHED]
  for name, values in [
      ("pdjax:time_to_first_token_seconds", [r.ttft_s for r in done if r.ttft_s is not None]),
      ("pdjax:time_per_output_token_seconds", [r.tpot_s for r in done if r.tpot_s is not None]),
      ("pdjax:inter_token_latency_seconds", [g for r in done for g in r.itl_s]),
      ("pdjax:e2e_request_latency_seconds", [r.e2e_s for r in done if r.e2e_s is not None]),
      ("pdjax:request_queue_time_seconds", [r.prefill_start_s - r.arrival_s for r in done])]:
    assert _value(scraped, name + "_count", model_name=MODEL) == len(values), name
    assert math.isclose(_value(scraped, name + "_sum"), sum(values), rel_tol=1e-9), name
    assert _value(scraped, name + "_bucket", le="+Inf") == len(values), name
  for inst in {r.prefill_instance for r in done}:   # TTFT by prefill instance and its tier
    n = sum(r.prefill_instance == inst for r in done)
    assert _value(scraped, "pdjax:time_to_first_token_seconds_count", instance=inst,
                  tier="prefill") == n
  for inst in {r.decode_instance for r in done if r.tpot_s is not None}:
    n = sum(r.decode_instance == inst and r.tpot_s is not None for r in done)
    assert _value(scraped, "pdjax:time_per_output_token_seconds_count", instance=inst,
                  tier="decode") == n
  assert _value(scraped, "pdjax:e2e_request_latency_seconds_count",
                path="disaggregated") == len(done)


def test_request_counters_match_the_summary(run, scraped):
  summary, result, _ = run
  for status in ("finished", "rejected", "failed", "cancelled"):
    assert _value(scraped, "pdjax:requests_terminal_total", status=status,
                  model_name=MODEL) == summary["requests"][status], status
  for reason in ("stop", "length"):
    n = sum(r.finish_reason == reason for r in result.requests)
    assert _value(scraped, "pdjax:request_success_total", finished_reason=reason) == n
  assert _value(scraped, "pdjax:request_success_total") == summary["requests"]["finished"]


def test_engine_counters_match_the_summary(run, scraped):
  summary, _, _ = run
  transfer = summary["kv_transfer"]
  assert _value(scraped, "pdjax:kv_transfer_bytes_sum") == transfer["bytes"]
  assert _value(scraped, "pdjax:kv_transfer_bytes_count") == transfer["count"]
  assert _value(scraped, "pdjax:kv_transfer_seconds_count") == transfer["count"]
  assert _value(scraped, "pdjax:kv_transfer_failures_total") == transfer["failures"]
  assert _value(scraped, "pdjax:num_preemptions_total") == summary["preemptions"]
  assert _value(scraped, "pdjax:role_switches_total") == len(summary["role_switches"])
  fell_back = {dict(ls)["kind"]: v for (n, ls), v in scraped.items()
               if n == "pdjax:request_fallbacks_total"}
  assert fell_back == summary["faults"]["fell_back"]
  kv = summary["kv_cache"]
  hits = _value(scraped, "pdjax:prefix_cache_hits_total")
  queries = _value(scraped, "pdjax:prefix_cache_queries_total")
  assert hits == kv["saved_prefill_tokens"]
  assert math.isclose(hits / queries, kv["hit_rate_tokens"], rel_tol=1e-12)
  assert _value(scraped, "pdjax:prefix_cache_hits_total", tier="decode") == 0


def test_per_instance_gauges(run, scraped):
  _, _, instances = run
  for inst in instances:
    labels = dict(tier=inst.role, instance=inst.name, model_name=MODEL)
    used, total = inst.tables.num_used_pages, inst.tables.allocator.num_pages
    assert _value(scraped, "pdjax:kv_cache_usage_perc", **labels) == used / total
    assert ("pdjax:num_requests_running", frozenset(labels.items())) in scraped
    assert _value(scraped, "pdjax:num_requests_waiting", **labels) == 0   # the run ended


def _state(preemptions, transfers, fallbacks, queries, hits, used=3):
  return EngineState(
      instances=[InstanceState("p0", "prefill", 1, 2, used, 10, queries, hits)],
      preemptions=preemptions, transfers=transfers, role_switches=preemptions // 2,
      fallbacks=fallbacks)


def test_updates_set_counters_to_the_snapshot():
  metrics = ServerMetrics(model_name=MODEL)
  transfers = [{"bytes": 100, "seconds": 0.01, "ok": True}, {"bytes": 0, "seconds": 0.1,
                                                              "ok": False}]
  first = _state(2, list(transfers), {"k": 1}, 64, 16)
  metrics.update(first)
  metrics.update(first)                                   # the same snapshot twice
  transfers += [{"bytes": 300, "seconds": 0.02, "ok": True}] * 2 + [transfers[1]]
  metrics.update(_state(7, list(transfers), {"k": 3, "j": 1}, 128, 48, used=5))
  s = _scrape(metrics)
  assert _value(s, "pdjax:num_preemptions_total") == 7
  assert _value(s, "pdjax:role_switches_total") == 3
  assert _value(s, "pdjax:kv_transfer_failures_total") == 2
  assert _value(s, "pdjax:kv_transfer_bytes_sum") == 700
  assert _value(s, "pdjax:kv_transfer_seconds_count") == 3
  assert _value(s, "pdjax:request_fallbacks_total", kind="k") == 3
  assert _value(s, "pdjax:request_fallbacks_total", kind="j") == 1
  assert _value(s, "pdjax:prefix_cache_queries_total", instance="p0") == 128
  assert _value(s, "pdjax:prefix_cache_hits_total", instance="p0") == 48
  assert _value(s, "pdjax:kv_cache_usage_perc", instance="p0") == 0.5
  metrics.update(_state(1, transfers[:1], {}, 0, 0))      # a new driver: its list is shorter
  s = _scrape(metrics)
  assert _value(s, "pdjax:kv_transfer_bytes_sum") == 100
  assert _value(s, "pdjax:kv_transfer_failures_total") == 0
  assert _value(s, "pdjax:num_preemptions_total") == 1


def test_engine_state_reads_the_workers_and_the_tally():
  """Gauges from the workers, prefix tokens and fallbacks from the driver's tally (counted
  when they happened), transfers from the index the collector asks for."""
  cached, plain = BlockTables(10, 4), BlockTables(8, 4)
  cached.enable_prefix_cache()
  cached.allocate("z", 11)                                 # 3 of 10 pages
  w = InstanceQueue(types.SimpleNamespace(name="p0", tables=cached), "prefill", 4)
  v = InstanceQueue(types.SimpleNamespace(name="d0", tables=plain), "decode", 4)
  tally = Tally()
  tally.prefix_lookup("p0", 3, 2)
  tally.fallback("x", [])
  tally.fallback("x", ["x"])                               # the same request again: once
  transfers = [{"bytes": 1, "seconds": 0.5, "ok": True}, {"bytes": 2, "seconds": 0.5, "ok": True}]
  driver = types.SimpleNamespace(workers=[w, v], transfers=transfers, preemptions=0,
                                 role_switches=[], tally=tally)
  w.running.append(Request("a", 0.0, [1, 2, 3], SamplingParams(max_new_tokens=2)))
  state = engine_state(driver)
  assert state.fallbacks == {"x": 1}
  assert [(i.name, i.role, i.running, i.waiting, i.kv_pages_used, i.kv_pages_total,
           i.prefix_queries, i.prefix_hits) for i in state.instances] == [
               ("p0", "prefill", 1, 0, 3, 10, 3, 2), ("d0", "decode", 0, 0, 0, 8, 0, 0)]
  assert (state.transfers, state.transfers_first) == (transfers, 0)
  assert (engine_state(driver, 1).transfers, engine_state(driver, 1).transfers_first) == (
      transfers[1:], 1)
  assert engine_state(driver, 5).transfers_first == 0       # a shorter list: a new driver's


def test_a_scrape_folds_only_new_transfers():
  """The collector asks for the transfers it has not folded: with a spilled list, what an
  update reads does not grow with the run."""
  metrics = ServerMetrics(model_name=MODEL)
  driver = types.SimpleNamespace(workers=[], transfers=[], preemptions=0, role_switches=[],
                                 tally=Tally())
  for n in range(5):
    driver.transfers.append({"bytes": 10, "seconds": 0.01, "ok": n != 2})
    state = engine_state(driver, metrics.transfers_seen())
    assert state.transfers_first == n and len(state.transfers) == 1
    metrics.update(state)
  s = _scrape(metrics)
  assert _value(s, "pdjax:kv_transfer_bytes_sum") == 40
  assert _value(s, "pdjax:kv_transfer_failures_total") == 1
