"""A researcher's own policies, in their own folder, named by import path or installed under
the entry-point group `pdjax.policies`; the weighted router's arithmetic (issue 46)."""

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from pdjax import config as config_lib
from pdjax.configs import default
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.policies import registry
from pdjax.scheduler.policies.weighted import Weighted

POLICIES = textwrap.dedent('''
    """A study's policies: a router that always takes one position, a path by prompt length."""
    from pdjax.scheduler.policies.base import PathChoice


    class Fixed:
      """Always the candidate at `index` (policy_args)."""

      def __init__(self, index=0, seed=0):
        self.index = index

      def choose(self, req, candidates):
        return candidates[self.index] if candidates else None


    class ShortOnDecode:
      """Prompts under 40 tokens prefill on their decode instance, the rest disaggregated."""

      def choose(self, req, prefill_tier, decode_tier, picks=None):
        if req.prompt_len < 40:
          return PathChoice("colocated", "decode")
        return PathChoice("disaggregated", "prefill")


    class NotARouter:
      def route(self, req):
        return None
    ''')

STUDY = textwrap.dedent('''
    from pdjax.configs import default


    def get_config(arg=None):
      c = default.get_config("smoke")
      c.backend, c.mode, c.progress = "sim", "disaggregated", False
      c.workload.num_requests = 12
      c.scheduler.prefill_router = "my_policies:Fixed"
      c.scheduler.decode_router = "my_policies:Fixed"
      c.scheduler.path = "my_policies:ShortOnDecode"
      c.scheduler.policy_args.index = -1
      return c
    ''')


@pytest.fixture
def study(tmp_path, monkeypatch):
  """A study folder outside the repository: my_policies.py beside study.py."""
  folder = tmp_path / "my_study"
  folder.mkdir()
  (folder / "my_policies.py").write_text(POLICIES)
  (folder / "study.py").write_text(STUDY)
  monkeypatch.syspath_prepend(str(folder))
  yield folder
  sys.modules.pop("my_policies", None)


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "requests.jsonl").read_text().splitlines()]


def test_a_study_folders_router_and_path_run_on_the_simulator_from_anywhere(study, tmp_path):
  workdir = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", f"--config={study / 'study.py'}",
                         f"--workdir={workdir}"], capture_output=True, text=True,
                        cwd=str(tmp_path), timeout=600,
                        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = _rows(workdir)
  assert len(rows) == 12 and {r["status"] for r in rows} == {"finished"}
  for r in rows:
    short = r["prompt_len"] < 40
    assert r["path"] == ("colocated" if short else "disaggregated")
    assert r["path_reason"]["policy"] == "ShortOnDecode"
    assert r["decode_instance"] == "decode-1"                  # index -1 of decode-0, decode-1
    assert r["prefill_instance"] == ("decode-1" if short else "prefill-1")
  assert {r["path"] for r in rows} == {"colocated", "disaggregated"}   # both branches ran


def _config(**scheduler):
  cfg = default.get_config("smoke")
  cfg.backend = "sim"
  for key, value in scheduler.items():
    cfg.scheduler[key] = value
  return cfg


@pytest.mark.parametrize("key,name,error", [
    ("prefill_router", "no_such_module_46:Fixed",
     "scheduler.prefill_router='no_such_module_46:Fixed': cannot import module "
     "'no_such_module_46' (No module named 'no_such_module_46')"),
    ("prefill_router", "my_policies:Missing",
     "scheduler.prefill_router='my_policies:Missing': module 'my_policies' has no attribute "
     "'Missing'"),
    ("decode_router", "my_policies:NotARouter",
     "scheduler.decode_router='my_policies:NotARouter': my_policies.NotARouter lacks "
     "choose(req, candidates), the interface of scheduler.decode_router"),
    ("admission", "my_policies:Fixed",
     "scheduler.admission='my_policies:Fixed': my_policies.Fixed lacks check(req, worker, "
     "path, decode_tier), the interface of scheduler.admission"),
    ("path", "my_policies:", "scheduler.path='my_policies:' is not an import path of the form "
     "module:Attr"),
], ids=["module", "attribute", "interface", "wrong_key", "no_attr"])
def test_a_bad_import_path_is_a_one_line_config_error(study, key, name, error):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(_config(**{key: name}), device_count=8)
  assert str(e.value) == error


