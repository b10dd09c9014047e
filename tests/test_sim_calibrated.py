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


def _profile(tp=2):
  mcfg = PRESETS["tiny"]
  fits = {"prefill": StepFit((64.0, 512.0), (0.01, 0.08), 0.0).to_json(),
          "decode": StepFit((4.0, 16.0), (0.004, 0.006), 0.0).to_json(),
          "transfer": StepFit((16384.0, 32768.0), (0.001, 0.002), 0.0).to_json()}
  return {"format": calibrated.FORMAT, "model": json.loads(json.dumps(dataclasses.asdict(mcfg))),
          "model_name": "tiny", "dtype": "float32", "kv_bytes_per_token": 1024.0,
          "instances": {str(tp): fits}}


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
  cfg.cluster.decode.tp = 4
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value).endswith("has no fit for tp=[4] (it has tp=[2])")


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
