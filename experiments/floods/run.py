"""The four floods (issue 18): long-document, short-request, cache-miss and single-tenant floods,
each on colocated, chunked and disaggregated, with and without the host KV tier, at a fixed
chip budget.

  python experiments/floods/run.py                 # simulator, realistic shapes (~6 min)
  python experiments/floods/run.py --real --no-baseline   # shortened, real JAX engine (~12 min)
  python experiments/floods/run.py --only=long_doc # one flood

Every flood is a generated JSONL trace (OUT/traces/<flood>.jsonl, seeded) with explicit tenants,
sessions and prompt token ids, served with the prefix cache on:

- background: three tenants (bg-a, bg-b, bg-c), each with its own 1,024-token system prompt,
  sending chat turns (system prompt + 32-256 new tokens, 32-128 output tokens) at a steady rate
  for the whole trace. Their attainment is the "others" column of every flood.
- long_doc: tenant `flood` asks questions about documents of 2k-7k tokens drawn (Zipf 1.1) from
  a library of 64, so documents repeat: the device pools hold a few, the host tier most.
- short: tenant `flood` sends very many short requests (16-128 prompt tokens after a 64-token
  prefix, 64-256 output tokens).
- cache_miss: tenant `flood` sends 2k-4k-token prompts built from one template whose version
  token (position 0) changes on every request, so nothing ever hits; they churn the device pools.
- single_tenant: no separate flood type: six tenants send the same RAG-like traffic (own
  1,024-token system prompt + a passage from the tenant's pool of 48 + a question); tenant
  `noisy` at 10x the rate of each of the five others.

Chip budget (simulator): 4 H100s, Llama-3-8B bf16, TP1: 2 prefill + 2 decode instances
(disaggregated) vs 4 colocated instances (colocated: prefill_first; chunked: chunked prefill).
Each instance's KV pool is kv.pages_per_instance pages (16 tokens a page, 2 MiB a page at these
shapes), deliberately small so that prefix pages are evicted; the host tier (when on) is
HOST_PAGES pages shared by the node's four instances, over the h100 preset's 64 GB/s host link.

Writes OUT/results.md (one table for all floods) and OUT/results.json (the same rows); the
default run also copies the table to experiments/floods/results.md (results_real.md for --real).
--reuse rebuilds the tables from the runs already in OUT without serving anything.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SIM_BASE = [
    "--config=configs/default.py", "--config.backend=sim", "--config.progress=False",
    "--config.repeats=1",   # (one run each: the default config repeats 5 times)
    "--config.model.preset=llama3_8b", "--config.model.dtype=bfloat16",
    "--config.sim.hardware=h100", "--config.mode=compare",
    "--config.cluster.prefill.instances=2", "--config.cluster.prefill.tp=1",
    "--config.cluster.decode.instances=2", "--config.cluster.decode.tp=1",
    "--config.cluster.colocated.instances=4", "--config.cluster.colocated.tp=1",
    "--config.kv.pages_per_instance=3072", "--config.kv.max_model_len=8192",
    "--config.kv.prefix_cache=True",
    "--config.scheduler.prefill_buckets=(512,1024,2048,4096,8192)",
    "--config.scheduler.max_prefill_seqs=16",
    "--config.scheduler.decode_buckets=(8,16,32,64,128)",
    "--config.scheduler.chunk_budget=2048",
    "--config.slo.ttft_s=1.0", "--config.slo.tpot_s=0.05",
    "--config.workload.kind=jsonl", "--config.workload.num_requests=0",
]
HOST_PAGES = 24576   # 48 GiB of host memory for the node at 2 MiB a page
# Real engine: the default config's 8 virtual CPU devices (2P x TP2 + 2D x TP2 vs 4 x TP2),
# tiny model, short traces; the host tier (engine version: copy_to_host_async of evicted prefix
# pages, scattered back before the step that reads them) with REAL_HOST_PAGES pages.
REAL_BASE = [
    "--config=configs/default.py", "--config.backend=jax", "--config.progress=False",
    "--config.repeats=1",
    "--config.mode=compare", "--config.kv.prefix_cache=True",
    "--config.kv.pages_per_instance=96", "--config.kv.max_model_len=512",
    "--config.slo.ttft_s=1.0", "--config.slo.tpot_s=0.1",
    "--config.workload.kind=jsonl", "--config.workload.num_requests=0",
]
REAL_HOST_PAGES = 1024
RUNS = ("colocated", "chunked", "disaggregated")
BACKGROUND = ("bg-a", "bg-b", "bg-c")

# Trace shapes. Lengths are (low, high) uniform; rates in requests/s; times in seconds.
SIM = dict(
    vocab=128256, duration=30.0, flood_start=5.0, flood_end=25.0,
    bg_rate=4.0, bg_system=1024, bg_user=(32, 256), bg_out=(32, 128),
    long_doc=dict(rate=30.0, docs=64, doc_len=(2048, 7168), question=(16, 64), out=(32, 128)),
    short=dict(rate=250.0, prefix=64, user=(16, 128), out=(64, 256)),
    cache_miss=dict(rate=30.0, template=(2048, 4096), out=(32, 128)),
    single_tenant=dict(rate=6.0, tenants=5, noisy_x=10, system=1024, passages=48,
                       passage=(512, 2048), question=(16, 64), out=(32, 128)),
)
REAL = dict(
    vocab=512, duration=6.0, flood_start=1.0, flood_end=5.0,
    bg_rate=1.0, bg_system=64, bg_user=(8, 32), bg_out=(8, 24),
    long_doc=dict(rate=4.0, docs=6, doc_len=(256, 400), question=(8, 16), out=(8, 16)),
    short=dict(rate=8.0, prefix=16, user=(4, 24), out=(16, 32)),
    cache_miss=dict(rate=4.0, template=(192, 320), out=(8, 16)),
    single_tenant=dict(rate=0.5, tenants=3, noisy_x=10, system=64, passages=6,
                       passage=(64, 192), question=(8, 16), out=(8, 24)),
)
FLOODS = ("long_doc", "short", "cache_miss", "single_tenant")


# ---- traces ---------------------------------------------------------------------------------

def _poisson(rng, rate: float, start: float, end: float) -> list[float]:
  out, t = [], start
  while True:
    t += rng.exponential(1.0 / rate)
    if t >= end:
      return out
    out.append(t)


def _tokens(rng, n: int, vocab: int) -> list[int]:
  return rng.integers(3, vocab, size=int(n)).tolist()


def _uniform(rng, lo_hi) -> int:
  return int(rng.integers(lo_hi[0], lo_hi[1] + 1))


def _zipf_pick(rng, n: int, s: float = 1.1) -> int:
  w = 1.0 / np.arange(1, n + 1) ** s
  return int(rng.choice(n, p=w / w.sum()))


def build_trace(flood: str, shape: dict, seed: int, with_flood: bool = True) -> list[dict]:
  """The rows of one flood's trace (background tenants + the flood), sorted by arrival."""
  rng = np.random.default_rng(seed)
  v, rows = shape["vocab"], []

  def add(t, tenant, session, prompt, out):
    rows.append({"arrival_s": round(t, 6), "prompt_ids": prompt, "output_len": int(out),
                 "tenant": tenant, "session": session})

  if flood != "single_tenant":
    for tenant in BACKGROUND:
      system = _tokens(rng, shape["bg_system"], v)
      for k, t in enumerate(_poisson(rng, shape["bg_rate"], 0.0, shape["duration"])):
        add(t, tenant, f"{tenant}-{k}", system + _tokens(rng, _uniform(rng, shape["bg_user"]), v),
            _uniform(rng, shape["bg_out"]))
  if not with_flood and flood != "single_tenant":
    return _finish(rows)
  f = shape[flood]
  t0, t1 = shape["flood_start"], shape["flood_end"]
  if flood == "long_doc":
    docs = [_tokens(rng, _uniform(rng, f["doc_len"]), v) for _ in range(f["docs"])]
    for k, t in enumerate(_poisson(rng, f["rate"], t0, t1)):
      d = _zipf_pick(rng, f["docs"])
      add(t, "flood", f"doc-{d}", docs[d] + _tokens(rng, _uniform(rng, f["question"]), v),
          _uniform(rng, f["out"]))
  elif flood == "short":
    prefix = _tokens(rng, f["prefix"], v)
    for k, t in enumerate(_poisson(rng, f["rate"], t0, t1)):
      add(t, "flood", f"short-{k}", prefix + _tokens(rng, _uniform(rng, f["user"]), v),
          _uniform(rng, f["out"]))
  elif flood == "cache_miss":
    template = _tokens(rng, f["template"][1], v)
    for k, t in enumerate(_poisson(rng, f["rate"], t0, t1)):
      n = _uniform(rng, f["template"])
      version = [3 + k % (v - 3)]          # a new prompt version every request: nothing hits
      add(t, "flood", f"miss-{k}", version + template[:n - 1], _uniform(rng, f["out"]))
  elif flood == "single_tenant":
    names = [f"t{i}" for i in range(f["tenants"])] + ["noisy"]
    for tenant in names:
      if tenant == "noisy" and not with_flood:
        continue
      rate = f["rate"] * (f["noisy_x"] if tenant == "noisy" else 1)
      system = _tokens(rng, f["system"], v)
      passages = [_tokens(rng, _uniform(rng, f["passage"]), v) for _ in range(f["passages"])]
      for k, t in enumerate(_poisson(rng, rate, 0.0, shape["duration"])):
        p = _zipf_pick(rng, f["passages"])
        add(t, tenant, f"{tenant}-{k}",
            system + passages[p] + _tokens(rng, _uniform(rng, f["question"]), v),
            _uniform(rng, f["out"]))
  return _finish(rows)


