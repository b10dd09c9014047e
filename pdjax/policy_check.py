"""`python -m pdjax.policies --check=module:Class`: a policy class of your own, run on the
simulator beside its key's built-in default before an experiment trusts it. Pure Python.

Its kind (attribute `kind`, else the interface it implements, registry.INTERFACES; a router's
choose(req, candidates) is told from a path policy's by its parameters) picks the key(s); the
config names it by import path, so the run's driver builds it as in any experiment. Each
WORKLOADS x SEEDS point (CHECK_SETTING) is served with it and with the default. A run fails the
check on an exception (shown at its lines in the user's file), an answer outside the interface
(`guard`), a broken invariant (the driver's, after every turn: debug; open requests, leaked
pages at the end) or a stall.
"""

from __future__ import annotations

import inspect
import os
import traceback

from pdjax.metrics import compare
from pdjax.metrics.run_info import describe_workload, header_lines
from pdjax.scheduler.policies import registry
from pdjax.scheduler.policies.base import PathChoice, StepPlan

# The check's setting: a published shape on the smoke config's 8 chips, at rates where the
# default misses some SLOs (so a better or worse policy shows), 3 seeds: a few seconds.
CHECK_SETTING = dict(model="llama3_70b", dtype="bfloat16", hardware="h200", ttft_s=0.25,
                     tpot_s=0.03, num_requests=100)
WORKLOADS = (("chat", dict(preset="chat", arrival="poisson", rate=40.0)),
             ("long documents", dict(preset="long_doc_qa", arrival="poisson", rate=40.0)),
             ("a burst", dict(preset="mixed", arrival="onoff", rate=120.0, on_s=0.5,
                              off_s=1.0)))
SEEDS = (0, 1, 2)
KEYS = {"router": ("prefill_router", "decode_router"), "path": ("path",),
        "admission": ("admission",), "step": ("colocated_policy",),
        "role_switch": ("role_switch",)}
ATTR = {"colocated_policy": "step"}   # the key's field of the run's `Policies`
SHOWN = ("goodput_rps", "slo_attainment")
UNITS = {"goodput_rps": "req/s", "slo_attainment": "points"}
PATHS = {("disaggregated", "prefill"), ("colocated", "prefill"), ("colocated", "decode")}


class CheckFailed(Exception):
  """The check's verdict against the class: its message is what the command prints."""


def kind_of(cls, name: str) -> str:
  """The kind the class serves: its attribute `kind`, else the one interface it implements."""
  where = f"--check={name!r}: {cls.__module__}.{cls.__qualname__}"
  declared = getattr(cls, "kind", None)
  if declared is not None:
    if declared not in KEYS:
      raise CheckFailed(f"{where} has kind={declared!r}, not one of {list(KEYS)}")
    if not registry.implements(cls, declared):
      raise CheckFailed(f"{where} has kind={declared!r} but lacks "
                        f"{registry.INTERFACES[declared][1]}")
    return declared
  found = [kind for kind in KEYS if kind != "path" and registry.implements(cls, kind)]
  if "router" in found:   # choose(req, candidates) or choose(req, prefill, decode, picks)
    params = [p for p in inspect.signature(cls.choose).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]   # (self)
    found[found.index("router")] = "path" if len(params) >= 3 else "router"
  if not found:
    kinds = "; ".join(f"{k}: {registry.INTERFACES[k][1]}" for k in KEYS)
    raise CheckFailed(f"{where} implements none of the policy interfaces ({kinds})")
  if len(found) > 1:
    raise CheckFailed(f"{where} implements the interfaces of {' and '.join(found)}: give it "
                      f"a class attribute kind naming the one it serves")
  return found[0]


def _shown(x) -> str:
  if hasattr(x, "name") and hasattr(x, "role"):
    return f"worker {x.name!r} ({x.role})"
  text = repr(x)
  return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(x).__name__})"


