"""Markdown sections for report.md and the comparison report: tier stats, reject reasons,
preemptions, role switches and the net-benefit table."""

from __future__ import annotations

from collections.abc import Sequence

from pdjax.metrics.path_stats import path_section

MAX_SWITCH_ROWS = 50


def _ms(seconds: float | None) -> str:
  return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _num(value, spec: str) -> str:
  return "-" if value is None else format(value, spec)


def _pct(frac: float | None) -> str:
  return "-" if frac is None else f"{frac * 100:.1f}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]],
             align: str | None = None) -> list[str]:
  """Markdown table lines; align is one char per column ('l' or 'r'), default l then r."""
  align = align or "l" + "r" * (len(header) - 1)
  sep = ["---" if a == "l" else "---:" for a in align]
  return ["| " + " | ".join(r) + " |" for r in (header, sep, *rows)]


def _hist_text(hist: dict[str, int]) -> str:
  return ", ".join(f"{n}x{c}" for n, c in hist.items()) or "-"


def tier_section(tiers: dict) -> list[str]:
  """Per-instance and per-role table, and batch-size histograms per role and step kind."""
  header = ["", "role", "busy %", "queued mean", "queued max", "running mean",
            "running max", "KV pages max", "KV used mean %", "steps p/d/m"]

  def row(name: str, role: str, s: dict) -> list[str]:
    st = s["steps"]
    return [name, role, _pct(s["busy_fraction"]), _num(s["queued"]["mean"], ".2f"),
            _num(s["queued"]["max"], "d"), _num(s["running"]["mean"], ".2f"),
            _num(s["running"]["max"], "d"), _num(s["kv_pages_used_max"], "d"),
            _pct(s["kv_used_frac_mean"]),
            f"{st.get('prefill', 0)}/{st.get('decode', 0)}/{st.get('mixed', 0)}"]

  rows = [row(n, "/".join(s["roles"]), s) for n, s in tiers.get("instances", {}).items()]
  rows += [row(f"**{r}** ({len(s['instances'])})", r, s)
           for r, s in tiers.get("roles", {}).items()]
  lines = ["## Tiers", ""]
  if not rows:
    return lines + ["No engine steps or samples.", ""]
  lines += md_table(header, rows, "ll" + "r" * 8) + ["", "Batch sizes (num_seqs x steps):", ""]
  for role, s in tiers.get("roles", {}).items():
    for kind, hist in s["batch_size_hist"].items():
      if hist:
        lines.append(f"- {role} / {kind}: {_hist_text(hist)}")
  return lines + [""]


def rejects_section(rejects: dict[str, int]) -> list[str]:
  lines = ["## Rejected and failed requests by reason", ""]
  if not rejects:
    return lines + ["None.", ""]
  return lines + md_table(["reason", "count"], [[k.replace("|", "\\|"), str(v)]
                                               for k, v in rejects.items()]) + [""]


def role_switch_section(switches: Sequence[dict]) -> list[str]:
  lines = ["## Role switches", "", f"Role switches: {len(switches)}.", ""]
  if not switches:
    return lines
  rows = [[f"{sw['t']:.3f}", str(sw["instance"]), str(sw["from"]), str(sw["to"])]
          for sw in switches[:MAX_SWITCH_ROWS]]
  lines += md_table(["t (s)", "instance", "from", "to"], rows, "rlll")
  if len(switches) > MAX_SWITCH_ROWS:
    lines.append(f"\n({len(switches) - MAX_SWITCH_ROWS} more not shown)")
  return lines + [""]


def remesh_section(events: Sequence[dict]) -> list[str]:
  """Each re-mesh: when, the tier's layouts (instances x TP), why, its phases' seconds and
  the requests it moved."""
  lines = ["## Re-meshes", ""]
  if not events:
    return lines + ["None.", ""]
  rows = []
  for e in events[:MAX_SWITCH_ROWS]:
    phases = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in e.get("phases_s", {}).items())
    outcome = "ok" if e.get("ok") else f"failed: {e.get('error', '')}"
    rows.append([f"{e['t_s']:.3f}", e["role"], f"{e['from']} -> {e['to']}",
                 str(e["reason"]).replace("|", "\\|"), f"{e['total_s'] * 1e3:.1f}", phases,
                 f"{e['migrated']} / {e['requeued']} / {e['recomputed']}",
                 outcome.replace("|", "\\|")])
  lines += md_table(["t (s)", "tier", "layout", "why", "total (ms)", "phases (ms)",
                     "migrated / requeued / recomputed", "outcome"], rows, "rlllrlrl")
  if len(events) > MAX_SWITCH_ROWS:
    lines.append(f"\n({len(events) - MAX_SWITCH_ROWS} more not shown)")
  return lines + [""]


