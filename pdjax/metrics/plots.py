"""PNG plots of a run or a comparison: latency CDFs, goodput curves, tier timelines.

matplotlib (Agg backend, no display) is imported on first use, so the rest of
pdjax.metrics works without it. Every function returns the path it wrote and draws an
empty figure with a note, rather than failing, when it has nothing to plot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pdjax.request import Request, Status


def _pyplot():
  import matplotlib
  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt
  return plt


def _save(fig, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  _pyplot().close(fig)
  return path


def _note(ax, text: str = "no data") -> None:
  ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes,
          color="gray")


def _cdf(ax, values_ms: Sequence[float], label: str) -> bool:
  if not values_ms:
    return False
  xs = sorted(values_ms)
  ys = [(i + 1) / len(xs) for i in range(len(xs))]
  ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")
  return True


def plot_latency_cdfs(runs: dict[str, Sequence[Request]], path: str) -> str:
  """TTFT and TPOT CDFs (ms) of each run's finished requests, one line per mode."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for ax, name, get in ((axes[0], "TTFT", lambda r: r.ttft_s),
                        (axes[1], "TPOT", lambda r: r.tpot_s)):
    drawn = False
    for mode, reqs in runs.items():
      vals = [get(r) * 1e3 for r in reqs
              if r.status == Status.FINISHED and get(r) is not None]
      drawn |= _cdf(ax, vals, mode)
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of finished requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{name} CDF")
    ax.grid(alpha=0.3)
    if drawn:
      ax.legend(loc="lower right")
    else:
      _note(ax)
  fig.tight_layout()
  return _save(fig, path)