def test_policy_args_reach_the_class_and_a_stray_one_is_an_error(study):
  cfg = _config(prefill_router="my_policies:Fixed")
  cfg.scheduler.policy_args.index = 1
  config_lib.validate(cfg, device_count=8)
  names = {k: cfg.scheduler[k] for k in policy_lib.CHOICES}
  built = policy_lib.build(names, {"token_budget": 64, "max_prefill_seqs": 4}, seed=3,
                           policy_args=dict(cfg.scheduler.policy_args))
  assert type(built.prefill_router).__name__ == "Fixed" and built.prefill_router.index == 1
  assert built.prefill_router.choose(None, ["a", "b", "c"]) == "b"
  cfg.scheduler.policy_args.colour = "red"
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg, device_count=8)
  assert str(e.value) == ("scheduler.policy_args.colour is a keyword none of your policies "
                          "takes (scheduler.prefill_router='my_policies:Fixed')")
  builtin_only = _config()
  builtin_only.scheduler.policy_args.index = 1
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(builtin_only, device_count=8)
  assert str(e.value) == ("scheduler.policy_args={'index': 1} is for your own policies, and "
                          "every policy named is built-in")


def _install(tmp_path, monkeypatch, entry_points: str, module: str):
  """A package 'installed' by its dist-info folder on sys.path (no pip)."""
  site = tmp_path / "site"
  (site / "lab_policies").mkdir(parents=True)
  (site / "lab_policies" / "__init__.py").write_text(module)
  info = site / "lab_policies-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-policies\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text(entry_points)
  monkeypatch.syspath_prepend(str(site))
  return site


LAB = textwrap.dedent('''
    class Quiet:
      """Routes to the candidate with the fewest running sequences."""
      kind = "router"

      def __init__(self, seed=0):
        pass

      def choose(self, req, candidates):
        return min(candidates, key=lambda w: w.num_running()) if candidates else None
    ''')


def test_an_installed_entry_point_is_a_policy_name(tmp_path, monkeypatch):
  _install(tmp_path, monkeypatch, "[pdjax.policies]\nquiet = lab_policies:Quiet\n", LAB)
  try:
    cls = registry.policy_class("decode_router", "quiet", policy_lib.ROUTERS)
    assert cls.__module__ == "lab_policies" and cls.__name__ == "Quiet"
    assert registry.installed_classes("router") == {"quiet": cls}
    with pytest.raises(registry.PolicyError) as e:
      registry.policy_class("path", "quiet", policy_lib.PATHS)
    assert str(e.value) == ("scheduler.path='quiet': the installed lab_policies:Quiet serves "
                            "kind 'router', not 'path'")
    config_lib.validate(_config(decode_router="quiet"), device_count=8)
  finally:
    sys.modules.pop("lab_policies", None)


class _Worker:
  def __init__(self, name, queued, free, running=0, inbound=0):
    self.name, self._queued, self._free = name, queued, free
    self._running, self._inbound = running, inbound
    self.tables = types.SimpleNamespace(page_size=4)

  def queued_tokens(self):
    return self._queued

  def free_pages(self):
    return self._free

  def num_running(self):
    return self._running

  def kv_inbound_pages(self):
    return self._inbound

  def prefix_credit(self, names, salt):
    return 0.0


def _req(session=""):
  return types.SimpleNamespace(session=session, tenant="", cache_salt="", prefill_tokens=[1] * 8)


