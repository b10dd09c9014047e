"""A chip pdjax has no preset for, from a JSON file of Hardware fields (issue 46): sim.hardware
and plan.map_hardware take its path; bad files are one-line config errors."""

import json
import subprocess
import sys

import pytest

from pdjax import config as config_lib
from pdjax.configs import default
from pdjax.models.llama_config import PRESETS
from pdjax.sim.hardware import HARDWARE, Hardware, hardware_for
from pdjax.sim.roofline import RooflineCost

H100 = HARDWARE["h100"]
FIELDS = dict(bf16_flops=H100.bf16_flops, hbm_bytes=H100.hbm_bytes,
              hbm_bytes_per_s=H100.hbm_bytes_per_s, link_bytes_per_s=H100.link_bytes_per_s,
              ici_bytes_per_s=H100.ici_bytes_per_s, host_bytes_per_s=H100.host_bytes_per_s)


def _write(tmp_path, name="fast_hbm.json", **fields):
  path = tmp_path / name
  path.write_text(json.dumps(fields))
  return str(path)


def test_a_file_with_twice_the_hbm_bandwidth_decodes_faster_than_h100(tmp_path):
  path = _write(tmp_path, **{**FIELDS, "hbm_bytes_per_s": 2 * H100.hbm_bytes_per_s})
  chip = hardware_for(path)
  assert chip == Hardware("fast_hbm", **{**FIELDS, "hbm_bytes_per_s": 2 * H100.hbm_bytes_per_s})
  mcfg = PRESETS["llama3_8b"]
  h100 = RooflineCost(mcfg, H100, 1, dtype_bytes=2).decode_s([512] * 8)
  fast = RooflineCost(mcfg, chip, 1, dtype_bytes=2).decode_s([512] * 8)
  assert fast < h100
  # a decode step at batch 8 is bandwidth-bound: twice the bandwidth halves its memory time;
  # the step's fixed launch overhead does not shrink, so it lands just above half
  assert h100 / 2 < fast < 0.55 * h100


def test_a_simulated_run_on_a_file_chip_names_it(tmp_path):
  path = str(tmp_path / "my_chip.json")
  (tmp_path / "my_chip.json").write_text(json.dumps({**FIELDS, "name": "lab-chip-1"}))
  outs = {}
  for hw in ("h100", path):
    workdir = tmp_path / ("preset" if hw == "h100" else "file")
    proc = subprocess.run(
        [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
         "--config.backend=sim", "--config.mode=disaggregated", f"--config.sim.hardware={hw}",
         f"--workdir={workdir}", "--config.progress=False"], capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outs[hw] = (json.loads((workdir / "summary.json").read_text()),
                (workdir / "requests.jsonl").read_text())
  summary, requests = outs[path]
  assert summary["run_info"]["backend"]["hardware"] == path
  assert requests == outs["h100"][1]          # the same fields as h100: the same run


@pytest.mark.parametrize("fields,error", [
    ({k: v for k, v in FIELDS.items() if k != "hbm_bytes"}, "missing required field 'hbm_bytes'"),
    ({**FIELDS, "hbm_gbps": 1.0}, "unknown field 'hbm_gbps' (fields: bf16_flops, hbm_bytes, "
     "hbm_bytes_per_s, link_bytes_per_s, ici_bytes_per_s, ici_latency_s, host_bytes_per_s, "
     "chips_per_host, dcn_bytes_per_s, name)"),
    ({**FIELDS, "bf16_flops": -1}, "bf16_flops=-1 must be a finite number > 0"),
    ({**FIELDS, "hbm_bytes": "80GB"}, "hbm_bytes='80GB' must be a finite number > 0"),
], ids=["missing", "unknown", "negative", "text"])
def test_a_bad_hardware_file_is_a_one_line_config_error(tmp_path, fields, error):
  path = _write(tmp_path, **fields)
  cfg = default.get_config("smoke")
  cfg.backend, cfg.sim.hardware = "sim", path
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg, device_count=8)
  assert str(e.value) == f"sim.hardware={path!r}: {error}"


def test_an_unknown_preset_or_missing_file_is_one_line(tmp_path):
  cfg = default.get_config("smoke")
  cfg.backend, cfg.sim.hardware = "sim", "h300"
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg, device_count=8)
  assert str(e.value) == ("sim.hardware='h300' is not one of ['a100', 'b200', 'h100', 'h200', "
                          "'mi300x', 'tpu_v5e', 'tpu_v5p', 'tpu_v6e', 'tpu_v7x'] (or a .json "
                          "file)")
  missing = str(tmp_path / "nope.json")
  cfg.sim.hardware = missing
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg, device_count=8)
  assert str(e.value) == f"sim.hardware={missing!r}: cannot read it (No such file or directory)"


def test_map_hardware_takes_a_file(tmp_path):
  from pdjax.planning.map_mode import settings
  path = _write(tmp_path, name="lab.json", **FIELDS)
  cfg = default.get_config("smoke")
  cfg.backend, cfg.plan.map_hardware = "sim", f"h100,{path}"
  assert settings(cfg).hardware == ["h100", path]
  cfg.plan.map_hardware = f"h100,{tmp_path / 'missing.json'}"
  with pytest.raises(config_lib.ConfigError) as e:
    settings(cfg)
  assert str(e.value) == (f"plan.map_hardware={str(tmp_path / 'missing.json')!r}: cannot read "
                          "it (No such file or directory)")
