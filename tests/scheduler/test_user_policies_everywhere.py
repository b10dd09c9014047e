"""A study's own policies, named by import path in a config file outside the repository, run
unchanged beyond the simulator (issue 46): on the real engine (`pdjax.run`), in the server
(`pdjax.serve`, its HTTP and engine-core processes, on fake instances) and in a sweep of a
built-in router against the study's, with repeats. Every command runs from another folder: the
study's module is found through the config file's folder alone. The policies, the config and
the checks: tests/helpers/user_study.py; on Ray: tests/distributed/test_ray_user_policies.py."""

import csv
import json
import os
import subprocess
import sys
import textwrap
import time

import httpx

from helpers.paths import TESTS
from helpers.server_process import free_port
from helpers.user_study import SHORT, check_routed, importers, make_study, rows_of
from pdjax.runner.sweep_points import folder_of, label_of

# Without the test run's PYTHONPATH: the study's module must come from the config's folder.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args: list[str], cwd, timeout: int = 600) -> subprocess.CompletedProcess:
  proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                        cwd=str(cwd), timeout=timeout, env=ENV)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def test_the_engine_routes_where_the_studys_policies_say(tmp_path):
  """pdjax.run on the real engine (TP2 instances, 2 per tier, 6 requests): every request
  finished on prefill-1 / decode-1 (index -1 of each tier) or, under 40 prompt tokens,
  colocated on decode-1; one process imported the study's module."""
  study = make_study(tmp_path / "my_study")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  _run(["pdjax.run", f"--config={study / 'study.py'}", f"--workdir={tmp_path / 'out'}",
        f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"], elsewhere)
  rows = rows_of(tmp_path / "out" / "requests.jsonl")
  assert len(rows) == 6
  check_routed(rows, prefill="prefill-1", decode="decode-1")
  assert len(importers(study)) == 1


# `python -m pdjax.serve` with the instances of tests/helpers/fake_engine.py in place of the
# engine's (and their KV transfer): the real flags and config file, HTTP process, engine-core
# process, driver, policies and requests.jsonl. The engine-core process is spawned: it imports
# this file again (as __mp_main__), so the fakes are patched in there too. Written outside the
# study's folder: the script's own folder goes first on sys.path.
FAKE_SERVE = textwrap.dedent('''
    import sys
    import time

    sys.path.insert(0, {tests!r})
    from helpers.fake_engine import FakeInstance, ok_transfer   # noqa: E402
    from pdjax.runner import build                               # noqa: E402


    class WallSteps:
      """A fake step takes a tenth of its cost (prefill 10 ms, decode 1 ms), really."""

      def advance(self, seconds):
        time.sleep(seconds / 10)


    def fake_instances(cfg, mcfg, tiers, host_params, opts, progress):
      out = []
      for role, count, tp in tiers:
        for i in range(count):
          inst = FakeInstance(f"{{role}}-{{i}}", WallSteps(), num_pages=opts.num_pages,
                              page_size=opts.page_size)
          inst.role, inst.opts, inst.tp, inst.compiles = role, opts, tp, 0
          out.append(inst)
      return out


    real_build_run = build.build_run


    def build_run(*args, **kwargs):
      mode, instances, serve_kwargs = real_build_run(*args, **kwargs)
      serve_kwargs["transfer_fn"] = ok_transfer
      return mode, instances, serve_kwargs


    assert hasattr(build, "_engine_instances")   # (else the real engine would serve)
    build._engine_instances = fake_instances
    build.build_run = build_run

    if __name__ == "__main__":
      from pdjax import serve
      serve.entry_point()
    ''')


def _serve(launcher, study, workdir, cwd, log):
  """The fake-instance server on a free port, up once /health answers 200; (process, URL)."""
  port = free_port()
  proc = subprocess.Popen([sys.executable, str(launcher), f"--config={study / 'study.py'}",
                           f"--port={port}", f"--workdir={workdir}", "--grace_s=5"],
                          stdout=log, stderr=subprocess.STDOUT, cwd=str(cwd), env=ENV)
  url = f"http://127.0.0.1:{port}"
  deadline = time.monotonic() + 120
  while True:
    assert proc.poll() is None, open(log.name).read()[-3000:]
    try:
      if httpx.get(f"{url}/health", timeout=2).status_code == 200:
        return proc, url
    except httpx.HTTPError:
      pass
    assert time.monotonic() < deadline, open(log.name).read()[-3000:]
    time.sleep(0.3)


def test_the_server_routes_where_the_studys_policies_say(tmp_path):
  """pdjax.serve with the study's config (fake instances): each answered request is, in the
  requests.jsonl the server writes, where the policies put it (short prompts colocated on
  decode-1, the others prefill-1 -> decode-1); the HTTP process and its engine-core process
  both imported the study's module (each validates the config), nothing else did."""
  study = make_study(tmp_path / "my_study")
  launcher = tmp_path / "launcher" / "fake_serve.py"
  launcher.parent.mkdir()
  launcher.write_text(FAKE_SERVE.format(tests=str(TESTS)))
  workdir = tmp_path / "served"
  with open(tmp_path / "server.log", "w") as log:
    proc, url = _serve(launcher, study, workdir, tmp_path, log)
    try:
      ids = {}
      for n in (8, 50, 12, 90):   # prompt tokens: colocated, disaggregated, ...
        r = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": [5] * n, "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == {"prompt_tokens": n, "completion_tokens": 4,
                                     "total_tokens": n + 4}
        ids[r.json()["id"]] = n
    finally:
      proc.terminate()
      assert proc.wait(timeout=120) == 0, open(log.name).read()[-3000:]
  rows = rows_of(workdir / "requests.jsonl")
  assert {r["id"]: r["prompt_len"] for r in rows} == ids
  check_routed(rows, prefill="prefill-1", decode="decode-1")
  assert [r["prompt_len"] < SHORT for r in rows] == [True, False, True, False]
  summary = json.loads((workdir / "summary.json").read_text())   # written at the end
  assert summary["requests"] == {"total": 4, "finished": 4, "rejected": 0, "failed": 0,
                                 "cancelled": 0}
  assert (summary["kv_transfer"]["count"], summary["kv_pages_leaked"]) == (2, 0)
  assert summary["compiles"] == 0   # the fake instances served
  pids = importers(study)
  assert len(pids) == 2 and pids[0] == proc.pid and pids[1] != proc.pid, pids


SWEEP = textwrap.dedent('''
    from pdjax.configs import default


    def get_config(arg=None):
      c = default.get_config("smoke")
      c.backend, c.mode, c.progress, c.repeats = "sim", "disaggregated", False, 2
      c.workload.num_requests = 12
      return c


    def get_sweep():
      return [{"scheduler.decode_router": "least_loaded"},
              {"scheduler.decode_router": "my_policies:Fixed",
               "scheduler.policy_args.index": -1}]
    ''')

LABELS = ["scheduler.decode_router=least_loaded",
          "scheduler.decode_router=my_policies:Fixed,policy_args.index=-1"]


def test_a_sweep_of_a_built_in_router_against_the_studys_with_repeats(tmp_path):
  """pdjax.sweep (simulator, 2 repeats) of decode_router over least_loaded and the study's
  Fixed (its policy_args set by its point only: the built-in point's config has none, as
  validation wants): each point's folder is named by its label, ':' kept; the study's point
  decoded every request on decode-1, the built-in one on both; the printed table has both
  rows with intervals; the differences name both points."""
  study = make_study(tmp_path / "my_study", **{"sweep.py": SWEEP})
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  workdir = tmp_path / "sweep"
  proc = _run(["pdjax.sweep", f"--config={study / 'sweep.py'}", f"--workdir={workdir}"],
              elsewhere)
  folders = [folder_of(i, label) for i, label in enumerate(LABELS)]
  assert folders == ["00-scheduler.decode_router=least_loaded",
                     "01-scheduler.decode_router=my_policies:Fixed,policy_args.index=-1"]
  assert sorted(os.listdir(workdir)) == [*folders, "plots", "sweep.csv", "sweep.md"]
  decoded_on = {}
  for folder in folders:
    run = workdir / folder / "disaggregated"
    assert sorted(os.listdir(run)) == ["repeat-0", "repeat-1", "summary.json"]
    for k in (0, 1):
      rows = rows_of(run / f"repeat-{k}" / "requests.jsonl")
      assert [r["status"] for r in rows] == ["finished"] * 12
      decoded_on[folder, k] = {r["decode_instance"] for r in rows}
  assert decoded_on == {(folders[0], 0): {"decode-0", "decode-1"},
                        (folders[0], 1): {"decode-0", "decode-1"},
                        (folders[1], 0): {"decode-1"}, (folders[1], 1): {"decode-1"}}
  rows = list(csv.DictReader(open(workdir / "sweep.csv")))
  assert [(r["label"], r["run"], r["repeats"], r["finished"]) for r in rows] == [
      (LABELS[0], "disaggregated", "2", "24"), (LABELS[1], "disaggregated", "2", "24")]
  header, *table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
  assert header.startswith("| point | label | run | repeats | ttft_p50_ms |")
  assert [line.split(" | ")[:3] for line in table] == [["| 0", LABELS[0], "disaggregated"],
                                                        ["| 1", LABELS[1], "disaggregated"]]
  for line in table:   # every metric cell "mean ± half-width"
    cells = line.strip("| ").split(" | ")
    assert all(" ± " in c for c in cells[4:11]), line
  attainment = [line for line in proc.stdout.splitlines()
                if line.startswith("- SLO attainment (%)")]
  assert len(attainment) == 1
  assert "decode_router=least_loaded" in attainment[0]
  assert "decode_router=my_policies:Fixed,index=-1" in attainment[0]


def test_a_sweep_folder_of_a_path_valued_override_is_one_folder():
  """A value holding a path separator (sim.hardware=chips/my_chip.json) names one folder, not
  nested ones; ':' and '=' stay (valid and readable on Linux)."""
  label = label_of({"sim.hardware": "chips/my_chip.json", "scheduler.path": "my_mod:P"})
  assert label == "sim.hardware=chips/my_chip.json,scheduler.path=my_mod:P"
  assert folder_of(3, label) == "03-sim.hardware=chips_my_chip.json,scheduler.path=my_mod:P"
  assert os.sep not in folder_of(3, label)