METHODS = {"router": "choose", "path": "choose", "admission": "check", "step": "plan",
           "role_switch": "decide"}


def problem(kind: str, out, args: tuple) -> str | None:
  """What is wrong with `out`, the answer of a policy of `kind` to a call with `args` (None:
  nothing)."""
  if kind == "router":
    candidates = args[1]
    if any(out is c for c in candidates) or (out is None and not candidates):
      return None
    return (f"{_shown(out)}, not one of its candidates {[c.name for c in candidates]}: a "
            f"router returns one of the candidates it is given (None only when it is given "
            f"none)")
  if kind == "path" and not (isinstance(out, PathChoice) and (out.path, out.tier) in PATHS):
    return (f"{_shown(out)}, not a PathChoice of path 'disaggregated' on tier 'prefill' or "
            f"'colocated' on tier 'prefill' or 'decode'")
  if kind == "admission" and not (out is None or isinstance(out, str)):
    return f"{_shown(out)}, not None (admit) or a str (the reason to reject)"
  if kind == "step" and not isinstance(out, StepPlan):
    return f"{_shown(out)}, not a StepPlan"
  if kind == "role_switch":
    workers = [*args[1], *args[2]]
    for pair in out:
      if not (isinstance(pair, tuple) and len(pair) == 2 and pair[1] in ("prefill", "decode")
              and any(pair[0] is w for w in workers)):
        return (f"a list holding {_shown(pair)}, not only (worker of prefill_tier or "
                f"decode_tier, 'prefill' or 'decode') pairs")
  return None


class _Proxy:
  """The policy with `method` checked (for instances that take no attribute: __slots__)."""

  def __init__(self, policy, method: str, checked):
    self._policy, self._method, self._checked = policy, method, checked

  def __getattr__(self, attr):
    return self._checked if attr == self._method else getattr(self._policy, attr)


def _defined_at(method) -> str:
  try:
    return f" ({inspect.getsourcefile(method)}:{inspect.getsourcelines(method)[1]})"
  except (OSError, TypeError):
    return ""


def guard(policies, kind: str, label: str) -> None:
  """Makes each of the run's policies of `kind` raise CheckFailed at its first answer outside
  its interface (the driver may go on with it, or fail far from the cause)."""
  method = METHODS[kind]
  for key in KEYS[kind]:
    attr = ATTR.get(key, key)
    policy = getattr(policies, attr)
    original = getattr(policy, method)
    said = f"scheduler.{key}: {label}.{method}{_defined_at(original)} returned"

    def checked(*args, _original=original, _said=said, **kwargs):
      out = _original(*args, **kwargs)
      if kind == "role_switch":
        out = list(out or [])   # (a generator is read once, here)
      wrong = problem(kind, out, args)
      if wrong:
        raise CheckFailed(f"{_said} {wrong}")
      return out
    try:
      setattr(policy, method, checked)
    except AttributeError:   # (__slots__)
      setattr(policies, attr, _Proxy(policy, method, checked))


def base_config(policy_args: dict | None = None):
  """The smoke config with CHECK_SETTING on the simulator."""
  from pdjax.configs import default
  s = CHECK_SETTING
  c = default.get_config("smoke")
  c.backend, c.progress, c.debug = "sim", False, True
  c.model.preset, c.model.dtype, c.sim.hardware = s["model"], s["dtype"], s["hardware"]
  c.slo.ttft_s, c.slo.tpot_s = s["ttft_s"], s["tpot_s"]
  c.workload.num_requests = s["num_requests"]
  c.scheduler.policy_args.update(policy_args or {})
  return c


def point_config(base, kind: str, name: str | None, workload: dict, seed: int):
  """The config of one (workload, seed) point: the class's keys named `name` (None: the
  defaults, and no policy_args)."""
  c = base.copy_and_resolve_references()
  c.mode, c.seed = "colocated" if kind == "step" else "disaggregated", seed
  c.workload.update(workload)
  for key in KEYS[kind]:
    if name is not None:
      c.scheduler[key] = name
  if name is None:
    c.scheduler.policy_args = type(c.scheduler.policy_args)()
  return c


