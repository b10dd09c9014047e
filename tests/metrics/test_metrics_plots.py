"""Tests for pdjax.metrics.plots: every plot writes a non-empty PNG, with data and empty; the
tier timeline of a long run is binned (pdjax.metrics.timeline_bins: exact, and adding up to
timeline.tier_stats), without a bar per step."""

import pytest

pytest.importorskip("matplotlib")

import numpy as np  # noqa: E402

from pdjax.metrics.plots import (plot_goodput_curves, plot_latency_cdfs,  # noqa: E402
                                 plot_tier_timeline)
from pdjax.metrics.timeline import tier_stats  # noqa: E402
from pdjax.metrics.timeline_bins import tier_bins  # noqa: E402
from pdjax.request import Request, Status  # noqa: E402
from test_metrics_timeline import sample, sim_result, step  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path):
  with open(path, "rb") as f:
    data = f.read()
  return data.startswith(PNG) and len(data) > 1000


def request(rid, times, status=Status.FINISHED):
  r = Request(id=rid, arrival_s=0.0, prompt_ids=[1])
  for i, t in enumerate(times):
    r.add_token(i + 3, t)
  r.finish(status, times[-1] if times else 0.0)
  return r


def test_plots_with_data(tmp_path):
  runs = {"colocated": [request("a", [0.1, 0.2, 0.3]), request("b", [0.2, 0.25])],
          "disaggregated": [request("a", [0.05, 0.2]), request("b", [], Status.REJECTED)]}
  p = plot_latency_cdfs(runs, str(tmp_path / "plots" / "cdf.png"))
  assert p == str(tmp_path / "plots" / "cdf.png") and is_png(p)
  curves = {"colocated": [(1, 1.0), (2, 0.8)], "disaggregated": [(2, 0.95), (1, 1.0)]}
  assert is_png(plot_goodput_curves(curves, 0.9, str(tmp_path / "goodput.png")))
  steps = [{"instance": "i0", "role": "prefill", "kind": "prefill", "start_s": 0.0,
            "end_s": 0.5, "num_seqs": 2, "num_tokens": 9}]
  samples = [{"t": 0.0, "instance": "i0", "role": "prefill", "queued": 3, "running": 1,
              "kv_pages_used": 1, "kv_pages_total": 8},
             {"t": 0.5, "instance": "i1", "role": "decode", "queued": 0, "running": 2,
              "kv_pages_used": 1, "kv_pages_total": 8}]
  switches = [{"t": 0.3, "instance": "i0", "from": "prefill", "to": "decode"}]
  assert is_png(plot_tier_timeline(steps, samples, switches, str(tmp_path / "tl.png")))


def test_plots_empty(tmp_path):
  assert is_png(plot_latency_cdfs({}, str(tmp_path / "a.png")))
  assert is_png(plot_latency_cdfs({"colocated": []}, str(tmp_path / "b.png")))
  assert is_png(plot_goodput_curves({}, 0.9, str(tmp_path / "c.png")))
  assert is_png(plot_goodput_curves({"x": []}, 0.9, str(tmp_path / "d.png")))
  assert is_png(plot_tier_timeline([], [], [], str(tmp_path / "e.png")))


def test_tier_timeline_binned_past_the_bound(tmp_path, monkeypatch):
  """More steps than max_exact_steps: per-tier lines per bin, no bar per step."""
  import matplotlib.axes
  from pdjax.metrics import plots

  def no_bars(*args, **kwargs):
    raise AssertionError("a bar per step")

  monkeypatch.setattr(matplotlib.axes.Axes, "broken_barh", no_bars)
  steps, samples = [], []
  for i in range(300):
    for inst, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
      steps.append({"instance": inst, "role": role, "kind": role, "start_s": 0.1 * i,
                    "end_s": 0.1 * i + 0.05, "num_seqs": 1 + i % 4, "num_tokens": 8})
      samples.append({"t": 0.1 * i, "instance": inst, "role": role, "queued": i % 7,
                      "running": 1 + i % 4, "kv_pages_used": i % 50, "kv_pages_total": 64,
                      "kv_pages_cached": i % 3})
  switches = [{"t": 12.0, "instance": "d1", "from": "decode", "to": "prefill"}]
  path = str(tmp_path / "plots" / "tier_timeline.png")
  assert plots.plot_tier_timeline(steps, samples, switches, path, max_exact_steps=100) == path
  assert is_png(path)
  with pytest.raises(AssertionError, match="a bar per step"):   # the exact drawing has them
    plots.plot_tier_timeline(steps, samples, switches, path)


