"""`python -m pdjax.lower_check` lowers a multi-host instance's programs (issue 48, item 5): a
tier over cluster.<tier>.hosts hosts is one SPMD program over all its hosts' devices
(num_partitions = TP) on an AbstractMesh of TP devices, host by host, and each line names the
process layout. Here the `tiny` model's decode at TP4 over 2 hosts, for tpu and cuda."""

import subprocess
import sys

from helpers.paths import ROOT
from pdjax.configs import default
from pdjax.engine import program_export as pe

KV = "kernel KV 1x512x16x16xf32; 4 devices as 2 hosts x 2 chips, KV sharded by kv heads; " \
     "KV donated"


def _shape(**decode):
  cfg = default.get_config()
  cfg.mode = "disaggregated"
  for key, value in decode.items():
    cfg.cluster.decode[key] = value
  return pe.shape_from_config(cfg, "default.py")


def test_a_two_host_decode_lowers_for_tpu_and_cuda():
  shape = _shape(tp=4, hosts=2)
  assert (shape.tps, shape.layouts) == ((2, 4), ((2, 1), (4, 2)))
  for target, call in (("tpu", "tpu_custom_call"), ("cuda", "__gpu$xla.gpu.triton")):
    result = pe.lower(pe.ProgramCase(shape, target, "decode", 4, 4, hosts=2))
    assert (result.ok, result.message) == (True, f"{call}, {KV}")
    assert result.line().startswith(f"ok    {target:<4} default.py tp4 (2 hosts x 2 chips) "
                                    f"decode  batch 4  {call}")


def test_one_host_cases_read_as_before():
  shape = _shape()
  assert shape.layouts == ((2, 1),)
  case = next(c for c in pe.cases([shape], ("tpu",), ("decode",)))
  assert (case.hosts, case.layout()) == (1, "")
  assert case.label() == "tpu  default.py tp2 decode  batch 4"


def test_hosts_that_do_not_divide_the_tp_are_a_config_error():
  try:
    _shape(tp=4, hosts=3)
  except Exception as e:  # noqa: BLE001 -- the type and text are what is checked
    assert (type(e).__name__, str(e)) == (
        "ConfigError", "cluster.decode.hosts=3 does not divide cluster.decode.tp=4 (each host "
        "owns tp / hosts devices)")
  else:
    raise AssertionError("no error")


def test_the_command_lowers_the_two_host_decode_and_says_its_layout():
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.lower_check", "--config=configs/default.py",
       "--config.mode=disaggregated", "--config.cluster.decode.tp=4",
       "--config.cluster.decode.hosts=2", "--programs=decode", "--kernels=none"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = proc.stdout.strip().splitlines()
  multi = [line for line in lines if "(2 hosts x 2 chips)" in line]
  # decode buckets 4, 8 and 16, for each target
  assert [line.split("  tpu_custom_call")[0].split("  __gpu")[0] for line in multi] == [
      f"ok    {t:<4} default.py tp4 (2 hosts x 2 chips) decode  batch {n}"
      for t in ("tpu", "cuda") for n in (4, 8, 16)]
  assert all("4 devices as 2 hosts x 2 chips" in line for line in multi)
  assert lines[-1].startswith("engine programs: 12 lowered, 0 failed (12 cases, jax ")