def serve_point(cfg, mcfg, on_policies=None) -> dict:
  """One simulated run of cfg (what runner.execute does, with on_policies(policies) called on
  the run's policies before it serves): summary.json's fields, `stalled` added."""
  from pdjax.runner import serve_requests
  from pdjax.runner.build import build_run
  from pdjax.runner.execute import run_info_of, summarize_run
  from pdjax.workload.loader import load_workload
  mode, instances, kwargs = build_run(cfg, mcfg, cfg.mode, None)
  if on_policies is not None:
    on_policies(kwargs["policies"])
  requests, problems = load_workload(cfg.workload, seed=cfg.seed, vocab_size=mcfg.vocab_size,
                                     eos_ids=mcfg.eos_token_ids,
                                     max_model_len=cfg.kv.max_model_len,
                                     temperature=cfg.sampling.temperature)
  result = serve_requests.serve(mode, instances, requests, **kwargs)
  summary = summarize_run(cfg, cfg.mode, result, result.instances or instances, problems)
  summary["run_info"] = run_info_of(cfg, mcfg, cfg.mode, requests=len(requests))
  summary["stalled"] = [r for r in result.requests if r.reason.startswith("scheduler stalled")]
  return summary


def explain(e: BaseException, user_file: str, label: str, where: str) -> str:
  """What the command prints for an exception a run raised: the frames of the user's file
  (path:line in function, then the line), the innermost with the exception."""
  head = f"check failed on {where}:"
  if isinstance(e, (CheckFailed, registry.PolicyError)):
    return f"{head} {e}"
  error = f"{type(e).__name__}: {e}"
  if type(e).__name__ == "PolicyAnswerError":   # (the driver's own guard, policy_guard.py)
    return f"{head} the driver refused an answer: {e}"
  frames = traceback.extract_tb(e.__traceback__)
  mine = [f for f in frames if os.path.realpath(f.filename) == os.path.realpath(user_file)]
  if mine:
    lines = [f"{head} {label} raised {type(e).__name__}"]
    for f in mine:
      lines += [f"{f.filename}:{f.lineno} in {f.name}" + (f": {error}" if f is mine[-1]
                                                           else ""), f"    {f.line}"]
    return "\n".join(lines)
  if isinstance(e, AssertionError):
    return f"{head} the driver's invariants broke: {error}"
  at = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
  return (f"{head} the run raised {error}{at}, not in {user_file}: something {label} returned "
          f"or changed may be the cause")


def comparison(label: str, default: str, mine: list[dict], theirs: list[dict],
               seeds: list) -> list[list[str]]:
  """Per metric: the class's mean ± half-width, the default's, and the paired 95% interval
  of the difference (metrics.compare.paired, read as compare._versus reads it)."""
  a = compare.aggregate_repeats("default", theirs, seeds)
  b = compare.aggregate_repeats("policy", mine, seeds)
  rows = []
  for key in SHOWN:
    m = compare.BY_KEY[key]
    diff = compare.paired(a, b, m)
    beyond = "beyond" if diff["lo"] > 0 or diff["hi"] < 0 else "within"
    rows.append([f"  {m.label}:", f"{label} {compare.cell(b, m)}",
                 f"{default} {compare.cell(a, m)}",
                 f"vs {default}: {diff['mean'] * m.scale:+{m.spec}} ± "
                 f"{diff['half_width'] * m.scale:{m.spec}} {UNITS[key]}, {beyond} the noise"])
  return rows


def _aligned(lines: list) -> list[str]:
  """The lines, the rows among them (lists) in aligned columns."""
  rows = [r for r in lines if isinstance(r, list)]
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)] + [0]
  return ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
          if isinstance(r, list) else r for r in lines]