def test_weighted_sums_normalised_scores():
  # queue (fewer better) over [100, 0, 50] -> [0, 1, 0.5], x2 -> [0, 2, 1];
  # kv_free (more better) over [10, 20, 30] -> [0, 0.5, 1], x1 -> totals [0, 2.5, 2]
  ws = [_Worker("a", 100, 10), _Worker("b", 0, 20), _Worker("c", 50, 30)]
  router = Weighted(seed=0, tier="decode", decode_scorers="queue=2,kv_free=1")
  assert router.totals(_req(), ws) == [0.0, 2.5, 2.0]
  assert router.choose(_req(), ws).name == "b"
  # kv_free x 3 instead: totals [0, 1 + 1.5, 0.5 + 3] -> c
  router = Weighted(seed=0, tier="decode", decode_scorers="queue=1,kv_free=3")
  assert router.totals(_req(), ws) == [0.0, 2.5, 3.5]
  assert router.choose(_req(), ws).name == "c"


def test_weighted_session_and_transfer_scorers():
  ws = [_Worker("a", 0, 10, inbound=8), _Worker("b", 0, 10, inbound=0)]
  router = Weighted(seed=0, tier="prefill", prefill_scorers="transfer=1,session=2")
  assert router.totals(_req("s1"), ws) == [0.0, 1.0]        # no session seen: transfer only
  assert router.choose(_req("s1"), ws).name == "b"
  ws[1]._inbound = 16                                        # b now has more in flight ...
  assert router.totals(_req("s1"), ws) == [1.0, 2.0]        # ... but served session s1 last
  assert router.choose(_req("s1"), ws).name == "b"
  assert router.totals(_req("s2"), ws) == [1.0, 0.0]


def test_weighted_takes_a_user_scorer_by_import_path(study):
  (study / "my_scorers.py").write_text(textwrap.dedent('''
      class Named:
        def __init__(self, favourite="a"):
          self.favourite = favourite

        def score(self, req, worker):
          return 1.0 if worker.name == self.favourite else 0.0
      '''))
  ws = [_Worker("a", 0, 10), _Worker("b", 10, 10)]
  router = Weighted(seed=0, tier="decode", decode_scorers="queue=1,my_scorers:Named=2",
                    policy_args={"favourite": "b"})
  assert router.totals(_req(), ws) == [1.0, 2.0]
  sys.modules.pop("my_scorers", None)


@pytest.mark.parametrize("spec,error", [
    ("queue", "scheduler.decode_scorers='queue': 'queue' is not scorer=weight with a weight > 0"),
    ("queue=0", "scheduler.decode_scorers='queue=0': 'queue=0' is not scorer=weight with a "
     "weight > 0"),
    ("queue=1,queue=2", "scheduler.decode_scorers='queue=1,queue=2': scorer 'queue' is listed "
     "twice"),
    ("fastest=1", "scheduler.decode_scorers: scorer 'fastest' is not one of ['kv_free', "
     "'prefix', 'queue', 'running', 'session', 'transfer'] (or a module:Attr import path)"),
])
def test_a_bad_scorer_list_is_a_one_line_config_error(spec, error):
  cfg = _config(decode_router="weighted", decode_scorers=spec)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg, device_count=8)
  assert str(e.value) == error


def test_the_listing_names_built_in_and_installed_policies(tmp_path, monkeypatch):
  site = _install(tmp_path, monkeypatch, "[pdjax.policies]\nquiet = lab_policies:Quiet\n", LAB)
  try:
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-m", "pdjax.policies"], capture_output=True,
                         text=True, timeout=120, env=env).stdout.splitlines()
  finally:
    sys.modules.pop("lab_policies", None)
  routers = out[1:out.index("scheduler.path:")]
  assert [line.split()[0] for line in routers] == [
      "kv_aware", "kv_aware_prefix", "least_loaded", "power_of_two", "random", "round_robin",
      "session_sticky", "weighted", "quiet"]
  assert routers[-1] == ("  quiet            [lab_policies:Quiet] Routes to the candidate with "
                         "the fewest running sequences")
  assert "  random           a seeded uniform choice among eligible instances" in out
  assert "  transfer  KV pages on their way to the instance (fewer is better)" in out
