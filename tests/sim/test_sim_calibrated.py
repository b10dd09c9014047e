"""The calibrated cost model: fits, padding to buckets, host sharing, profile checks, the shipped
profile, the calibrate CLI, and the jax and sim backends agreeing on what was served."""

import dataclasses
import json
import subprocess
import sys

import pytest

from pdjax import config as config_lib
from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import PRESETS
from pdjax.scheduler.clock import ManualClock
from pdjax.sim import calibrated
from pdjax.sim.calibrated import StepFit, fit_step
from pdjax.sim.host import SharedHost, slowdown_at
from pdjax.sim.instance import SimPending


def test_fit_step_recovers_bucket_times_and_the_context_term():
  base = {64: 0.010, 128: 0.020, 256: 0.050}
  points = [(b, u, base[b] + 2e-8 * u) for b in base for u in (0, 1000, 5000)]
  fit, err = fit_step(points)
  assert fit.sizes == (64.0, 128.0, 256.0)
  assert fit.base_s == pytest.approx((0.010, 0.020, 0.050))
  assert fit.per_unit_s == pytest.approx(2e-8)
  assert err == pytest.approx(0.0, abs=1e-9)
  # A negative slope is pinned to zero, not fitted (times never fall with more context).
  fit, _ = fit_step([(64, 0, 0.02), (64, 1000, 0.01)])
  assert fit.per_unit_s == 0.0 and fit.base_s == pytest.approx((0.015,))


def test_step_fit_interpolates_and_extrapolates_between_buckets():
  fit = StepFit((64.0, 128.0, 256.0), (0.01, 0.02, 0.05), 1e-6)
  assert fit(64) == pytest.approx(0.01)
  assert fit(96) == pytest.approx(0.015)          # halfway between 64 and 128
  assert fit(512) == pytest.approx(0.11)          # the 128-256 slope carried on
  assert fit(32) == pytest.approx(0.005)
  assert fit(0) == 0.0                            # never negative
  assert fit(64, 1000) == pytest.approx(0.011)


def _profile(tp=2, host=None):
  mcfg = PRESETS["tiny"]
  zero = {"base_s": 0.0, "per_seq_s": 0.0, "waited_share": 1.0}
  fits = {"prefill": StepFit((64.0, 512.0), (0.01, 0.08), 0.0).to_json(),
          "decode": StepFit((4.0, 16.0), (0.004, 0.006), 0.0).to_json(),
          "transfer": StepFit((16384.0, 32768.0), (0.001, 0.002), 0.0).to_json()}
  return {"format": calibrated.FORMAT, "model": json.loads(json.dumps(dataclasses.asdict(mcfg))),
          "model_name": "tiny", "dtype": "float32", "kv_bytes_per_token": 1024.0,
          "instances": {str(tp): fits},
          "host_s": host or {"prefill": zero, "decode": zero}}


def test_calibrated_cost_pads_to_the_run_buckets():
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(64, 512),
                       max_prefill_seqs=4, decode_buckets=(4, 16))
  cost = calibrated.cost_from_profile(_profile(), 2, opts)
  assert cost.prefill_s([(33, 0)]) == pytest.approx(0.01)      # 33 tokens run the 64 bucket
  assert cost.prefill_s([(30, 0), (35, 0)]) == pytest.approx(0.08)   # 65 -> 512
  assert cost.decode_s([100, 200, 300]) == pytest.approx(0.004)
  assert cost.decode_s([100] * 5) == pytest.approx(0.006)
  # transfers move exactly their pages (in bucket-sized pieces), like the engine
  assert cost.moved_pages(3) == 3 and cost.kv_bytes_per_token() == 1024.0
  assert cost.transfer_s(32768) == pytest.approx(0.002)