def plot_goodput_curves(curves: dict[str, Sequence[tuple[float, float]]], target: float,
                        path: str) -> str:
  """SLO attainment vs offered rate, one line per mode, and the target as a dashed line."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  drawn = False
  for mode, pts in curves.items():
    pts = sorted((float(r), float(a)) for r, a in pts)
    if pts:
      ax.plot([r for r, _ in pts], [a for _, a in pts], marker="o", label=mode)
      drawn = True
  ax.axhline(target, color="red", linestyle="--", linewidth=1,
             label=f"target {target:g}")
  ax.set_xlabel("request rate (req/s)")
  ax.set_ylabel("SLO attainment")
  ax.set_ylim(0, 1.05)
  ax.set_title("SLO attainment vs rate")
  ax.grid(alpha=0.3)
  ax.legend(loc="lower left")
  if not drawn:
    _note(ax)
  fig.tight_layout()
  return _save(fig, path)


EXACT_MAX_STEPS = 5_000   # plot_tier_timeline draws every step and sample up to this many


def plot_tier_timeline(steps: Sequence[dict], samples: Sequence[dict],
                       role_switches: Sequence[dict], path: str, *,
                       max_exact_steps: int = EXACT_MAX_STEPS) -> str:
  """The run's tiers over time. Up to max_exact_steps steps (and 4x as many samples): one
  panel per instance with every sample and step (_plot_instances). Past that, binned
  (pdjax.metrics.timeline_bins): one panel per quantity, a line per tier (role)."""
  if len(steps) <= max_exact_steps and len(samples) <= 4 * max_exact_steps:
    return _plot_instances(steps, samples, role_switches, path)
  return _plot_tiers(steps, samples, role_switches, path)


BAND_BELOW = 0.17   # the steps' band lies below 0 requests, in this fraction of the top
ZERO_AT = BAND_BELOW / (BAND_BELOW + 1.08)   # where 0 sits on the axis, as a fraction


def _plot_instances(steps: Sequence[dict], samples: Sequence[dict],
                    role_switches: Sequence[dict], path: str) -> str:
  """One panel per instance: queued requests and running sequences over time (step functions
  from the samples, left axis), page-pool occupancy (% of the pool held by sequences, and %
  cached but idle when a prefix cache is on; right axis), engine steps as a gray band under
  0 (an edge keeps a step visible at any time scale), a dotted red line at every role switch;
  one legend for all panels, above them."""
  from matplotlib.ticker import MaxNLocator
  plt = _pyplot()
  steps, samples = list(steps), list(samples)   # (dicts: read once per instance below)
  names = sorted({s["instance"] for s in steps} | {s["instance"] for s in samples}
                 | {s["instance"] for s in role_switches})
  if not names:
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.set_xlabel("time (s)")
    _note(ax, "no steps, samples or role switches")
    return _save(fig, path)
  height = 1.6 + 2.0 * min(len(names), 16)
  fig, axes = plt.subplots(len(names), 1, sharex=True, squeeze=False, figsize=(10, height))
  cached = any(s.get("kv_pages_cached") for s in samples)
  for ax, name in zip(axes[:, 0], names):
    smp = sorted((s for s in samples if s["instance"] == name), key=lambda s: s["t"])
    top = max([1] + [max(s["queued"], s["running"]) for s in smp])
    if smp:
      ts = [s["t"] for s in smp]
      ax.step(ts, [s["queued"] for s in smp], where="post", color="C0")
      ax.step(ts, [s["running"] for s in smp], where="post", color="C1")
      kv_ax = ax.twinx()
      total = [max(1, s["kv_pages_total"]) for s in smp]
      kv_ax.step(ts, [100 * s["kv_pages_used"] / n for s, n in zip(smp, total)], where="post",
                 color="purple", alpha=0.6, linewidth=1)
      if cached:
        kv_ax.step(ts, [100 * s.get("kv_pages_cached", 0) / n for s, n in zip(smp, total)],
                   where="post", color="green", alpha=0.6, linewidth=1)
      kv_ax.set_ylim(-ZERO_AT * 105 / (1 - ZERO_AT), 105)   # 0 % level with 0 requests
      kv_ax.set_yticks([0, 25, 50, 75, 100])
      kv_ax.set_ylabel("KV (% of pool)", fontsize=8)
      kv_ax.tick_params(labelsize=7)
    spans = [(s["start_s"], max(0.0, s["end_s"] - s["start_s"]))
             for s in steps if s["instance"] == name]
    if spans:
      ax.broken_barh(spans, (-0.14 * top, 0.08 * top), facecolor="gray", edgecolor="gray",
                     linewidth=0.5)
    for sw in role_switches:
      if sw["instance"] == name:
        ax.axvline(sw["t"], color="red", linestyle=":", linewidth=1)
        ax.annotate(f"{sw['from']}->{sw['to']}", (sw["t"], 1.0),
                    xycoords=("data", "axes fraction"), fontsize=7, color="red",
                    rotation=90, va="top", ha="right")
    ax.set_ylim(-BAND_BELOW * top, 1.08 * top)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))   # counts: no tick below 0
    ax.set_ylabel(f"{name}\n(requests)")
    ax.grid(alpha=0.3)
    if not smp and not spans:
      _note(ax, "no samples")
  axes[-1, 0].set_xlabel("time (s)")
  handles = _legend_lines([("C0", "-", "queued requests"), ("C1", "-", "running sequences"),
                           ("purple", "-", "KV used % (right)")]
                          + [("green", "-", "KV cached, idle % (right)")] * cached
                          + [("red", ":", "role switch")] * bool(role_switches))
  handles.append(_legend_patch("gray", "engine step"))
  return _save_with_legend(fig, handles, path, ncol=len(handles))


def _legend_lines(entries: Sequence[tuple[str, str, str]]) -> list:
  """Legend handles: a line of each (color, linestyle, label)."""
  from matplotlib.lines import Line2D
  return [Line2D([], [], color=c, linestyle=ls, label=label) for c, ls, label in entries]


def _legend_patch(color: str, label: str):
  from matplotlib.patches import Patch
  return Patch(facecolor=color, edgecolor=color, label=label)


LEGEND_ROW_IN = 0.25   # inches above the panels per row of the figure legend


def _save_with_legend(fig, handles: list, path: str, ncol: int = 3) -> str:
  """Saves fig with one legend for all its panels, centred above them."""
  rows = -(-len(handles) // ncol)
  fig.legend(handles=handles, loc="upper center", ncol=ncol, fontsize=8, frameon=False)
  fig.tight_layout(rect=(0, 0, 1, 1 - rows * LEGEND_ROW_IN / fig.get_figheight()))
  return _save(fig, path)


TIER_PANELS = (("queued", "queued requests\nper instance"),
               ("running", "running sequences\nper instance"),
               ("kv_used_pct", "KV pages used\n(% of pool)"), ("busy", "busy\n(% of time)"))


def _plot_tiers(steps: Sequence[dict], samples: Sequence[dict],
                role_switches: Sequence[dict], path: str) -> str:
  """Per tier (role, one color) and bin of timeline_bins.tier_bins: the per-instance mean
  (solid) and the max held (dotted) of the queue, the running batch and the KV pages used
  (and the mean cached, dashed, when a prefix cache is on); the tier's busy % per bin; role
  switches as dotted red lines; one legend above the panels."""
  from pdjax.metrics.timeline_bins import tier_bins
  plt = _pyplot()
  binned = tier_bins(steps, samples)
  fig, axes = plt.subplots(len(TIER_PANELS), 1, sharex=True, figsize=(11, 10.5))
  centers = (binned["edges"][:-1] + binned["edges"][1:]) / 2
  switches = [sw["t"] for sw in role_switches]
  roles, cached = [], False
  for ax, (key, title) in zip(axes, TIER_PANELS):
    for i, (role, tier) in enumerate(binned["roles"].items()):
      color = f"C{i}"
      if key == "busy":
        ax.plot(centers, 100 * tier["busy"], color=color, linewidth=1.2)
        n = tier["members"]
        roles.append((color, "-", f"{role} ({n} instance{'s' * (n != 1)})"))
        continue
      ax.plot(centers, tier[key]["mean"], color=color, linewidth=1.2)
      ax.plot(centers, tier[key]["max"], color=color, linewidth=0.8, linestyle=":")
      if key == "kv_used_pct" and np.nanmax(tier["kv_cached_pct"]["max"], initial=0) > 0:
        ax.plot(centers, tier["kv_cached_pct"]["mean"], color=color, linestyle="--",
                linewidth=1)
        cached = True
    if switches:
      ax.vlines(switches, 0, 1, transform=ax.get_xaxis_transform(), colors="red",
                linestyles=":", linewidth=0.8)
    ax.set_ylabel(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
  axes[-1].set_xlabel(f"time (s); {len(steps)} steps and {len(samples)} samples in "
                      f"{len(centers)} bins of {binned['width']:g} s")
  handles = _legend_lines(roles + [("black", "-", "mean per instance"),
                                   ("black", ":", "max (one instance)")]
                          + [("black", "--", "KV pages cached, idle: mean")] * cached
                          + [("red", ":", f"role switch ({len(switches)})")] * bool(switches))
  return _save_with_legend(fig, handles, path, ncol=4)


def plot_sweep_metrics(rows: Sequence[dict], path: str) -> str:
  """Per sweep point (x: its label), one line per run: SLO attainment, TTFT p99, TPOT p99
  (the mean over repeats, with the 95% interval as an error bar when the row has `<key>_hw`)."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  labels = list(dict.fromkeys(r["label"] for r in rows))
  panels = (("slo_attainment", "SLO attainment"), ("ttft_p99_ms", "TTFT p99 (ms)"),
            ("tpot_p99_ms", "TPOT p99 (ms)"))
  for ax, (key, title) in zip(axes, panels):
    ax.set_title(title)
    if not rows:
      _note(ax)
      continue
    for run in dict.fromkeys(r["run"] for r in rows):
      points = [(labels.index(r["label"]), r[key], r.get(f"{key}_hw") or 0.0) for r in rows
                if r["run"] == run and r[key] is not None]
      if points:
        x, y, err = zip(*points)
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=run)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7)
  fig.tight_layout()   # the rotated point labels stay inside the figure
  return _save(fig, path)


