"""compare.md's conclusion as one family of comparisons (issue 47, item 8).

A line picks its best mode after seeing the data, then says which other modes it beats beyond
the noise: with k modes those are k - 1 claims, and judging each at 95% makes a false "beyond
the noise" far likelier than 5% (about 12% for 3 equal modes). The conclusion now judges every
pair of the modes a line ranks with Holm's correction, and says so. A repeat whose metric has
no value (no finished request) is that mode failing that seed: it cannot win on the others.
"""

import json
import math

import pytest

from pdjax.metrics import intervals
from pdjax.metrics.compare import aggregate_repeats, conclusion

HOLM_NOTE = (
    "- Each line picks its best mode from the data, so its differences are judged as one "
    "family: every pair of the modes it ranks (not only the best against each other: picking "
    "the best compared them all), with Holm's step-down correction holding the chance of any "
    "false \"beyond the noise\" to 5%. A difference is beyond the noise when its Holm-adjusted "
    "p < 0.05 (p from the paired t statistic over the seeds; where modes ran other seeds, the "
    "level at which their intervals stop overlapping); ± shows the unadjusted 95% interval.")


def _runs(ttft_p99_values):
  base = {"ttft_s": {"p50": 0.1, "p99": None}, "tpot_s": {"p50": 0.01, "p99": 0.02},
          "slo_attainment": 1.0, "goodput_rps": 2.0, "output_tok_s": 10.0,
          "requests": {"finished": 4, "total": 4, "rejected": 0}, "compiles": 0,
          "compiles_from_cache": 0, "kv_pages_leaked": 0,
          "kv_transfer": {"count": 0, "bytes": 0, "mean_s": None, "p99_s": None}}
  runs = []
  for v in ttft_p99_values:
    s = json.loads(json.dumps(base))
    s["ttft_s"]["p99"] = v
    runs.append(s)
  return runs


def _modes(values: dict, seeds=(0, 1, 2, 3, 4)) -> dict:
  return {mode: aggregate_repeats(mode, _runs(v), list(seeds)) for mode, v in values.items()}


A = [0.10, 0.20, 0.30, 0.40, 0.50]


def _plus(diffs):
  return [round(x + d, 6) for x, d in zip(A, diffs)]


def test_two_differences_each_beyond_at_95_are_not_beyond_together():
  # a is lowest; b and c are each above it on every seed, paired p 0.031 and 0.040 (each
  # interval excludes 0), b and c indistinguishable (p 0.89). Holm over the three pairs: the
  # smallest p x 3 = 0.092 >= 0.05, so nothing is beyond the noise (each line read "a wins,
  # beyond the noise over b, c" before).
  modes = _modes({"a": A, "b": _plus([0.02, 0.03, 0.01, 0.04, 0.005]),
                  "c": _plus([0.03, 0.00, 0.04, 0.01, 0.035])})
  lines = conclusion(modes)
  assert ("- TTFT p99: within noise: a (300.0 ± 196.3), b (321.0 ± 193.1; difference +21.0 ± "
          "17.8 paired over 5 seeds; Holm-adjusted p 0.092), c (323.0 ± 201.3; difference "
          "+23.0 ± 21.3 paired over 5 seeds; Holm-adjusted p 0.092)") in lines
  assert lines[0] == HOLM_NOTE


def test_the_family_is_every_pair_not_only_the_best_against_the_others():
  # Paired p 0.020 (a, b), 0.040 (a, c), 0.94 (b, c). Holm over the best's two differences only
  # would call both beyond the noise (0.020 x 2 = 0.039, then 0.040 x 1); over all three pairs
  # the first step already fails (0.020 x 3 = 0.059). Simulated with 3 equal modes, 5 paired
  # seeds: any false "beyond" 12% at 95% each, 6.5% with Holm over the best's 2 differences,
  # 4.3% over the 3 pairs.
  modes = _modes({"a": A, "b": _plus([0.02, 0.03, 0.01, 0.04, 0.01]),
                  "c": _plus([0.03, 0.00, 0.04, 0.01, 0.035])})
  line = next(l for l in conclusion(modes) if l.startswith("- TTFT p99:"))
  assert line.startswith("- TTFT p99: within noise: a (300.0 ± 196.3), b (")
  assert "Holm-adjusted p 0.059)" in line and "Holm-adjusted p 0.080)" in line


def test_a_mode_without_a_value_on_a_seed_failed_it():
  # a has no TTFT p99 on seed 2 (no request finished): its two values are the lowest, and it
  # won "beyond the noise" on the marginal intervals of the seeds it had (105 ms vs 510 ms).
  modes = _modes({"a": [0.10, 0.11, None], "b": [0.50, 0.52, 0.51]}, seeds=(0, 1, 2))
  assert ("- TTFT p99: only b has a value on every seed (510.0 ± 24.8); failed: a (no value "
          "on seed 2)") in conclusion(modes)
  # Beside two complete modes it is listed as failed, neither ranked nor counted in the family.
  modes = _modes({"a": [0.10, None, None], "b": [0.50, 0.52, 0.51], "c": [0.60, 0.62, 0.61]},
                 seeds=(5, 6, 7))
  assert ("- TTFT p99: b wins (510.0 ± 24.8), beyond the noise over c (610.0 ± 24.8; "
          "difference +100.0 ± 0.0 paired over 3 seeds); failed: a (no value on seeds 6, 7)"
          ) in conclusion(modes)
  modes = _modes({"a": [None, None], "b": [None, 0.5]}, seeds=(0, 1))
  assert ("- TTFT p99: no mode has a value on every seed: a (no value on seeds 0, 1), b (no "
          "value on seed 0)") in conclusion(modes)
  # One run per mode: a run without the value failed too.
  single = {m: _runs([v])[0] for m, v in (("a", None), ("b", 0.5), ("c", 0.6))}
  assert ("- TTFT p99: b lowest (500.0); c (600.0); failed: a (no value)"
          in conclusion(single))


def test_p_values_and_holm_by_hand():
  # Two-sided p at the table's 97.5% quantiles is 5%.
  for df in (1, 2, 4, 9, 30):
    assert intervals.t_two_sided_p(intervals.t975(df), df) == pytest.approx(0.05, abs=2e-4)
  assert intervals.t_two_sided_p(0.0, 3) == 1.0
  assert intervals.t_two_sided_p(math.inf, 3) == 0.0
  assert intervals.t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)   # Cauchy
  # Holm: sorted p x (m, m - 1, ...), running maximum, capped at 1; in the order given.
  assert intervals.holm([0.0305, 0.0402, 0.8899]) == pytest.approx([0.0915, 0.0915, 0.8899])
  assert intervals.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
  assert intervals.holm([0.6, 0.5]) == [1.0, 1.0]
  assert intervals.holm([]) == []


def test_p_values_match_scipy():
  stats = pytest.importorskip("scipy.stats")
  for df in (1, 2, 3, 4, 7, 10, 29, 120):
    for t in (0.3, 1.0, 2.1, 3.7, 8.0):
      assert intervals.t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(t, df),
                                                             rel=1e-9, abs=1e-14)
