"""`python -m pdjax.policies --check=module:Class` on a study folder's classes (issue 46): a
good router passes with its comparison to least_loaded, a crash is shown at the user's line, a
router answering outside its candidates fails with what it returned; how a class's kind is
found."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from pdjax import policy_check as checker
from pdjax.scheduler.policies.base import PathChoice, StepPlan

POLICIES = textwrap.dedent('''
    """A study's policies."""
    from pdjax.scheduler.policies.base import PathChoice


    class ShortestQueue:
      """The candidate with the fewest waiting, then running, requests."""

      def choose(self, req, candidates):
        if not candidates:
          return None
        return min(candidates, key=lambda w: (w.num_waiting(), w.num_running()))


    class Crashy:
      def choose(self, req, candidates):
        return candidates[self._share(candidates)]

      def _share(self, candidates):
        return int(1 / (len(candidates) - 2))


    class Stray:
      def choose(self, req, candidates):
        return candidates[0].name if candidates else None


    class ShortLocal:
      """Prompts under `threshold` tokens prefill on their decode instance."""

      def __init__(self, threshold=40, seed=0):
        self.threshold = threshold

      def choose(self, req, prefill_tier, decode_tier, picks=None):
        if req.prompt_len < self.threshold:
          return PathChoice("colocated", "decode")
        return PathChoice("disaggregated", "prefill")


    class Scorer:
      def score(self, req, worker):
        return 0.0
    ''')

STUDY = textwrap.dedent('''
    from pdjax.configs import default


    def get_config(arg=None):
      c = default.get_config("smoke")
      c.scheduler.policy_args.threshold = 64
      return c
    ''')

NUMBER = r"[-+]?\d+\.\d+"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  folder = tmp_path_factory.mktemp("study")
  (folder / "my_policies.py").write_text(POLICIES)
  (folder / "study.py").write_text(STUDY)
  return folder


def _check(target: str, cwd, *flags: str) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  return subprocess.run([sys.executable, "-m", "pdjax.policies", f"--check={target}", *flags],
                        capture_output=True, text=True, cwd=str(cwd), env=env, timeout=300)


def _line_of(folder, text: str) -> int:
  lines = (folder / "my_policies.py").read_text().splitlines()
  return next(i for i, line in enumerate(lines, 1) if text in line)


def _rows(out: list[str], label: str, default: str) -> list[tuple[float, ...]]:
  """Each metric row's numbers: (mine, ±, default's, ±, difference, ±), checked in form."""
  found = []
  for metric, unit in (("goodput (req/s)", "req/s"), ("SLO attainment (%)", "points")):
    pattern = (rf"  {re.escape(metric)}: +{label} ({NUMBER}) ± ({NUMBER}) +{default} "
               rf"({NUMBER}) ± ({NUMBER}) +vs {default}: ({NUMBER}) ± ({NUMBER}) {unit}, "
               rf"(beyond|within) the noise")
    row = out.pop(0)
    m = re.fullmatch(pattern, row)
    assert m, row
    values = tuple(float(v) for v in m.groups()[:6])
    # the mean of the pairs, from the two printed means: each of the three numbers is rounded
    # to its last printed digit, so they may disagree by 1.5 of that digit
    unit = 10.0 ** -len(m.group(5).split(".")[1])
    assert values[4] == pytest.approx(values[0] - values[2], abs=1.5 * unit)
    beyond = abs(values[4]) > values[5]
    assert m.group(7) == ("beyond" if beyond else "within"), row
    found.append(values)
  return found


def test_a_good_router_passes_beside_least_loaded_on_three_workloads(study):
  proc = _check("my_policies:ShortestQueue", study)
  assert (proc.returncode, proc.stderr) == (0, "")
  out = proc.stdout.splitlines()
  assert out[:8] == [
      "check: my_policies:ShortestQueue (router) as scheduler.prefill_router and "
      "scheduler.decode_router; each point also served by the default "
      "(scheduler.prefill_router=least_loaded, scheduler.decode_router=least_loaded), "
      "same requests",
      "backend: sim (roofline cost model, h200)",
      "model: llama3_70b (preset, 70.6B params, bfloat16)",
      "placement: 2xP(tp2) + 2xD(tp2) (disaggregated, 8 chips)",
      "workload: synthetic chat, 100 requests, poisson at 40 req/s | synthetic long_doc_qa, "
      "100 requests, poisson at 40 req/s | synthetic mixed, 100 requests, onoff at 120 req/s",
      "SLO: TTFT <= 250 ms, TPOT <= 30 ms, target 90% attainment",
      "seed: 0, 1, 2",
      "invariants: every request terminal, no KV page leaked, no stall, every answer within "
      "the interface: held in all 18 runs"]
  rest = out[8:]
  titles = ["chat (synthetic chat, 100 requests, poisson at 40 req/s; seeds 0, 1, 2; mean ± "
            "95% interval):",
            "long documents (synthetic long_doc_qa, 100 requests, poisson at 40 req/s; seeds "
            "0, 1, 2; mean ± 95% interval):",
            "a burst (synthetic mixed, 100 requests, onoff at 120 req/s; seeds 0, 1, 2; mean "
            "± 95% interval):",
            "overall (9 workload-seed points, the difference paired per point):"]
  attainments = []
  for title in titles:
    assert rest.pop(0) == title
    goodput, attainment = _rows(rest, "ShortestQueue", "least_loaded")
    attainments.append(attainment[2])
  assert rest == ["check passed: my_policies:ShortestQueue (router) on 18 simulated runs "
                  "beside least_loaded, every invariant held"]
  assert min(attainments[:3]) < 95.0   # the default misses SLOs: there is something to compare


def test_an_exception_in_the_router_is_shown_at_the_users_lines(study):
  proc = _check("my_policies:Crashy", study)
  path = study / "my_policies.py"
  assert (proc.returncode, proc.stdout) == (1, "")
  assert proc.stderr.splitlines() == [
      "check failed on workload chat, seed 0: Crashy raised ZeroDivisionError",
      f"{path}:{_line_of(study, 'self._share(candidates)]')} in choose",
      "    return candidates[self._share(candidates)]",
      f"{path}:{_line_of(study, '1 / (len')} in _share: ZeroDivisionError: division by zero",
      "    return int(1 / (len(candidates) - 2))"]


def test_a_router_answering_outside_its_candidates_fails(study):
  proc = _check("my_policies:Stray", study)
  assert (proc.returncode, proc.stdout) == (1, "")
  line = _line_of(study, "class Stray") + 1
  assert proc.stderr == (
      f"check failed on workload chat, seed 0: scheduler.prefill_router: Stray.choose "
      f"({study / 'my_policies.py'}:{line}) returned 'prefill-0' (str), not one of its "
      f"candidates ['prefill-0', 'prefill-1']: a router returns one of the candidates it is "
      f"given (None only when it is given none)\n")


def test_a_path_policy_from_a_config_folder_gets_its_policy_args(study, tmp_path):
  proc = _check("my_policies:ShortLocal", tmp_path, f"--config={study / 'study.py'}")
  assert (proc.returncode, proc.stderr) == (0, "")
  out = proc.stdout.splitlines()
  assert out[0] == ("check: my_policies:ShortLocal (path) as scheduler.path; each point also "
                    "served by the default (scheduler.path=always_disagg), same requests")
  assert out[-1] == ("check passed: my_policies:ShortLocal (path) on 18 simulated runs beside "
                     "always_disagg, every invariant held")
  assert sum(line.startswith("  ") for line in out) == 8   # 2 metrics x (3 workloads + overall)
  assert all("vs always_disagg: " in line for line in out if line.startswith("  "))


def test_a_class_of_no_policy_kind_is_one_line_and_exit_1(study):
  proc = _check("my_policies:Scorer", study)
  assert (proc.returncode, proc.stdout) == (1, "")
  assert proc.stderr == (
      "check failed: --check='my_policies:Scorer': my_policies.Scorer implements none of the "
      "policy interfaces (router: choose(req, candidates); path: choose(req, prefill_tier, "
      "decode_tier, picks=None); admission: check(req, worker, path, decode_tier); step: "
      "plan(worker, admit); role_switch: decide(now, prefill_tier, decode_tier, "
      "transfer_backlog))\n")


class _Router:
  def choose(self, req, candidates):
    return None


class _Path:
  def choose(self, req, prefill_tier, decode_tier, picks=None):
    return None


class _Declared(_Router):
  kind = "path"


class _Both:
  def check(self, req, worker, path, decode_tier):
    return None

  def plan(self, worker, admit):
    return StepPlan()


@pytest.mark.parametrize("cls,kind", [(_Router, "router"), (_Path, "path"),
                                      (_Declared, "path"), (_Both, None)])
def test_the_kind_comes_from_the_attribute_else_the_interface(cls, kind):
  if kind is not None:
    assert checker.kind_of(cls, "m:C") == kind
    return
  with pytest.raises(checker.CheckFailed) as e:
    checker.kind_of(cls, "m:C")
  assert str(e.value) == (f"--check='m:C': {__name__}._Both implements the interfaces of "
                          f"admission and step: give it a class attribute kind naming the "
                          f"one it serves")


class _Worker:
  def __init__(self, name, role="decode"):
    self.name, self.role = name, role


def test_answers_outside_the_interface_are_named():
  a, b, stranger = _Worker("decode-0"), _Worker("decode-1"), _Worker("prefill-0", "prefill")
  assert checker.problem("router", a, (None, [a, b])) is None
  assert checker.problem("router", None, (None, [])) is None
  assert checker.problem("router", stranger, (None, [a, b])) == (
      "worker 'prefill-0' (prefill), not one of its candidates ['decode-0', 'decode-1']: a "
      "router returns one of the candidates it is given (None only when it is given none)")
  assert checker.problem("router", None, (None, [a])).startswith("None (NoneType), not one")
  assert checker.problem("path", PathChoice("colocated", "decode"), ()) is None
  assert checker.problem("path", PathChoice("disaggregated", "decode"), ()).startswith(
      "PathChoice(path='disaggregated', tier='decode', reason=None) (PathChoice), not a")
  assert checker.problem("admission", 3, ()) == (
      "3 (int), not None (admit) or a str (the reason to reject)")
  assert checker.problem("role_switch", [(a, "prefill")], (0.0, [], [a])) is None
  wrong = checker.problem("role_switch", [(stranger, "prefill")], (0.0, [], [a]))
  assert wrong.startswith("a list holding (<") and wrong.endswith(
      "not only (worker of prefill_tier or decode_tier, 'prefill' or 'decode') pairs")