@pytest.mark.parametrize("max_exact_steps", [5000, 1])
def test_tier_timeline_axes_are_labelled_with_units_and_it_has_a_legend(monkeypatch, tmp_path,
                                                                         max_exact_steps):
  """Both drawings (exact per instance, binned per tier): x in seconds, each panel's y named
  with its unit, one legend above the panels naming every line."""
  from pdjax.metrics import plots
  figures = []
  monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
  steps = [step("p0", "prefill", "prefill", 0.0, 0.1, 1), step("d0", "decode", "decode",
                                                               0.1, 3600.0, 1)]
  samples = [sample(0.0, "p0", "prefill", 1, 0, 2, 32), sample(0.1, "p0", "prefill", 0, 0, 0, 32),
             sample(0.1, "d0", "decode", 0, 1, 2, 32)]
  switches = [{"t": 60.0, "instance": "p0", "from": "prefill", "to": "decode"}]
  plot_tier_timeline(steps, samples, switches, str(tmp_path / "t.png"),
                     max_exact_steps=max_exact_steps)
  (fig,) = figures
  panels = [ax for ax in fig.axes if ax.get_ylabel() and ax.yaxis.get_label_position() == "left"]
  assert panels[-1].get_xlabel().startswith("time (s)")
  (legend,) = fig.legends
  labels = [t.get_text() for t in legend.get_texts()]
  if max_exact_steps == 1:   # binned: one panel per quantity, a line per tier
    assert [ax.get_ylabel() for ax in panels] == [
        "queued requests\nper instance", "running sequences\nper instance",
        "KV pages used\n(% of pool)", "busy\n(% of time)"]
    assert labels == ["decode (1 instance)", "prefill (1 instance)", "mean per instance",
                      "max (one instance)", "role switch (1)"]
  else:                      # exact: one panel per instance, KV % on its right axis
    assert [ax.get_ylabel() for ax in panels] == ["d0\n(requests)", "p0\n(requests)"]
    assert [ax.get_ylabel() for ax in fig.axes if ax not in panels] == ["KV (% of pool)"] * 2
    assert labels == ["queued requests", "running sequences", "KV used % (right)",
                      "role switch", "engine step"]


def test_tier_bins_exact():
  """Two 1 s bins: a is sampled in prefill (2, then 6 at 0.5 s) and in decode from 1.5 s; b in
  prefill from 0.5 s; a's prefill step spans the bin edge."""
  steps = [step("a", "prefill", "prefill", 0.25, 1.25, 1), step("a", "decode", "decode", 1.5, 2, 1)]
  samples = [sample(0.0, "a", "prefill", 2, 1, 5, 10), sample(0.5, "a", "prefill", 6, 0, 0, 10),
             sample(1.5, "a", "decode", 1, 1, 10, 10), sample(0.5, "b", "prefill", 0, 0, 0, 0)]
  b = tier_bins(steps, samples, bins=2)
  assert b["edges"].tolist() == [0.0, 1.0, 2.0] and b["width"] == 1.0 and b["end"] == 2.0
  pre, dec = b["roles"]["prefill"], b["roles"]["decode"]
  assert (pre["members"], dec["members"]) == (2, 1)
  assert pre["busy"].tolist() == [0.375, 0.125] and dec["busy"].tolist() == [0.0, 0.5]
  assert pre["instances"].tolist() == [1.5, 1.5] and dec["instances"].tolist() == [0.0, 0.5]
  assert pre["queued"]["mean"].tolist() == pytest.approx([4 / 1.5, 2.0])
  assert pre["queued"]["max"].tolist() == [6.0, 6.0]   # bin 1: a's 6, held from bin 0
  assert pre["kv_used_pct"]["mean"].tolist() == pytest.approx([25 / 1.5, 0.0])
  nan = float("nan")
  assert dec["queued"]["mean"].tolist() == pytest.approx([nan, 1.0], nan_ok=True)
  assert dec["kv_used_pct"]["max"].tolist() == pytest.approx([nan, 100.0], nan_ok=True)
  assert tier_bins([], []) == {}


@pytest.mark.parametrize("name", ["role_switch", "prefix_faults"])
def test_tier_bins_add_up_to_tier_stats(name):
  """Over the whole run the bins' busy time, time-weighted means and maxima are tier_stats'."""
  r = sim_result(name)
  b = tier_bins(r.steps, r.samples, bins=50)
  assert 10 < len(b["edges"]) - 1 <= 50
  lengths = np.diff(np.minimum(b["edges"], b["end"]))
  stats = tier_stats(r.steps, r.samples, b["end"])["roles"]
  for role, tier in b["roles"].items():
    st = stats[role]
    assert tier["members"] == len(st["instances"])
    assert np.sum(tier["busy"] * lengths) * tier["members"] == pytest.approx(
        st["busy_fraction"] * b["end"] * tier["members"], rel=1e-6)
    held = tier["instances"] * lengths
    for q in ("queued", "running"):
      mean = tier[q]["mean"]
      ok = held > 0
      assert np.sum(mean[ok] * held[ok]) / np.sum(held) == pytest.approx(st[q]["mean"],
                                                                        rel=1e-9)
      assert np.nanmax(tier[q]["max"]) == st[q]["max"]
