"""Tests for pdjax.metrics.plots: every plot writes a non-empty PNG, with data and empty."""

import pytest

pytest.importorskip("matplotlib")

from pdjax.metrics.plots import (plot_goodput_curves, plot_latency_cdfs,  # noqa: E402
                                 plot_tier_timeline)
from pdjax.request import Request, Status  # noqa: E402

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
