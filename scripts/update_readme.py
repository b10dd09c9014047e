"""Regenerates README.md's recorded output of the main command from a real run.

  python scripts/update_readme.py [-- extra pdjax.run flags]

Runs `python -m pdjax.run` (the embedded default config) as a user would, timing the whole
command, then rewrites the block of README.md between the markers
`<!-- main-job-output: begin -->` and `<!-- main-job-output: end -->` with what it printed
(the header and the side-by-side table), compare.md's conclusion lines, and one line saying
when, on what machine and how long the command took (wall and CPU, compile cache cold or
warm). tests/runner/test_main_job.py fails when the table's rows differ from the command's.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- main-job-output: begin -->", "<!-- main-job-output: end -->"


def run_main_job(extra: list[str], workdir: str) -> tuple[str, float, float]:
  """(stdout, wall seconds, CPU seconds) of the main command writing into workdir."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", f"--workdir={workdir}",
                         "--config.progress=False", *extra],
                        capture_output=True, text=True, cwd=ROOT)
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    sys.exit(f"pdjax.run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return proc.stdout, wall, cpu


def conclusion(compare_md: str) -> list[str]:
  """compare.md's conclusion bullets."""
  body = compare_md.split("## Conclusion", 1)[1]
  return [line for line in body.strip().splitlines() if line.startswith("- ")]


def block(stdout: str, bullets: list[str], wall: float, cpu: float, cache: str) -> str:
  printed = stdout.split("\nresults:", 1)[0].rstrip()
  when = datetime.date.today().isoformat()
  return "\n".join([
      BEGIN, "```", printed, "```", "",
      "compare.md's conclusion, from these numbers (each difference judged by its interval "
      "paired over the seeds; with three modes, Holm-adjusted over every pair a line ranks):", "", *bullets, "",
      f"Recorded {when} on {platform.machine()} with {os.cpu_count()} cores "
      f"(load average {os.getloadavg()[0]:.1f} after): the whole command took {wall:.0f} s "
      f"wall ({cpu:.0f} s CPU), compile cache {cache} (`python scripts/update_readme.py`).",
      END])


def main() -> None:
  extra = [a for a in sys.argv[1:] if a != "--"]
  cache = os.path.expanduser(next((a.split("=", 1)[1] for a in extra
                                   if a.startswith("--config.compile_cache_dir=")),
                                  "~/.cache/pdjax/xla"))
  state = "warm" if os.path.isdir(cache) and os.listdir(cache) else "cold"
  with tempfile.TemporaryDirectory() as tmp:
    workdir = os.path.join(tmp, "run")
    stdout, wall, cpu = run_main_job(extra, workdir)
    with open(os.path.join(workdir, "compare.md")) as f:
      bullets = conclusion(f.read())
  path = os.path.join(ROOT, "README.md")
  with open(path) as f:
    readme = f.read()
  if BEGIN not in readme or END not in readme:
    sys.exit(f"README.md has no {BEGIN} ... {END} block")
  new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END),
               lambda _: block(stdout, bullets, wall, cpu, state), readme, flags=re.S)
  with open(path, "w") as f:
    f.write(new)
  print(f"README.md: main job output replaced ({wall:.0f} s wall, cache {state})")


if __name__ == "__main__":
  main()