def test_calibrated_cost_charges_the_profiles_host_time_per_step():
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(64, 512),
                       max_prefill_seqs=4, decode_buckets=(4, 16))
  host = {"prefill": {"base_s": 0.001, "per_seq_s": 0.0002, "waited_share": 1.0},
          "decode": {"base_s": 0.0005, "per_seq_s": 0.0001, "waited_share": 0.5}}
  cost = calibrated.cost_from_profile(_profile(host=host), 2, opts)
  # prefill: 0.01 (64 bucket) + 0.001 + 0.0002 * 1 row; 2 rows: 0.08 + 0.001 + 0.0004
  assert cost.prefill_s([(33, 0)]) == pytest.approx(0.0112, abs=1e-15)
  assert cost.prefill_s([(30, 0), (35, 0)]) == pytest.approx(0.0814, abs=1e-15)
  # decode: 0.004 + (0.0005 + 0.0001 * 3) * 0.5 waited; 5 rows: 0.006 + 0.0005 * 2 ... * 0.5
  assert cost.decode_s([100, 200, 300]) == pytest.approx(0.0044, abs=1e-15)
  assert cost.decode_s([100] * 5) == pytest.approx(0.0065, abs=1e-15)
  assert cost.transfer_s(32768) == pytest.approx(0.002)      # transfers carry no host term


def test_the_profiles_stream_group_time_is_charged_per_group():
  """A profile's stream_group_s reaches the cost (none without it), and a streamed prefill
  step on a calibrated SimInstance lasts (G - 1) groups' worth longer."""
  from pdjax.scheduler.clock import ManualClock
  from pdjax.sim.instance import SimInstance
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(64, 512),
                       max_prefill_seqs=4, decode_buckets=(4, 16), stream_layers=2)
  assert calibrated.cost_from_profile(_profile(), 2, opts).stream_group_s == 0.0
  profile = dict(_profile(), stream_group_s={"seconds": 0.003, "groups": 2, "tokens": 512,
                                             "one_program_s": 0.08, "streamed_s": 0.083})
  cost = calibrated.cost_from_profile(profile, 2, opts)
  assert cost.stream_group_s == 0.003
  clock = ManualClock()
  make = lambda name, role: SimInstance(name, role, cost, opts, clock=clock, vocab_size=512,
                                        eos_ids=(2,), num_layers=2)
  src, dst = make("prefill-0", "prefill"), make("decode-0", "decode")
  pages, dpages = src.tables.allocate("a", 33), dst.tables.allocate("a", 34)[:3]
  seqs = [([5] * 33, 0, pages, 0.0, 0, 1.0)]
  plain = src.prefill(seqs).end_s - clock.now()
  streamed = src.prefill(seqs, streams=[(dst, pages, dpages)]).end_s - clock.now()
  assert plain == pytest.approx(0.01) and streamed == pytest.approx(0.013)


def test_a_run_with_more_prefill_rows_takes_the_ragged_programs_fit():
  """A chunked run's prefill program has a row per decode (17 here, 4 in the plain one): its
  prefill and mixed steps cost what the ragged program was measured at."""
  profile = _profile()
  profile["engine"] = {"max_prefill_seqs": 4, "ragged_prefill_seqs": 17}
  profile["instances"]["2"]["prefill_ragged"] = StepFit((64.0, 512.0), (0.02, 0.09)).to_json()
  plain = EngineOptions(page_size=16, num_pages=64, max_model_len=512,
                        prefill_buckets=(64, 512), max_prefill_seqs=4, decode_buckets=(4, 16))
  ragged = dataclasses.replace(plain, max_prefill_seqs=17)
  assert calibrated.cost_from_profile(profile, 2, plain).prefill_s([(33, 0)]) == 0.01
  assert calibrated.cost_from_profile(profile, 2, ragged).prefill_s([(33, 0)]) == 0.02
  assert calibrated.cost_from_profile(profile, 2, ragged).decode_s([5]) == 0.004
  del profile["instances"]["2"]["prefill_ragged"]     # none measured: the plain fit
  assert calibrated.cost_from_profile(profile, 2, ragged).prefill_s([(33, 0)]) == 0.01