def _finish(rows: list[dict]) -> list[dict]:
  rows.sort(key=lambda r: (r["arrival_s"], r["tenant"], r["session"]))
  for i, r in enumerate(rows):
    r["id"] = f"{r['tenant']}-{i:05d}"
  return rows


def write_trace(path: str, rows: list[dict]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r, separators=(",", ":")) + "\n")


# ---- results --------------------------------------------------------------------------------

def _attain(reqs: list[dict], ttft: float, tpot: float) -> float | None:
  judged = [r for r in reqs if r["status"] != "cancelled"]
  if not judged:
    return None
  good = sum(r["status"] == "finished" and r["ttft_s"] is not None and r["ttft_s"] <= ttft
             and (r["tpot_s"] is None or r["tpot_s"] <= tpot) for r in judged)
  return good / len(judged)


def _p99(values) -> float | None:
  values = [x for x in values if x is not None]
  return float(np.percentile(values, 99)) if values else None


def row(folder: str) -> dict:
  with open(os.path.join(folder, "summary.json")) as f:
    s = json.load(f)
  with open(os.path.join(folder, "requests.jsonl")) as f:
    reqs = [json.loads(l) for l in f]
  ttft, tpot = s["slo"]["ttft_s"], s["slo"]["tpot_s"]
  roles = s["tiers"]["roles"]
  insts = s["tiers"]["instances"]
  tiers = {}
  for role, t in roles.items():
    busy = [insts[n]["busy_fraction"] for n in t["instances"]]
    tiers[role] = {"busy": t["busy_fraction"], "busy_min": min(busy), "busy_max": max(busy),
                   "queue_mean": t["queued"]["mean"], "queue_max": t["queued"]["max"],
                   "running_max": t["running"]["max"],
                   "kv_mean": t["kv_used_frac_mean"], "kv_max": t["kv_used_frac_max"]}
  flood_t = {"flood", "noisy"}
  others = [r for r in reqs if r["tenant"] not in flood_t]
  flood = [r for r in reqs if r["tenant"] in flood_t]
  prefilled = [r for r in reqs if r["prefill_start_s"] is not None]
  kv = s.get("kv_cache") or {}
  host = kv.get("host_tier")

  def hit(rs):
    p = sum(r["prompt_len"] for r in rs if r["prefill_start_s"] is not None)
    return sum(r["cached_tokens"] for r in rs if r["prefill_start_s"] is not None) / p if p else 0.0

  per_tenant = {}
  for tenant in sorted({r["tenant"] for r in reqs}):
    rs = [r for r in reqs if r["tenant"] == tenant]
    per_tenant[tenant] = {"n": len(rs), "attainment": _attain(rs, ttft, tpot),
                          "ttft_p99": _p99(r["ttft_s"] for r in rs), "hit": hit(rs)}
  return {
      "n": len(reqs), "finished": s["requests"]["finished"],
      "rejected": s["requests"]["rejected"], "failed": s["requests"]["failed"],
      "attainment": s["slo_attainment"],
      "ttft_p50": s["ttft_s"]["p50"], "ttft_p99": s["ttft_s"]["p99"],
      "tpot_p50": s["tpot_s"]["p50"], "tpot_p99": s["tpot_s"]["p99"],
      "others_attainment": _attain(others, ttft, tpot),
      "others_ttft_p99": _p99(r["ttft_s"] for r in others),
      "others_tpot_p99": _p99(r["tpot_s"] for r in others),
      "others_hit": hit(others),
      "flood_attainment": _attain(flood, ttft, tpot),
      "flood_ttft_p99": _p99(r["ttft_s"] for r in flood),
      "handoff_wait_p99": _p99(r["transfer_start_s"] - r["prefill_end_s"] for r in reqs
                               if r["transfer_start_s"] is not None
                               and r["prefill_end_s"] is not None),
      "hit_tokens": kv.get("hit_rate_tokens", 0.0),
      "prefilled_tokens": sum(r["prompt_len"] - r["cached_tokens"] for r in prefilled),
      "preemptions": s.get("preemptions", 0), "evictions": kv.get("evictions", 0),
      "kv_transfer_mib": s["kv_transfer"]["bytes"] / 2 ** 20,
      "kv_transfer_p99": s["kv_transfer"]["p99_s"],
      "host": None if host is None else {
          "hit_pages": host["hit_pages"], "hit_lookups": host["hit_lookups"],
          "lookups": host["lookups"], "offloaded_pages": host["offloaded_pages"],
          "loaded_gib": host["loaded_bytes"] / 2 ** 30,
          "offloaded_gib": host["offloaded_bytes"] / 2 ** 30,
          "load_s_total": host["load_s_total"], "evicted_pages": host["evicted_pages"],
          "refused_pages": host["refused_pages"]},
      "tiers": tiers, "per_tenant": per_tenant, "duration_s": s["duration_s"],
  }