def extra_sections(extras: dict) -> list[str]:
  """The sections for whichever of tiers, rejects_by_reason, preemptions and
  role_switches extras holds."""
  lines: list[str] = []
  if "preemptions" in extras:
    lines += [f"- Preemptions: {extras['preemptions']}", ""]
  if "tiers" in extras:
    lines += tier_section(extras["tiers"])
  if "rejects_by_reason" in extras:
    lines += rejects_section(extras["rejects_by_reason"])
  if "role_switches" in extras:
    lines += role_switch_section(extras["role_switches"])
  if extras.get("remesh_events"):
    lines += remesh_section(extras["remesh_events"])
  if "kv_cache" in extras:
    lines += kv_pages_section(extras["kv_cache"])
  if extras.get("kv_cache", {}).get("enabled"):
    lines += kv_cache_section(extras["kv_cache"])
  if "kv_layer" in extras:
    lines += kv_layer_section(extras["kv_layer"])
  if "faults" in extras:
    lines += faults_section(extras["faults"], extras.get("num_requests"))
  if "paths" in extras:
    lines += path_section(extras["paths"])
  return lines


FALLBACK_WORDS = 0.01   # above this share of requests falling back, the report says so


def faults_section(f: dict, num_requests: int | None) -> list[str]:
  """Injected faults, recoveries and fallbacks, in words; nothing when nothing happened."""
  injected = f.get("injected") or {}
  fell = f.get("fell_back_requests", 0)
  if not injected and not fell and not f.get("cancelled") and not f.get("transfer_retries") \
      and not f.get("pages_reclaimed_by_lease"):
    return []
  lines = ["## Faults and recovery", ""]
  if injected:
    lines.append("- Injected: " + ", ".join(f"{k} {v}" for k, v in injected.items()))
  lines.append(f"- KV transfer attempts retried: {f.get('transfer_retries', 0)}; transfers "
               f"that succeeded after failing: {f.get('transfers_recovered', 0)}")
  if f.get("instances_killed"):
    failed = (f", restarts that failed: {f['restarts_failed']}" if f.get("restarts_failed")
              else "")
    lines.append(f"- Instances killed: {f['instances_killed']} (restarted: "
                 f"{f.get('instances_restarted', 0)}{failed}); KV pages lost with them: "
                 f"{f.get('pages_lost_with_instances', 0)}")
  if f.get("steps_not_run"):
    lines.append(f"- Steps not run (dispatched ahead on a step that failed): "
                 f"{f['steps_not_run']}")
  if f.get("pages_reclaimed_by_lease"):
    lines.append(f"- KV pages reclaimed by lease: {f['pages_reclaimed_by_lease']}")
  if f.get("cancelled"):
    stages = ", ".join(f"{k} {v}" for k, v in (f.get("cancelled_by_stage") or {}).items())
    lines.append(f"- Cancelled by their client: {f['cancelled']} ({stages})")
  if fell:
    kinds = ", ".join(f"{k} {v}" for k, v in (f.get("fell_back") or {}).items())
    lines.append(f"- Requests that fell back: {fell} ({kinds})")
  if f.get("failed"):
    lines.append("- Failed: " + "; ".join(f"{k} ({v})" for k, v in f["failed"].items()))
  lines.append("")
  if num_requests and fell / num_requests > FALLBACK_WORDS:
    lines += [f"**{100 * fell / num_requests:.1f}% of requests did not take their planned path**"
              f" (more than {FALLBACK_WORDS:.0%}): latency numbers of this run include "
              "recoveries, not the steady state of the configuration.", ""]
  return lines


def kv_pages_section(kv: dict) -> list[str]:
  """How the page pools were used: internal fragmentation and, with named tenants, each
  tenant's peak pages on one instance per tier."""
  if "internal_fragmentation" not in kv:
    return []
  lines = ["## KV pages", "",
           f"- Internal fragmentation (allocated slots no token occupies): "
           f"{_pct(kv['internal_fragmentation'])}%", ""]
  tenants = kv.get("pages_per_tenant") or {}
  if set(tenants) - {"(none)"}:
    roles = sorted({role for per in tenants.values() for role in per})
    rows = [[t] + [str(per.get(role, 0)) for role in roles] for t, per in tenants.items()]
    lines += ["Peak pages a tenant held on one instance:", ""]
    lines += md_table(["tenant"] + roles, rows, "l" + "r" * len(roles)) + [""]
  return lines


def kv_cache_section(kv: dict) -> list[str]:
  """The prefix cache's effect (only when it was on)."""
  lines = ["## Prefix cache", "",
           f"- Prompt tokens served from a prefill-side cache: {_pct(kv['hit_rate_tokens'])}% "
           f"({kv['saved_prefill_tokens']} tokens not recomputed); requests with a hit: "
           f"{_pct(kv['hit_rate_requests'])}%",
           f"- Prompt tokens a decode instance already held (not transferred): "
           f"{kv.get('decode_hit_tokens', 0)}",
           f"- Cached pages evicted for space ({kv.get('eviction') or 'lru'}): "
           f"{kv['evictions']}; expired: {kv.get('expiries', 0)}; still cached at the end: "
           f"{kv.get('cached_pages_at_end', 0)}"]
  for f in kv.get("flushes", []):
    lines.append(f"- Tenant {f['tenant']!r} flushed at {f['t_s']:.3f} s: {f['pages']} cached "
                 f"pages forgotten")
  lines.append("")
  hot = kv.get("hot_prefixes") or []
  if hot:
    rows = [[h["prefix"], h["salt"], str(h["pages"]), str(h["hits"]), str(h["saved_tokens"])]
            for h in hot]
    lines += ["Hot prefixes (deepest page a hit matched):", ""]
    lines += md_table(["prefix", "salt", "pages", "hits", "tokens saved"], rows, "llrrr") + [""]
  if "host_tier" in kv:
    lines += host_tier_section(kv["host_tier"])
  return lines


