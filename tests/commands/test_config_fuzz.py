"""Bad config values (issue 47, item 12): random overrides of the keys docs/config.md lists,
with wrong types and out-of-range values, are a one-line config error or a valid run, never a
traceback or a hang. In-process through pdjax.config.validate (what every command runs before
anything else) for 300 of them; a sample through the real command line
(`python -m pdjax.run ... --config.backend=sim`) to show that no traceback reaches the user,
runs included. Reproducible (derandomize=True); counts in BENCHMARKS.md ("Bad inputs (issue
47, item 12)"). Below them: a regression test for each defect the fuzz found."""

import collections
import concurrent.futures
import math
import os
import re
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdjax import config as config_lib
from pdjax.configs.default import get_config

DEFAULT = os.path.join(os.path.dirname(config_lib.__file__), "configs", "default.py")
DOC = os.path.join(os.path.dirname(os.path.dirname(config_lib.__file__)), "docs", "config.md")
KEYS = re.findall(r"^\| `([\w.]+)` \| `.*?` \|", open(DOC).read(), re.M)
TRIED: collections.Counter = collections.Counter()


def _get(cfg, key: str):
  node = cfg
  for part in key.split("."):
    node = node[part]
  return node


def _put(cfg, key: str, value) -> None:
  *path, leaf = key.split(".")
  node = cfg
  for part in path:
    node = node[part]
  with node.ignore_type():   # what a config file building its own ConfigDict may hold
    node[leaf] = value


TYPES = {key: type(_get(get_config(), key)) for key in KEYS}
INTS = st.sampled_from([-1, 0, 1, 2, 3, 7, 5000, -(10 ** 20), 10 ** 20, 2 ** 63, 10 ** 9])
FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e308, 1e-300, -1e-9, 0.5,
                          1.5, 1e9])
STRINGS = st.sampled_from(["", " ", "bogus", "\x00", "nan", "-1", "a,b", "@@", "a@1", "a@-1",
                           "x:1@2", "decode:1x2@1", "/nonexistent", "inf", "queue=-1",
                           "uniform:2:1", "exp:nan", "const:inf", "é" * 300]) | st.text(
                               max_size=12)
TUPLES = st.sampled_from([(), (0,), (-1, 2), (3, 2, 1), (1,), (2, 1), (10 ** 20,), (math.nan,),
                          (1, 10 ** 6)])
WRONG = st.sampled_from([None, True, False, "1", "abc", 1, -1, 1.5, math.nan, (), (1, 2), [1],
                         {"a": 1}, ["x"]])


def _values(key: str):
  """Out-of-range values of the key's own type (what --config.<key>= can give), and values of
  other types (what a config file can write)."""
  own = {int: INTS, float: FLOATS | INTS, str: STRINGS, tuple: TUPLES,
         bool: st.booleans()}.get(TYPES[key], st.none())
  return own | WRONG


class _Hang(Exception):
  pass


def _alarm(*_):
  raise _Hang()


def test_300_bad_values_are_a_config_error_or_valid():
  """validate (and validate with the device count, as pdjax.run calls it) raises ConfigError
  or returns, within 5 s, for every override; the CLI prints a ConfigError as one line."""
  previous = signal.signal(signal.SIGALRM, _alarm)

  @settings(max_examples=300, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck))
  @given(st.sampled_from(KEYS).flatmap(lambda k: st.tuples(st.just(k), _values(k))),
         st.sampled_from(["sim", "jax"]))
  def run(key_value, backend):
    key, value = key_value
    cfg = get_config("smoke")
    cfg.backend = backend
    _put(cfg, key, value)
    signal.alarm(5)
    try:
      config_lib.validate(cfg)
      config_lib.validate(cfg, device_count=8)
      TRIED["valid"] += 1
    except config_lib.ConfigError:
      TRIED["config error"] += 1
    except _Hang:
      pytest.fail(f"validate hung on {key}={value!r}")
    finally:
      signal.alarm(0)

  try:
    run()
  finally:
    signal.signal(signal.SIGALRM, previous)
  print(f"\nbad config values tried in-process: {sum(TRIED.values())} ({dict(TRIED)}), "
        "tracebacks: 0")
  assert sum(TRIED.values()) >= 300