PLAN_COLORS = {"disaggregated": "tab:green", "colocated": "tab:blue", "chunked": "tab:orange"}


def plot_plan(rows: Sequence[tuple[str, str, float]], path: str, top: int = 25) -> str:
  """Per-chip goodput of the best `top` placements (rows: placement, run, per-chip rate),
  ranked, one color per run kind."""
  plt = _pyplot()
  rows = list(rows)[:top]
  fig, ax = plt.subplots(figsize=(8, 0.3 * max(len(rows), 4) + 1.2))
  if rows:
    labels = [f"{run[:5]} {placement}" for placement, run, _ in rows]
    ax.barh(range(len(rows)), [v for _, _, v in rows],
            color=[PLAN_COLORS.get(run, "gray") for _, run, _ in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
  else:
    _note(ax)
  ax.set_xlabel("goodput per chip (req/s meeting the SLO target)")
  ax.set_title("placements ranked by per-chip goodput")
  ax.grid(alpha=0.3, axis="x")
  fig.tight_layout()
  return _save(fig, path)


def plot_kv_store(samples: Sequence[dict], capacity_pages: int, path: str,
                  node_of: dict | None = None) -> str:
  """The nodes' host KV stores (kv.host_tier_pages) over the run: pages held, one line per
  node (node_of: {instance: node}, cluster.nodes > 1), against a node's capacity (the
  samples' host_tier_pages)."""
  from pdjax.metrics.kv_layer import host_tier_pages
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(8, 3))
  tracks = host_tier_pages(samples, node_of)
  if tracks:
    for node, (t, pages) in tracks.items():
      ax.step(t, pages, where="post",
              label="pages held" if node_of is None else f"node {node}: pages held")
    ax.axhline(capacity_pages, color="gray", linestyle="--", label=f"capacity {capacity_pages}")
    ax.legend(loc="lower right")
  else:
    _note(ax, "no host KV tier")
  ax.set_xlabel("time (s)")
  ax.set_ylabel("host tier pages")
  ax.set_title("KV store occupancy")
  fig.tight_layout()
  return _save(fig, path)
