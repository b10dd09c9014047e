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


def _plot_instances(steps: Sequence[dict], samples: Sequence[dict],
                    role_switches: Sequence[dict], path: str) -> str:
  """One panel per instance: queue depth and running batch size over time (step
  functions from the samples), page-pool occupancy (% of the pool held by sequences, and
  % cached but idle when a prefix cache is on) on a right-hand axis, busy intervals as a band
  under the axis, and a vertical marker at every role switch."""
  plt = _pyplot()
  names = sorted({s["instance"] for s in steps} | {s["instance"] for s in samples}
                 | {s["instance"] for s in role_switches})
  if not names:
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.set_xlabel("time (s)")
    _note(ax, "no steps, samples or role switches")
    return _save(fig, path)
  fig, axes = plt.subplots(len(names), 1, sharex=True, squeeze=False,
                           figsize=(10, 1.2 + 2.0 * min(len(names), 16)))
  for ax, name in zip(axes[:, 0], names):
    smp = sorted((s for s in samples if s["instance"] == name), key=lambda s: s["t"])
    if smp:
      ts = [s["t"] for s in smp]
      ax.step(ts, [s["queued"] for s in smp], where="post", label="queued")
      ax.step(ts, [s["running"] for s in smp], where="post", label="running")
      kv_ax = ax.twinx()
      total = [max(1, s["kv_pages_total"]) for s in smp]
      kv_ax.step(ts, [100 * s["kv_pages_used"] / n for s, n in zip(smp, total)], where="post",
                 color="purple", alpha=0.6, linewidth=1, label="KV used %")
      if any(s.get("kv_pages_cached") for s in smp):
        kv_ax.step(ts, [100 * s.get("kv_pages_cached", 0) / n for s, n in zip(smp, total)],
                   where="post", color="green", alpha=0.6, linewidth=1, label="KV cached %")
      kv_ax.set_ylim(0, 105)
      kv_ax.tick_params(labelsize=7)
      kv_ax.legend(loc="upper left", fontsize=7)
    spans = [(s["start_s"], max(0.0, s["end_s"] - s["start_s"]))
             for s in steps if s["instance"] == name]
    if spans:
      ax.broken_barh(spans, (-0.6, 0.4), color="gray", alpha=0.5)
    for sw in role_switches:
      if sw["instance"] == name:
        ax.axvline(sw["t"], color="red", linestyle=":", linewidth=1)
        ax.annotate(f"{sw['from']}->{sw['to']}", (sw["t"], 1.0),
                    xycoords=("data", "axes fraction"), fontsize=7, color="red",
                    rotation=90, va="top", ha="right")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    if smp:
      ax.legend(loc="upper right", fontsize=7)
    elif not spans:
      _note(ax, "no samples")
  axes[-1, 0].set_xlabel("time (s); gray band: engine steps")
  fig.tight_layout()
  return _save(fig, path)


TIER_PANELS = (("queued", "queued per instance"), ("running", "running per instance"),
               ("kv_used_pct", "KV pages used %"), ("busy", "busy %"))


def _plot_tiers(steps: Sequence[dict], samples: Sequence[dict],
                role_switches: Sequence[dict], path: str) -> str:
  """Per tier (role, one color) and bin of timeline_bins.tier_bins: the per-instance mean
  (line) and max (band up to it) of the queue, the running batch and the KV pages used (and
  cached, dashed, when a prefix cache is on); the tier's busy % per bin; role switches as
  dotted red lines."""
  from pdjax.metrics.timeline_bins import tier_bins
  plt = _pyplot()
  binned = tier_bins(steps, samples)
  fig, axes = plt.subplots(len(TIER_PANELS), 1, sharex=True, figsize=(11, 10))
  centers = (binned["edges"][:-1] + binned["edges"][1:]) / 2
  switches = [sw["t"] for sw in role_switches]
  for ax, (key, title) in zip(axes, TIER_PANELS):
    for i, (role, tier) in enumerate(binned["roles"].items()):
      color = f"C{i}"
      if key == "busy":
        n = tier["members"]
        ax.plot(centers, 100 * tier["busy"], color=color,
                label=f"{role} ({n} instance{'s' * (n != 1)})")
        continue
      ax.plot(centers, tier[key]["mean"], color=color, linewidth=1.2, label=f"{role} mean")
      ax.fill_between(centers, tier[key]["mean"], tier[key]["max"], color=color, alpha=0.2,
                      linewidth=0, label=f"{role} max")
      if key == "kv_used_pct" and np.nanmax(tier["kv_cached_pct"]["max"], initial=0) > 0:
        ax.plot(centers, tier["kv_cached_pct"]["mean"], color=color, linestyle="--",
                linewidth=1, label=f"{role} cached % mean")
    if switches:
      ax.vlines(switches, 0, 1, transform=ax.get_xaxis_transform(), colors="red",
                linestyles=":", linewidth=0.8)
    ax.set_ylabel(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=7, ncol=2)
  axes[-1].set_xlabel("time (s)" + (f"; red dotted: {len(switches)} role switches"
                                    if switches else ""))
  fig.suptitle(f"{len(steps)} steps, {len(samples)} samples in {len(centers)} bins of "
               f"{binned['width']:g} s: per-instance mean (line) and max (band) per bin",
               fontsize=10)
  fig.tight_layout()
  return _save(fig, path)


def plot_sweep_metrics(rows: Sequence[dict], path: str) -> str:
  """Per sweep point (x: its label), one line per run: SLO attainment, TTFT p99, TPOT p99."""
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
      points = [(labels.index(r["label"]), r[key]) for r in rows
                if r["run"] == run and r[key] is not None]
      if points:
        ax.plot(*zip(*points), marker="o", label=run)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7)
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