# ---- through the command line -----------------------------------------------------------------

CLI_KEYS = [k for k in KEYS if not k.startswith(("plan.", "cluster.ray"))
            and k not in ("cluster.launcher", "num_cpu_devices", "sim.workers",
                          "compile_cache_dir")]   # (other commands', Ray's, the test's own)
CLI_VALUES = ["", "-1", "0", "1", "7", "5000", "1.5", "-1e-09", "nan", "inf", "-inf", "1e308",
              "9223372036854775808", "None", "true", "false", "abc", "a,b", "a@-1", "()", "(0,)",
              "(1,)", "(3, 2, 1)", "{'a': 1}", "[1]", "é" * 300, "\r", "\x08Òpz𠑨B"]


def _cli_cases(n: int = 40, seed: int = 47) -> list[tuple[str, str]]:
  """n (key, value text) pairs, the same every run (a seeded draw, not hypothesis': the
  cases must not depend on what else the session collected)."""
  import random
  rng = random.Random(seed)
  return [(rng.choice(CLI_KEYS), rng.choice(CLI_VALUES)) for _ in range(n)]


CLI_CASES = _cli_cases()


def _cli(key: str, text: str, workdir) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", "pdjax.run", f"--config={DEFAULT}:smoke", "--config.backend=sim",
       "--config.mode=colocated", "--config.progress=False", "--config.sim.workers=1",
       f"--config.{key}={text}", f"--workdir={workdir}"],
      capture_output=True, text=True, timeout=240)


def test_bad_values_on_the_command_line_never_show_a_traceback(tmp_path):
  """40 overrides through `python -m pdjax.run` (2 at a time): exit 0 with the results, or a
  non-zero exit with one line on stderr; never a traceback."""
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    procs = list(pool.map(lambda ic: _cli(*ic[1], tmp_path / str(ic[0])),
                          enumerate(CLI_CASES)))
  counts, bad = collections.Counter(), []
  for (key, text), proc in zip(CLI_CASES, procs):
    where = f"--config.{key}={text!r}: rc={proc.returncode}\n{proc.stderr[-2000:]}"
    print(f"  --config.{key}={text!r}: rc={proc.returncode} "
          f"{(proc.stderr.strip().splitlines() or [''])[-1][:100]!r}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if "Traceback" in proc.stderr:
      bad.append(where)
    elif proc.returncode == 0 and "results: " in proc.stdout:
      counts["ran"] += 1
    elif proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("config error: "):
      counts["config error"] += 1
    else:
      bad.append(where)
  assert not bad, "\n\n".join(bad)
  print(f"\nbad config values tried on the command line: {len(procs)} ({dict(counts)}), "
        "tracebacks: 0")


# ---- what the fuzz found ----------------------------------------------------------------------

def _run(args, timeout=60) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "pdjax.run", *args, "--workdir=/nonexistent/x"],
                        capture_output=True, text=True, timeout=timeout)


def test_a_count_of_requests_no_run_can_hold_is_a_config_error():
  """workload.num_requests=2**63 passed validate; numpy then failed to make the workload
  (ValueError: Maximum allowed dimension exceeded, a traceback)."""
  proc = _run(["--config=configs/default.py:smoke", "--config.backend=sim",
               "--config.workload.num_requests=9223372036854775808"])
  assert (proc.returncode, proc.stderr.strip()) == (
      2, "config error: workload.num_requests=9223372036854775808 must be at most 10,000,000 "
      "(a run holds its requests in memory)")