def _ms(x) -> str:
  return "-" if x is None else f"{1e3 * x:.0f}"


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.0f}%"


def _tiers(r: dict) -> str:
  parts = []
  for role, t in r["tiers"].items():
    short = {"prefill": "P", "decode": "D", "colocated": "C"}.get(role, role)
    parts.append(f"{short}: busy {t['busy']:.2f} ({t['busy_min']:.2f}-{t['busy_max']:.2f}), "
                 f"q {t['queue_mean']:.0f}/{t['queue_max']}, run max {t['running_max']}, "
                 f"KV {_pct(t['kv_mean'])}/{_pct(t['kv_max'])}")
  return "<br>".join(parts)


def _host(r: dict) -> str:
  h = r["host"]
  if h is None:
    return "-"
  def size(gib):
    return f"{gib:.1f} GiB" if gib >= 0.1 or gib == 0 else f"{gib * 2 ** 20:.0f} KiB"
  return (f"{h['hit_pages']} pages ({size(h['loaded_gib'])} in, {h['load_s_total']:.2f} s), "
          f"{size(h['offloaded_gib'])} out")


HEADER = ("| flood | host tier | run | TTFT p99 ms | TPOT p99 ms | attainment | others' attainment "
          "(others' TTFT p99 ms) | flood tenant's attainment | P->D hand-off wait p99 ms | "
          "prefix hit (all / others) | "
          "prompt tokens prefilled | preempt. | tiers: busy mean (min-max), queue mean/max, "
          "running max, KV mean/max | host tier: hit pages (loaded, load time), offloaded |")


