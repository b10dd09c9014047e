"""A researcher's study folder for the tests that run one user policy everywhere (issue 46):
the real engine, Ray, the server and a sweep (tests/scheduler/test_user_policies_everywhere.py,
tests/distributed/test_ray_user_policies.py). The folder lives outside the repository and the
commands run from another folder, so `my_policies` is found only because the config file's
folder goes first on sys.path and PYTHONPATH (pdjax/config_path.py).

my_policies.py holds a router that always takes the candidate at `index` (scheduler.policy_args)
and a path policy keeping prompts under 40 tokens on their decode instance (colocated there);
on import it appends its process id to imported_by.txt beside it, so a test can tell which
processes needed it.
"""

import json
import pathlib
import textwrap

POLICIES = textwrap.dedent('''
    """A study's policies: a router that always takes one position, a path by prompt length."""
    import os

    from pdjax.scheduler.policies.base import PathChoice

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imported_by.txt"),
              "a") as _f:
      _f.write(f"{os.getpid()}\\n")


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
    ''')

# The engine's smoke config (TP2 instances, 2 per tier), disaggregated, 6 requests, shorter
# documents and one bucket per step kind (28 programs to compile, not 40); both routers take
# the last candidate (prefill-1, decode-1), the path policy splits by prompt length.
STUDY = textwrap.dedent('''
    from pdjax.configs import default


    def get_config(arg=None):
      c = default.get_config("smoke")
      c.mode, c.progress = "disaggregated", False
      c.workload.num_requests = 6
      c.workload.doc_prompt_len = (96, 120)
      c.kv.max_model_len = 192
      c.scheduler.prefill_buckets = (128,)
      c.scheduler.decode_buckets = (8,)
      c.scheduler.prefill_router = "my_policies:Fixed"
      c.scheduler.decode_router = "my_policies:Fixed"
      c.scheduler.path = "my_policies:ShortOnDecode"
      c.scheduler.policy_args.index = -1
      return c
    ''')

SHORT = 40   # ShortOnDecode's threshold


def make_study(folder: pathlib.Path, **extra_files: str) -> pathlib.Path:
  """my_policies.py and study.py (and extra_files: {name: text}) in `folder` (created)."""
  folder.mkdir(parents=True)
  (folder / "my_policies.py").write_text(POLICIES)
  (folder / "study.py").write_text(STUDY)
  for name, text in extra_files.items():
    (folder / name).write_text(text)
  return folder


def importers(folder: pathlib.Path) -> list[int]:
  """The process ids that imported the folder's my_policies, in order."""
  path = folder / "imported_by.txt"
  return [int(p) for p in path.read_text().split()] if path.exists() else []


def rows_of(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def check_routed(rows: list[dict], prefill: str, decode: str) -> None:
  """Every request finished where the study's policies sent it: prompts under SHORT tokens
  prefilled and decoded on `decode` (colocated there), the rest prefilled on `prefill` and
  decoded on `decode`; both paths taken."""
  assert [r["status"] for r in rows] == ["finished"] * len(rows)
  for r in rows:
    short = r["prompt_len"] < SHORT
    path = "colocated" if short else "disaggregated"
    assert (r["path"], r["path_reason"]) == (path, {"policy": "ShortOnDecode",
                                                     "choice": path}), r
    assert (r["prefill_instance"], r["decode_instance"]) == (decode if short else prefill,
                                                             decode), r
  assert {r["path"] for r in rows} == {"colocated", "disaggregated"}   # both branches ran
