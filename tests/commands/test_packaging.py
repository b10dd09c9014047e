"""Packaging: the configs ship inside the package, and an installed (not editable) pdjax runs
its default config from any folder."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.paths import ROOT
from pdjax import config as config_lib

PACKAGE_CONFIGS = os.path.join(ROOT, "pdjax", "configs")


def _names(folder: str) -> list[str]:
  return sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "[!_]*.py")))


def test_repo_configs_reexport_the_package_configs():
  """configs/<name>.py in a clone is a re-export of pdjax/configs/<name>.py, nothing more: one
  source of truth, and `--config=configs/...` keeps working from the repo root."""
  assert _names(os.path.join(ROOT, "configs")) == _names(PACKAGE_CONFIGS)
  assert "default.py" in _names(PACKAGE_CONFIGS)
  for name in _names(PACKAGE_CONFIGS):
    shim = config_lib.load_config_module(os.path.join(ROOT, "configs", name))
    real = __import__(f"pdjax.configs.{name[:-3]}", fromlist=["get_config"])
    assert shim.get_config is real.get_config, name
    assert getattr(shim, "get_sweep", None) is getattr(real, "get_sweep", None), name
    with open(os.path.join(ROOT, "configs", name)) as f:
      assert "\ndef " not in f.read(), f"configs/{name} defines something of its own"


def test_sweep_configs_build_on_the_package_default():
  """A sweep config in the package finds default.py beside it (sibling_config)."""
  cfg = config_lib.load_config_module(os.path.join(ROOT, "configs", "pd_ratio.py")).get_config(
      "smoke")
  assert (cfg.mode, cfg.workload.num_requests, cfg.scheduler.prefill_buckets) == (
      "disaggregated", 48, (64, 512))


def _copy_source(dst: str) -> None:
  """What `pip install .` needs from the repo, without build outputs or results."""
  ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "results")
  for name in ("pdjax", "kernels_pallas"):
    shutil.copytree(os.path.join(ROOT, name), os.path.join(dst, name), ignore=ignore)
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), dst)


@pytest.mark.slow
def test_installed_copy_runs_the_default_config_from_elsewhere(tmp_path):
  src, target, cwd = tmp_path / "src", tmp_path / "site", tmp_path / "cwd"
  _copy_source(str(src))
  cwd.mkdir()
  install = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
       "--quiet", f"--target={target}", str(src)], capture_output=True, text=True, timeout=600)
  assert install.returncode == 0, install.stderr[-3000:]
  assert (target / "pdjax" / "configs" / "default.py").is_file()
  assert not (target / "configs").exists()   # no top-level "configs" package in site-packages

  env = {**os.environ, "PYTHONPATH": str(target)}
  env.pop("PDJAX_TEST_COMPILE_CACHE", None)
  where = subprocess.run([sys.executable, "-c", "import pdjax; print(pdjax.__file__)"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
  assert where.stdout.strip() == str(target / "pdjax" / "__init__.py"), where.stderr[-2000:]

  overrides = ["--config.backend=sim", "--config.mode=disaggregated",
               "--config.workload.num_requests=6", "--config.progress=False", "--config.repeats=1",
               "--config.compile_cache_dir="]
  runs = {"script": [str(target / "bin" / "pdjax")],
          "module": [sys.executable, "-m", "pdjax.run"]}
  for name, command in runs.items():
    proc = subprocess.run([*command, *overrides, f"--workdir={cwd / name}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    summary = json.loads((cwd / name / "summary.json").read_text())
    assert summary["requests"]["finished"] == 6, name