def _run_points(name, kind, label, default, base, configs, user_file) -> dict:
  """{workload title: (the class's summaries, the default's)}, seed by seed; CheckFailed at
  the first run that raises, stalls or breaks an invariant."""
  results = {}
  for title, workload in WORKLOADS:
    results[title] = ([], [])
    for seed in SEEDS:
      for i, who in enumerate((name, None)):
        what = f"workload {title}, seed {seed}" + ("" if who else f", the default {default}")
        hook = (lambda p: guard(p, kind, label)) if who else None
        try:
          summary = serve_point(point_config(base, kind, who, workload, seed), configs[who],
                                hook)
        except Exception as e:  # pylint: disable=broad-except  (the verdict names it)
          raise CheckFailed(explain(e, user_file, label if who else default, what)) from None
        if summary["stalled"]:
          raise CheckFailed(
              f"check failed on {what}: the scheduler stalled: {len(summary['stalled'])} of "
              f"{summary['requests']['total']} requests failed with "
              f"{summary['stalled'][0].reason!r}")
        results[title][i].append(summary)
  return results


def check(name: str, policy_args: dict | None = None) -> str:
  """The report of a passing check of the class at import path `name`; CheckFailed (its
  message: what failed, where) otherwise."""
  from pdjax import config as config_lib
  from pdjax.import_path import import_attr
  cls = import_attr("--check", name, CheckFailed)
  if not inspect.isclass(cls):
    raise CheckFailed(f"--check={name!r} is a {type(cls).__name__}, not a class")
  kind = kind_of(cls, name)
  base = base_config(policy_args)
  default = "/".join(dict.fromkeys(base.scheduler[key] for key in KEYS[kind]))
  try:
    configs = {who: config_lib.validate(point_config(base, kind, who, WORKLOADS[0][1], 0))
               for who in (name, None)}
  except config_lib.ConfigError as e:
    raise CheckFailed(f"config error: {e}") from None
  label = cls.__qualname__
  results = _run_points(name, kind, label, default, base, configs,
                        inspect.getsourcefile(cls) or "")
  return report(name, kind, label, default, results, base)


def report(name: str, kind: str, label: str, default: str, results: dict, base) -> str:
  """What ran (run_info.header_lines), then per workload and over all points the class's
  goodput and SLO attainment beside the default's."""
  infos = [dict(mine[0]["run_info"], seed=list(SEEDS)) for mine, _ in results.values()]
  p = infos[0]["placement"]
  runs = 2 * len(WORKLOADS) * len(SEEDS)
  head = header_lines(infos)
  head.insert(2, f"placement: {p['describe']} ({p['run']}, {p['chips']} chips)")
  defaults = ", ".join(f"scheduler.{k}={base.scheduler[k]}" for k in KEYS[kind])
  lines = [f"check: {name} ({kind}) as {' and '.join(f'scheduler.{k}' for k in KEYS[kind])}; "
           f"each point also served by the default ({defaults}), same requests", *head,
           f"invariants: every request terminal, no KV page leaked, no stall, every answer "
           f"within the interface: held in all {runs} runs"]
  for (title, (mine, theirs)), info in zip(results.items(), infos):
    lines.append(f"{title} ({describe_workload(info['workload'])}; seeds "
                 f"{', '.join(map(str, SEEDS))}; mean ± 95% interval):")
    lines += comparison(label, default, mine, theirs, list(SEEDS))
  points = [f"{t}/{s}" for t in results for s in SEEDS]
  lines.append(f"overall ({len(points)} workload-seed points, the difference paired per "
               f"point):")
  lines += comparison(label, default, [s for mine, _ in results.values() for s in mine],
                      [s for _, theirs in results.values() for s in theirs], points)
  lines.append(f"check passed: {name} ({kind}) on {runs} simulated runs beside {default}, "
               f"every invariant held")
  return "\n".join(_aligned(lines))
