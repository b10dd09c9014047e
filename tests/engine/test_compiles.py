"""`compiles` counts programs XLA compiled; programs a compilation cache served (the persistent
one, or jax's in-process one) are `compiles_from_cache`: per instance, in the summary, report.md
and the compare table."""

from conftest import tiny_engine_options
from pdjax.engine.cluster import build_instances
from pdjax.metrics.compare import compare_table
from pdjax.metrics.report import write_run_files
from pdjax.metrics.summary import summarize

# Shapes no other test compiles, so the session's cache starts without them: 2 prefill + 1
# decode programs per instance; 5 pages per sequence -> transfer buckets 1, 2, 4, 5.
OPTS = dict(page_size=8, num_pages=24, max_model_len=40, prefill_buckets=(24, 40),
            max_prefill_seqs=3, decode_buckets=(3,))


def _counts(instances):
  return [(i.compiles, i.compiles_from_cache) for i in instances]


def test_second_build_loads_every_program_from_the_cache(tiny_model, compile_cache):
  cfg, params = tiny_model
  opts = tiny_engine_options(**OPTS)
  assert opts.transfer_buckets == (1, 2, 4, 5)
  tiers = [("prefill", 1, 1), ("decode", 1, 1)]
  first = build_instances(tiers, cfg, params, opts)
  # prefill: 3 step programs + 4 gathers; decode: 3 step programs + 4 scatters. On CPU the
  # cache key holds the device assignment, so the decode instance (device 1) compiles its
  # own step programs rather than loading the prefill instance's (device 0).
  assert _counts(first) == [(7, 0), (7, 0)]
  second = build_instances(tiers, cfg, params, opts)   # the same devices: all loaded
  assert _counts(second) == [(0, 7), (0, 7)]


def test_summary_report_and_table_show_both(tmp_path):
  s = summarize([], mode="colocated", duration_s=1.0, slo_ttft_s=1.0, slo_tpot_s=1.0,
                transfers=[], compiles=0, compiles_from_cache=14, kv_pages_leaked=0)
  assert (s["compiles"], s["compiles_from_cache"]) == (0, 14)
  write_run_files(str(tmp_path), config_dict={}, requests=[], summary=s)
  assert ("- Compiles: 0 by XLA, 14 served by the compilation cache\n"
          in (tmp_path / "report.md").read_text())
  fresh = dict(s, compiles=11, compiles_from_cache=0)
  row = next(line for line in compare_table({"a": s, "b": fresh}).splitlines()
             if line.startswith("compiles"))
  assert row.split() == ["compiles", "0", "(+14", "cached)", "11"]


def test_lazy_compile_builds_only_the_buckets_a_run_uses(tiny_model):
  """lazy_compile: no step program in warm-up; each bucket compiles on its first step, once,
  and the tokens are the no-cache reference's."""
  from pdjax.runner import serve_requests as serving
  from pdjax.engine import programs
  from pdjax.request import Request, SamplingParams
  cfg, params = tiny_model
  opts = tiny_engine_options(**dict(OPTS, decode_buckets=(1, 2, 3)), lazy_compile=True)
  [inst] = build_instances([("colocated", 1, 1)], cfg, params, opts)
  assert (inst._prefill, inst._decode, inst.lazy_compiles) == ({}, {}, 0)
  prompts = [[5, 9, 14], [7] * 11]
  reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p,
                  sampling=SamplingParams(max_new_tokens=6)) for i, p in enumerate(prompts)]
  result = serving.serve("colocated", [inst], reqs)
  # one prefill step of 14 tokens (bucket 24), then decode steps of 2 rows (bucket 2)
  assert (sorted(inst._prefill), sorted(inst._decode), inst.lazy_compiles) == ([24], [2], 2)
  assert inst.lazy_compile_s > 0
  assert [r.output_ids for r in result.requests] == [
      programs.reference_generate(params, cfg, p, 6) for p in prompts]
