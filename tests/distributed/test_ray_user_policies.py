"""A study's own policies (tests/helpers/user_study.py: module:Attr names in a config file
outside the repository) under cluster.launcher=ray (issue 46): requests go where they say, as
in one process. The policies run in the driver process only; the actors are sent steps (token
ids, positions, pages), never a policy, so no actor process imports the study's module."""

import os
import subprocess
import sys

import pytest

from helpers.user_study import check_routed, importers, make_study, rows_of

pytestmark = pytest.mark.slow


def test_ray_actors_serve_where_the_studys_policies_say(tmp_path):
  """pdjax.run, launcher=ray, from another folder without the test's PYTHONPATH: 1 prefill and
  2 decode actors (TP1); every request finished on prefill-0 / decode-1 (the routers' index
  -1) or, under 40 prompt tokens, colocated on decode-1; only the driver imported the study's
  module."""
  study = make_study(tmp_path / "my_study")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  workdir = tmp_path / "out"
  proc = subprocess.Popen(
      [sys.executable, "-m", "pdjax.run", f"--config={study / 'study.py'}",
       "--config.cluster.launcher=ray",
       "--config.cluster.prefill.instances=1", "--config.cluster.prefill.tp=1",
       "--config.cluster.decode.instances=2", "--config.cluster.decode.tp=1",
       f"--workdir={workdir}",
       f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(elsewhere),
      env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  stdout, stderr = proc.communicate(timeout=900)
  assert proc.returncode == 0, stderr[-3000:]
  assert "1xP(tp1) + 2xD(tp1), one Ray actor per instance" in stdout
  rows = rows_of(workdir / "requests.jsonl")
  assert len(rows) == 6
  check_routed(rows, prefill="prefill-0", decode="decode-1")
  assert importers(study) == [proc.pid]