@pytest.mark.parametrize("role", ["prefill", "colocated"])
def test_a_huge_instance_count_is_an_error_not_a_hang(role):
  """validate named every instance of the run (the fault check) before any bound: with
  10**20 instances it never returned, memory growing."""
  proc = _run([f"--config.cluster.{role}.instances=100000000000000000000",
               "--config.backend=sim"], timeout=30)
  assert (proc.returncode, proc.stderr.strip()) == (
      2, f"config error: cluster.{role}.instances=100000000000000000000 must be at most "
      "65536 (instances per tier)")


def test_a_context_of_one_token_is_a_config_error():
  """kv.max_model_len=1 passed validate (>= 1) and the run then raised ValueError (a
  traceback) where the workload is fitted: a request needs a prompt token and an output one."""
  proc = _run(["--config=configs/default.py:smoke", "--config.backend=sim",
               "--config.kv.max_model_len=1"])
  assert (proc.returncode, proc.stderr.strip()) == (
      2, "config error: kv.max_model_len=1 must be >= 2 (one prompt and one output token)")


@pytest.mark.parametrize("line,message", [
    ("c.kv.page_size = None", "kv.page_size=None must be an integer"),
    ("c.kv.pages_per_instance = True", "kv.pages_per_instance=True must be an integer"),
    ("c.slo.ttft_s = None", "slo.ttft_s=None must be a number"),
    ("c.model.checkpoint = None", "model.checkpoint=None must be a string"),
    ("c.kv.prefix_cache = None", "kv.prefix_cache=None must be true or false"),
    ("c.server.api_keys = None", "server.api_keys=None must be a string"),
    ("c.workload.rate = None", "workload.rate=None must be a number"),
], ids=["int", "bool-for-int", "float", "str", "bool", "api-keys", "workload"])
def test_a_config_file_writing_the_wrong_type_is_one_line(tmp_path, line, message):
  """A locked ConfigDict takes None for any key and True for an integer one: validate then
  compared None >= 1 (a TypeError traceback) or ran with True as 1."""
  path = tmp_path / "typed.py"
  path.write_text(f"from pdjax.configs.default import get_config as base\n\n\n"
                  f"def get_config():\n  c = base('smoke')\n  c.backend = 'sim'\n  {line}\n"
                  f"  return c\n")
  proc = _run([f"--config={path}"])
  assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (
      2, f"config error: {message}", "")


@pytest.mark.parametrize("key,value,message", [
    ("cluster.prefill.instances", "many", "cluster.prefill.instances='many' must be an integer"),
    ("slo.ttft_s", (1,), "slo.ttft_s=(1,) must be a number"),
    ("scheduler.prefill_buckets", (64, "512"),
     "scheduler.prefill_buckets=(64, '512') must be a tuple of integers"),
    ("plan.map_ttft_s", ("x",), "plan.map_ttft_s=('x',) must be a tuple of numbers"),
    ("server.api_keys", 5, "server.api_keys=5 must be a string"),
    ("scheduler.latency_profile", -1, "scheduler.latency_profile=-1 must be a string"),
    ("kv", 5, "kv=5 must be a section of keys"),
], ids=["str-for-int", "tuple-for-float", "tuple-element", "float-tuple", "api-keys-int",
        "profile-int", "section"])
def test_values_of_another_type_are_a_config_error(key, value, message):
  """(A config that builds its own ConfigDict.) Each was a TypeError traceback; server.api_keys=5
  opened file descriptor 5, scheduler.latency_profile=-1 read from descriptor -1."""
  cfg = get_config("smoke")
  cfg.backend = "sim"
  _put(cfg, key, value)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == message


def test_the_overlap_key_still_takes_a_bool_and_policy_args_anything():
  cfg = get_config("smoke")
  cfg.backend = "sim"
  with cfg.scheduler.ignore_type():
    cfg.scheduler.overlap = True
  config_lib.validate(cfg)
  from pdjax.config_types import type_error
  cfg.scheduler.policy_args.anything = ["goes", 1]
  assert type_error(cfg) is None