def test_a_profile_without_host_time_is_refused(tmp_path):
  old = _profile()
  old["format"] = "pdjax.sim.profile/2"
  del old["host_s"]
  path = str(tmp_path / "old.json")
  calibrated.save_profile(path, old)
  with pytest.raises(calibrated.ProfileError) as e:
    calibrated.load_profile(path)
  assert str(e.value) == (f"sim.profile={path!r} has no host time (pdjax.sim.profile/2, made "
                          "before pdjax measured it); re-run python -m pdjax.calibrate")


def _record(inst, kind, rows, wait, dispatch, readback, ahead=False):
  return {"instance": inst, "kind": kind, "num_seqs": rows, "host_wait_s": wait,
          "dispatch_s": dispatch, "readback_s": readback, "ahead": ahead}


def test_host_time_fit_recovers_a_known_value_from_step_records():
  """Host time 0.3 ms + 0.05 ms per row on decode steps, 1 ms + 0.1 ms per row on prefill
  and mixed steps; each step's wait also holds the previous step's readback and its own
  dispatch, which the fit must take out. The first step of an instance (no previous
  readback), a step after an idle spell (wait 0) and one dispatched ahead are not samples."""
  steps, truth = [], {"decode": (0.0003, 0.00005), "prefill": (0.001, 0.0001)}
  for i in range(40):
    for inst in ("d-0", "d-1"):
      kind = ("decode", "prefill", "mixed")[i % 3] if inst == "d-0" else "decode"
      rows = 1 + i % 7
      base, per = truth["decode" if kind == "decode" else "prefill"]
      readback_before = 0.0001 * (1 + i % 2) if i else 0.0
      dispatch = 0.0007 + 0.00002 * rows
      wait = 0.0 if i == 0 else readback_before + dispatch + base + per * rows
      if i == 20:
        wait = 0.0                                   # after an idle spell: no sample
      steps.append(_record(inst, kind, rows, wait, dispatch, 0.0001 * (1 + (i + 1) % 2)))
  steps.append(_record("d-1", "decode", 4, 0.0, 0.001, 0.0001, ahead=True))
  samples = calibrated.host_samples(steps)
  assert (len(samples["decode"]), len(samples["prefill"])) == (38 + 13, 25)
  assert (samples["decode_ahead"], samples["prefill_ahead"]) == (1, 0)
  decode = calibrated.fit_host(samples["decode"], samples["decode_ahead"])
  assert decode["base_s"] == pytest.approx(0.0003, abs=1e-12)
  assert decode["per_seq_s"] == pytest.approx(0.00005, abs=1e-12)
  assert (decode["steps"], decode["ahead"]) == (51, 1)
  assert decode["waited_share"] == pytest.approx(51 / 52)
  prefill = calibrated.fit_host(samples["prefill"])
  assert prefill["base_s"] == pytest.approx(0.001, abs=1e-12)
  assert prefill["per_seq_s"] == pytest.approx(0.0001, abs=1e-12)
  assert prefill["waited_share"] == 1.0
  # The whole waits are kept too (dispatch and readback included), for reference.
  assert max(s for _, s in samples["decode_wait"]) > 0.0003 + 0.00005 * 7 + 0.0007
  # The mean, not the median: a slow step (a GC pause) counts. Means 0.002 s at 2 rows (one
  # step of 0.004 among three) and 0.003 s at 4 rows: 0.001 + 0.0005 per row.
  assert calibrated.fit_host([(2, 0.001), (2, 0.001), (2, 0.004), (4, 0.003)]) == pytest.approx(
      {"base_s": 0.001, "per_seq_s": 0.0005, "waited_share": 1.0, "steps": 4, "ahead": 0},
      abs=1e-15)
  assert calibrated.fit_host([]) == {"base_s": 0.0, "per_seq_s": 0.0, "waited_share": 1.0,
                                     "steps": 0, "ahead": 0}
  # Fewer than MIN_HOST_STEPS (10) waited steps of a kind: both kinds' steps make its fit.
  few = {"prefill": [(1, 0.004)] * 9, "decode": [(1, 0.001)] * 12, "prefill_ahead": 0,
         "decode_ahead": 3, "prefill_wait": [(1, 0.005)] * 9, "decode_wait": [(1, 0.002)] * 12}
  host, wait = calibrated.fit_host_kinds(few)
  assert host["prefill"]["steps"] == 21     # (9 * 0.004 + 12 * 0.001) / 21
  assert host["prefill"]["base_s"] == pytest.approx(0.048 / 21, abs=1e-15)
  assert (host["decode"]["steps"], host["decode"]["base_s"]) == (12, pytest.approx(0.001))
  assert host["decode"]["waited_share"] == 12 / 15
  assert wait["prefill"]["steps"] == 21      # (9 * 0.005 + 12 * 0.002) / 21
  assert wait["prefill"]["base_s"] == pytest.approx(0.069 / 21, abs=1e-15)