def host_tier_section(h: dict) -> list[str]:
  """The node's host KV tier (kv.host_tier_pages), beside the device pools' prefix cache."""
  mib = 1 / (1 << 20)
  lines = ["## Host KV tier", "",
           f"- {h['capacity_pages']} pages ({h['policy']}, admission "
           f"{h['admission']}); {h['pages_at_end']} held at the end",
           f"- Offloaded from device pools: {h['offloaded_pages']} pages "
           f"({h['offloaded_bytes'] * mib:.2f} MiB); not admitted: "
           f"{h['not_admitted_pages']}; refused (full of writes in flight): "
           f"{h['refused_pages']}; evicted: {h['evicted_pages']}; flushed: "
           f"{h['flushed_pages']}; lost with their writer: {h['lost_in_flight_pages']}",
           f"- Reload lookups: {h['lookups']}, with a hit: {h['hit_lookups']}; pages reloaded: "
           f"{h['hit_pages']} ({h['loaded_bytes'] * mib:.2f} MiB, {1e3 * h['load_s_total']:.2f} "
           f"ms of copies)", ""]
  if h["pages_per_tenant"]:
    rows = [[salt, str(n)] for salt, n in h["pages_per_tenant"].items()]
    lines += ["Host pages per tenant at the end:", ""]
    lines += md_table(["salt", "pages"], rows, "lr") + [""]
  return lines


def benefit_section(rows: Sequence[dict]) -> list[str]:
  """The net-benefit table (see pdjax.metrics.benefit), ms, one row per bucket; net carries
  its 95% interval over the bucket's requests, and a bucket whose interval holds 0 is
  "within noise"."""
  lines = ["## Net benefit of disaggregation by prompt length", "",
           "net = prefill saved - KV transfer - decode extra, mean over the bucket's requests "
           "± half-width of its 95% interval; positive: disaggregation paid off.", ""]
  if not rows:
    return lines + ["No requests finished in both runs.", ""]
  body = []
  for r in rows:
    hi = "inf" if r["hi"] is None else str(r["hi"])
    hw = r.get("net_s_half_width")
    net = _ms(r["net_s"]) + ("" if hw is None or r["net_s"] is None else f" ± {_ms(hw)}")
    if r["net_s"] is None:
      verdict = "-"
    elif hw is not None and abs(r["net_s"]) <= hw:
      verdict = "within noise"
    else:
      verdict = "disaggregated" if r["net_s"] > 0 else "colocated"
    body.append([f"[{r['lo']}, {hi})", str(r["n"]), _ms(r["prefill_saved_s"]),
                 _ms(r["kv_transfer_s"]), _ms(r["decode_extra_s"]), net, verdict])
  header = ["prompt len", "n", "prefill saved (ms)", "KV transfer (ms)",
            "decode extra (ms)", "net (ms)", "better"]
  return lines + md_table(header, body, "lrrrrrl") + [""]


def kv_layer_section(k: dict) -> list[str]:
  """The KV layer on its own (metrics/kv_layer.py), when the run had the prefix cache."""
  mib = 1 / (1 << 20)
  lines = ["## KV layer", "",
           f"- Pages evicted: device {k['evicted_pages']['device']}, host "
           f"{k['evicted_pages']['host']}; expired: device {k['expired_pages']['device']}; "
           f"flushed: device {k['flushed_pages']['device']}, host {k['flushed_pages']['host']}",
           f"- Bytes offloaded to the host tier {k['offloaded_bytes'] * mib:.2f} MiB, reloaded "
           f"{k['reloaded_bytes'] * mib:.2f} MiB, moved across nodes "
           f"{k['cross_node_bytes'] * mib:.2f} MiB (store reloads "
           f"{k.get('cross_node_reload_bytes', 0) * mib:.2f}, P -> D "
           f"{k.get('cross_node_transfer_bytes', 0) * mib:.2f})",
           f"- Internal fragmentation: {100 * k['internal_fragmentation']:.1f}%; audit lines "
           f"(kv_audit.jsonl): {k['audit_lines']}", ""]
  for salt, hot in k["hot_prefixes_by_tenant"].items():
    rows = [[h["prefix"], str(h["tokens"]), str(h["hits"])] for h in hot]
    lines += [f"Hot prefixes of {salt}:", ""]
    lines += md_table(["prefix", "tokens", "hits"], rows, "lrr") + [""]
  return lines
