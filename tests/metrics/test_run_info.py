"""Every output names what ran (run_info): a simulated Llama-3-8B on H100 run's printed table,
report.md, compare.md and summary.json say backend, model, hardware, placement, workload."""

import json
import subprocess
import sys

from pdjax.metrics.run_info import param_count, tiny_sim_warning
from pdjax.models.llama_config import PRESETS


def test_param_count_matches_published_sizes():
  assert param_count(PRESETS["llama3_8b"]) == 8_030_261_248     # Meta's model card: 8.03B
  assert param_count(PRESETS["llama2_7b"]) == 6_738_415_616     # HF Llama-2-7b-hf
  assert param_count(PRESETS["tiny"]) == 426_624
  # transformers' num_parameters() of the converted SmolLM2-135M-Instruct folder (tied head)
  assert param_count(PRESETS["smollm2_135m"]) == 134_515_008


def _run(tmp_path, *extra):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       f"--workdir={workdir}", "--config.progress=False", "--config.backend=sim", *extra],
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc


def test_sim_llama3_8b_h100_outputs_name_what_ran(tmp_path):
  workdir, proc = _run(tmp_path, "--config.model.preset=llama3_8b", "--config.sim.hardware=h100",
                       "--config.model.dtype=bfloat16", "--config.seed=3")
  head = [
      "backend: sim (roofline cost model, h100)",
      "model: llama3_8b (preset, 8.03B params, bfloat16)",
      "workload: synthetic mixed, 8 requests, poisson at 20 req/s",
      "SLO: TTFT <= 1000 ms, TPOT <= 100 ms, target 90% attainment",
      "seed: 3",
  ]
  lines = proc.stdout.splitlines()
  assert lines[:5] == head
  assert "warning" not in proc.stderr               # a published shape: no toy warning
  placement = next(l for l in lines if l.startswith("placement")).split()
  assert placement == ["placement", "4xTP2", "4xTP2", "2xP(tp2)", "+", "2xD(tp2)"]
  assert next(l for l in lines if l.startswith("chips")).split() == ["chips", "8", "8", "8"]
  assert any(l.startswith("goodput/chip (req/s)") for l in lines)
  compare = (workdir / "compare.md").read_text().splitlines()
  assert compare[2:7] == [f"- {h}" for h in head]
  assert "| placement | 4xTP2 | 4xTP2 | 2xP(tp2) + 2xD(tp2) |" in compare
  for mode, desc in (("colocated", "4xTP2"), ("disaggregated", "2xP(tp2) + 2xD(tp2)")):
    report = (workdir / mode / "report.md").read_text().splitlines()
    assert report[2:8] == [f"- {h}" for h in head] + [f"- placement: {desc} (8 chips)"]
    info = json.loads((workdir / mode / "summary.json").read_text())["run_info"]
    assert info["backend"] == {"name": "sim", "cost_model": "roofline", "hardware": "h100"}
    assert info["model"] == {"name": "llama3_8b", "source": "preset", "params": 8030261248,
                             "dtype": "bfloat16"}
    assert info["placement"]["describe"] == desc and info["placement"]["chips"] == 8
    assert info["workload"] == {"kind": "synthetic", "preset": "mixed", "arrival": "poisson",
                                "rate": 20.0, "requests": 8}
    assert info["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1, "attainment": 0.9}
    assert info["seed"] == 3


def test_tiny_preset_on_the_simulator_warns_once(tmp_path):
  _, proc = _run(tmp_path, "--config.mode=colocated")
  warnings = [l for l in proc.stderr.splitlines() if l.startswith("warning:")]
  assert warnings == ["warning: the `tiny` preset is a 2-layer toy: simulated numbers for it "
                      "describe no real model (use a published shape, e.g. "
                      "model.preset=llama3_8b)"]


def test_the_real_engine_names_its_devices():
  info = {"backend": {"name": "jax", "platform": "cpu", "device_kind": "cpu", "devices": 8},
          "model": {"name": "tiny", "source": "preset"}}
  assert tiny_sim_warning(info) is None
  from pdjax.metrics.run_info import describe_backend
  assert describe_backend(info["backend"]) == "jax on 8 cpu devices (cpu)"


def test_a_tier_over_hosts_is_named_in_the_placement():
  from pdjax.metrics.run_info import placement_info
  tiers = [("prefill", 1, 2), ("decode", 1, 1)]
  info = placement_info("disaggregated", tiers, launcher="ray",
                        hosts={"prefill": 2, "decode": 1, "colocated": 4})
  assert info["describe"] == ("1xP(tp2) + 1xD(tp1), each prefill instance over 2 hosts, one "
                              "Ray actor per instance and host")
  assert info["hosts"] == {"prefill": 2} and info["chips"] == 3
  assert "hosts" not in placement_info("disaggregated", tiers, hosts={"prefill": 1})