def test_profile_checks_are_one_line_errors(tmp_path):
  path = str(tmp_path / "p.json")
  calibrated.save_profile(path, _profile())
  profile = calibrated.load_profile(path)
  model = dataclasses.asdict(PRESETS["tiny"])
  calibrated.check_profile(profile, path, model=model, dtype="float32", tps={2})
  with pytest.raises(calibrated.ProfileError) as e:
    calibrated.check_profile(profile, path, model=model, dtype="float32", tps={2, 4})
  assert str(e.value) == f"sim.profile={path!r} has no fit for tp=[4] (it has tp=[2])"
  with pytest.raises(calibrated.ProfileError) as e:
    calibrated.check_profile(profile, path, model=model, dtype="bfloat16", tps={2})
  assert str(e.value) == (f"sim.profile={path!r} was calibrated for another model or dtype "
                          "(tiny, float32); run python -m pdjax.calibrate for this one")
  (tmp_path / "bad.json").write_text("{}")
  with pytest.raises(calibrated.ProfileError) as e:
    calibrated.load_profile(str(tmp_path / "bad.json"))
  assert str(e.value).endswith(f"is not a {calibrated.FORMAT} profile")


def test_shared_host_by_hand():
  """A 10 s prefill and a 1 s decode start together. The decode runs 5x slower beside a
  prefill (table[1][0] = 5), the prefill unslowed beside a decode (table[0][1] = 1): the
  decode ends at 5 s, the prefill at 10 s. A second decode starting at 5 s alone-with-the-
  prefill again takes 5 s; once the prefill ends it runs at full speed."""
  clock = ManualClock()
  host = SharedHost(clock, {"prefill": [[1.0, 1.0], [2.0]], "decode": [[1.0, 3.0], [5.0]]})
  pre, dec = SimPending(clock, 0, [], host), SimPending(clock, 0, [], host)
  host.start(pre, 10.0, "prefill")
  host.start(dec, 1.0, "decode")
  assert (pre.end_s, dec.end_s) == (10.0, 5.0)
  dec.result()
  assert clock.now() == 5.0 and pre.end_s == 10.0
  dec2 = SimPending(clock, 0, [], host)
  host.start(dec2, 2.0, "decode")                 # 1 s of work done by 10 s, 1 s left after
  assert dec2.end_s == pytest.approx(15.0)        # while beside the prefill: 2 s takes 10 s
  pre.result()
  assert clock.now() == 10.0 and dec2.end_s == pytest.approx(11.0)
  assert slowdown_at([[1.0, 3.0], [5.0]], 0, 3) == pytest.approx(1.0 + 2.0 * 3)


def test_shipped_profile_serves_the_default_config():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.backend, cfg.sim.cost_model = "sim", "calibrated"
  profile = config_lib.sim_profile(cfg, config_lib.validate(cfg))
  assert profile["dtype"] == "float32" and set(profile["instances"]) == {"2"}
  assert set(profile["host_sharing"]) == {"prefill", "decode"}
  assert set(profile["host_s"]) == {"prefill", "decode"} and profile["format"] == calibrated.FORMAT
  cfg.cluster.decode.tp = 4
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value).endswith("has no fit for tp=[4] (it has tp=[2])")