def table(rows: list[dict]) -> list[str]:
  lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
  for r in rows:
    m = r["metrics"]
    lines.append(
        f"| {r['flood']} | {r['host']} | {r['run']} | {_ms(m['ttft_p99'])} | "
        f"{_ms(m['tpot_p99'])} | {_pct(m['attainment'])} | {_pct(m['others_attainment'])} "
        f"({_ms(m['others_ttft_p99'])}) | {_pct(m['flood_attainment'])} | "
        f"{_ms(m['handoff_wait_p99'])} | "
        f"{_pct(m['hit_tokens'])} / {_pct(m['others_hit'])} | {m['prefilled_tokens']:,} | "
        f"{m['preemptions']} | {_tiers(m)} | {_host(m)} |")
  return lines


def tenant_table(rows: list[dict]) -> list[str]:
  """Per-tenant attainment for the single-tenant flood (and its no-noisy baseline)."""
  picked = [r for r in rows if r["flood"].startswith("single_tenant")]
  if not picked:
    return []
  tenants = sorted({t for r in picked for t in r["metrics"]["per_tenant"]})
  lines = ["| flood | host tier | run | " + " | ".join(tenants) + " |",
           "|---|---|---|" + "---|" * len(tenants)]
  for r in picked:
    pt = r["metrics"]["per_tenant"]
    cells = [f"{_pct(pt[t]['attainment'])} ({_ms(pt[t]['ttft_p99'])})" if t in pt else "-"
             for t in tenants]
    lines.append(f"| {r['flood']} | {r['host']} | {r['run']} | " + " | ".join(cells) + " |")
  return lines


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--real", action="store_true", help="shortened, real JAX engine")
  parser.add_argument("--only", default="", help="comma-separated floods (default: all four)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--extra", action="append", default=[],
                      help="a pdjax.run flag added to every run (repeatable), e.g. "
                           "--extra=--config.cluster.decode.kv_pages=6144")
  parser.add_argument("--reuse", action="store_true",
                      help="only rebuild the tables from runs already in OUT")
  parser.add_argument("--no-baseline", action="store_true",
                      help="skip the background-only / no-noisy baseline runs")
  parser.add_argument("--handoff", default="transfer", choices=("transfer", "host"),
                      help="kv.host_tier_handoff: P -> D through the host tier (host tier on only)")
  args = parser.parse_args()
  out = args.out or ("experiments/floods/run_real" if args.real else "experiments/floods/run")
  floods = [f for f in (args.only.split(",") if args.only else FLOODS)]
  shape = REAL if args.real else SIM
  base = REAL_BASE if args.real else SIM_BASE
  hosts = {"off": [], "on": [f"--config.kv.host_tier_pages={REAL_HOST_PAGES if args.real else HOST_PAGES}"]}
  if args.handoff == "host":   # write-through hand-off: only with the tier
    hosts = {"on": hosts["on"] + ["--config.kv.host_tier_handoff=host"]}
  jobs = []   # (label, trace rows, host name, flags)
  if not args.no_baseline:
    # the others alone: background tenants with no flood (one trace serves long_doc, short and
    # cache_miss: same seed, same background); the single-tenant flood without `noisy`
    if any(f != "single_tenant" for f in floods):
      jobs.append(("background only", build_trace("long_doc", shape, args.seed, False), "off"))
    if "single_tenant" in floods:
      jobs.append(("single_tenant without noisy",
                   build_trace("single_tenant", shape, args.seed, False), "off"))
  for flood in floods:
    rows = build_trace(flood, shape, args.seed)
    for host in hosts:
      jobs.append((flood, rows, host))
  results, walls = [], []
  for label, rows, host in jobs:
    slug = label.replace(" ", "_")
    trace = os.path.join(out, "traces", f"{slug}.jsonl")
    write_trace(trace, rows)
    folder = os.path.join(out, slug, f"host_{host}")
    cmd = [sys.executable, "-m", "pdjax.run", *base, *hosts[host],
           f"--config.workload.path={trace}", f"--config.seed={args.seed}", *args.extra,
           f"--workdir={folder}"]
    t = time.time()
    if not args.reuse:
      print("+", " ".join(cmd), file=sys.stderr, flush=True)
      subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
      with open(os.path.join(folder, "wall_s.txt"), "w") as f:
        f.write(f"{time.time() - t:.1f}\n")
    with open(os.path.join(folder, "wall_s.txt")) as f:
      wall = float(f.read())
    walls.append((label, host, len(rows), wall))
    print(f"  {label} host {host}: {len(rows)} requests, {wall:.0f} s", file=sys.stderr,
          flush=True)
    if os.path.exists(os.path.join(folder, "summary.json")):   # one mode (--extra=...mode=)
      with open(os.path.join(folder, "summary.json")) as f:
        runs = [(json.load(f)["mode"], folder)]
    else:
      runs = [(run, os.path.join(folder, run)) for run in RUNS]
    for run, where in runs:
      results.append({"flood": label, "host": host, "run": run, "metrics": row(where)})
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"rows": results, "walls": walls}, f, indent=1)
  lines = [f"# Floods: {'real engine (shortened)' if args.real else 'simulator'}", "",
           "Command: `python experiments/floods/run.py" + (" --real" if args.real else "")
           + (f" --only={args.only}" if args.only else "")
           + (" --no-baseline" if args.no_baseline else "")
           + (" --handoff=host" if args.handoff == "host" else "")
           + "".join(f" --extra={e}" for e in args.extra) + "`", ""]
  lines += table(results) + [""]
  tt = tenant_table(results)
  if tt:
    lines += ["Per-tenant attainment (TTFT p99 ms), single-tenant flood:", ""] + tt + [""]
  lines += ["Wall time per pdjax.run (all three runs):", ""]
  lines += [f"- {label}, host {host}: {n} requests, {w:.0f} s" for label, host, n, w in walls]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(text)
  if args.out is None and not args.only:   # the default run: the committed copy
    name = "results_real.md" if args.real else "results.md"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "w") as f:
      f.write(text)
  print(text)


if __name__ == "__main__":
  main()
