"""A command's runs (mode=compare's three, each `repeats` times) served one after another, or on
the simulator in a pool of sim.workers processes (pdjax/process_pool.py; 0: as many as keep
the cores busy to the end, `balanced_size`, for runs of SMALL_RUN requests or more; 1:
in-process), each run writing its own folder where it ran. Runs are independent (own config,
seed, instances and folder; the workload is loaded once per process), and the results come back
in the order of the tasks, so every file written is the same whatever the pool's size.

What a run hands back to the command is its summary and `comparison_view` of its RunResult:
the requests' outcomes that mode=compare's compare.md and latency plot read (runner/outputs.py
write_comparison), not the step records, token lists and prompts, which stay in the run's
folder (and would cost more to send between processes, and to hold for every run, than the
comparison needs).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from pdjax.process_pool import pool_size, run_in_order
from pdjax.request import Status


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
  """What the comparison reads of one served request (metrics/benefit.py's terms and the
  latency CDFs): a Request's fields and properties of the same names, without its tokens."""
  id: str
  status: Status
  prompt_len: int
  output_len: int
  ttft_s: float | None
  tpot_s: float | None
  transfer_s: float

  @classmethod
  def of(cls, r) -> "RequestOutcome":
    return cls(r.id, r.status, r.prompt_len, r.output_len, r.ttft_s, r.tpot_s, r.transfer_s)


def comparison_view(result):
  """A RunResult with the requests as RequestOutcome and no records (steps, samples, transfers,
  role switches, flushes, re-meshes, KV audit, instances); its counts kept."""
  return dataclasses.replace(result, requests=[RequestOutcome.of(r) for r in result.requests],
                             transfers=[], steps=[], samples=[], role_switches=[], flushes=[],
                             remesh_events=[], instances=[], kv_audit=[])


@dataclasses.dataclass(frozen=True)
class RunTask:
  """One run of a command: the config of its repeat (its seed), which run, and its folder."""
  cfg: object
  mcfg: object
  run: str
  run_dir: str


def serve_run(task: RunTask, params=None, ray_cluster=None) -> tuple[dict, object]:
  """The run served and its folder written (runner/execute.run_mode); (summary,
  comparison_view of its RunResult)."""
  from pdjax.runner.execute import run_mode
  summary, result = run_mode(task.cfg, task.mcfg, task.run, task.run_dir, params,
                             ray_cluster=ray_cluster)
  return summary, comparison_view(result)


def _serve_in_worker(task: RunTask) -> tuple[dict, object]:
  """serve_run in a pool's process, without the run's progress bar (the bars of several
  processes would overwrite each other's line; the command counts the runs done instead):
  run_mode's serving (execute) and writing (outputs.write_outputs)."""
  from pdjax.runner.execute import execute
  from pdjax.runner.outputs import write_outputs
  summary, result, _ = execute(task.cfg, task.mcfg, task.run, None)
  write_outputs(task.run_dir, task.cfg, task.run, summary, result)
  return summary, comparison_view(result)


SMALL_RUN = 2000   # sim.workers=0 serves runs of fewer requests in-process: a worker's start
                   # (its imports and workload: ~2-5 s of CPU) costs more than it saves


def workers_for(cfg, tasks: int) -> int:
  """The processes the runs take: on the simulator sim.workers, at most one per run (0:
  balanced_size over os.cpu_count() cores, or in-process for runs of fewer than SMALL_RUN
  requests); 1 (in-process) on the real engine."""
  if cfg.backend != "sim":
    return 1
  workers = int(cfg.get("sim", {}).get("workers", 1))
  if workers == 0:
    requests = int(cfg.workload.get("num_requests", 0))   # (0: a whole trace)
    if 0 < requests < SMALL_RUN:
      return 1
    return balanced_size(tasks, os.cpu_count() or 1)
  return pool_size(workers, tasks)


def balanced_size(tasks: int, cores: int) -> int:
  """How many processes finish `tasks` runs of about equal length soonest on `cores` cores
  (the fewest of those that tie; from `cores` to 1.5 x cores, whose runs are all in memory at
  once, and at most one per run). The operating system shares the cores among the processes:
  3 runs in 3 processes on 2 cores take about 1.5 runs' time, in 2 processes 2 (the third run
  alone at the end, a core idle)."""
  if tasks <= cores:
    return max(1, tasks)

  def span(w: int) -> float:   # in runs' times: full rounds of w, then the rest at once
    rounds, rest = divmod(tasks, w)
    return rounds * w / cores + (max(1.0, rest / cores) if rest else 0.0)
  most = min(tasks, cores + (cores + 1) // 2)
  return min(range(cores, most + 1), key=lambda w: (span(w), w))


def run_tasks(cfg, tasks: list[RunTask], params=None, ray_cluster=None) -> list[tuple]:
  """serve_run of every task, in the tasks' order: in-process, or in a pool of
  workers_for(cfg) processes (the simulator: no parameters, no Ray cluster); there, with
  cfg.progress, one bar counts the runs done."""
  n = workers_for(cfg, len(tasks))
  if n == 1:
    return [serve_run(t, params, ray_cluster) for t in tasks]
  assert params is None and ray_cluster is None, "a pool serves simulated runs only"
  from tqdm import tqdm
  with tqdm(total=len(tasks), desc="runs", unit="run", disable=not cfg.progress,
            file=sys.stderr) as bar:
    return run_in_order(_serve_in_worker, tasks, n, "runs", on_done=lambda: bar.update())