def test_a_latency_profile_gives_the_engines_instances_a_cost_model(monkeypatch):
  """scheduler.latency_profile (the jax backend's slo_headroom predictions): checked as
  sim.profile is, errors naming its own key; the run's instances carry its cost model."""
  from pdjax.runner import build
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  mcfg = config_lib.validate(cfg)
  assert config_lib.latency_profile(cfg, mcfg) is None                 # unset: measured rates
  cfg.scheduler.latency_profile = config_lib.DEFAULT_PROFILE
  assert config_lib.latency_profile(cfg, mcfg)["dtype"] == "float32"
  cfg.backend = "sim"
  assert config_lib.latency_profile(cfg, mcfg) is None                 # the sim has its own
  cfg.backend, cfg.cluster.decode.tp = "jax", 4
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == (f"scheduler.latency_profile={config_lib.DEFAULT_PROFILE!r} has no "
                          "fit for tp=[4] (it has tp=[2])")
  cfg.cluster.decode.tp = 2
  import types
  fakes = lambda tiers, mcfg, params, opts, **_: [   # (the engine's own build is tested
      types.SimpleNamespace(tp=tp, opts=opts) for _, n, tp in tiers for _ in range(n)]  # elsewhere)
  monkeypatch.setattr("pdjax.engine.cluster.build_instances", fakes)
  _, instances, _ = build.build_run(cfg, mcfg, "disaggregated", None)
  assert [type(i.cost).__name__ for i in instances] == ["CalibratedCost"] * 4
  assert [i.shares_host for i in instances] == [True] * 4      # (CPU: one host's cores)
  assert instances[0].cost.prefill_buckets == tuple(cfg.scheduler.prefill_buckets)


def _run(args, timeout=600):
  proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


@pytest.mark.slow
def test_calibrate_cli_then_sim_matches_jax_request_for_request(tmp_path):
  """Calibrate on the smoke config, then serve one small workload on both backends: the same
  requests finish with the same token counts (ignore_eos: simulated tokens never end early)."""
  smoke = ["--config=configs/default.py:smoke", "--config.mode=disaggregated",
           "--config.workload.ignore_eos=True", "--config.progress=False"]
  profile = tmp_path / "profile.json"
  out = _run(["pdjax.calibrate", "--config=configs/default.py:smoke", f"--out={profile}",
              "--repeats=1", "--rounds=2"]).stdout
  assert f"profile: {profile}" in out
  data = json.loads(profile.read_text())
  assert data["engine"]["prefill_buckets"] == [64, 512]
  assert data["instances"]["2"]["prefill"]["sizes"] == [64.0, 512.0]
  assert len(data["host_sharing"]["decode"]) == 4           # 4 instances: 0-3 others
  assert data["host_s"]["decode"]["steps"] > 0 and data["host_s"]["decode"]["waited_share"] == 1.0
  stream = data["stream_group_s"]   # tiny's 2 layers as 2 groups; 512 > max_model_len 512 - 1
  assert (stream["groups"], stream["tokens"]) == (2, 64) and stream["one_program_s"] > 0
  _run(["pdjax.run", *smoke, f"--workdir={tmp_path / 'jax'}"])
  _run(["pdjax.run", *smoke, "--config.backend=sim", "--config.sim.cost_model=calibrated",
        f"--config.sim.profile={profile}", f"--workdir={tmp_path / 'sim'}"])
  records = {}
  for backend in ("jax", "sim"):
    lines = (tmp_path / backend / "requests.jsonl").read_text().splitlines()
    records[backend] = [(r["id"], r["status"], r["prompt_len"], len(r["output_ids"]))
                        for r in map(json.loads, lines)]
  assert records["jax"] == records["sim"]
  assert len(records["jax"]) == 8 and all(s == "finished" for _, s, _, _ in records["jax"])
