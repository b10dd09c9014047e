"""Lists every policy name each scheduler key takes, or checks a policy class of your own.

  python -m pdjax.policies                                  # the listing
  python -m pdjax.policies --check=my_policies:MyRouter     # check a class (from its folder)
  python -m pdjax.policies --check=my_policies:MyRouter --config=study.py

The listing: each key's built-in names, those installed by a package under the entry-point
group `pdjax.policies`, and the weighted router's scorers. A key also takes `module:Attr`, a
class of your own, found with the config file's folder first on sys.path (docs/policies.md).

--check=module:Class imports the class (the current directory and the --config file's folder
first on sys.path), finds its kind (its attribute `kind`, else the interface it implements; a
router serves both scheduler.prefill_router and scheduler.decode_router) and runs it on the
simulator over three short workloads (chat, long documents, a burst) x 3 seeds, each point also
served by the key's built-in default. It fails (exit 1) on an exception in the class (shown at
its line in your file), an answer outside the interface (a router's pick not among its
candidates, ...), a request left open, a leaked KV page or a stall; it passes (exit 0) with
each workload's goodput and SLO attainment beside the default's and the paired 95% interval of
the difference. --config: its scheduler.policy_args reach the class; the check's own setting
(model, chips, workloads, SLO: pdjax/policy_check.py) is fixed.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from pdjax.cli import CONFIG_FLAG, describe_config_flag_error, fail, parse_flags

CHECK = flags.DEFINE_string("check", None, "module:Class: a policy class of your own, run on "
                            "the simulator beside its key's default (see above).")
try:
  CONFIG = config_flags.DEFINE_config_file(
      CONFIG_FLAG, None, "--check: a config file whose scheduler.policy_args reach the class "
      "(its folder is first on sys.path).", lock_config=True)
except Exception as e:  # pylint: disable=broad-except
  fail(describe_config_flag_error(e, sys.argv))


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if CHECK.value is None:
    if CONFIG.value is not None:
      fail(f"--{CONFIG_FLAG} is for --check")
    from pdjax.scheduler.policies.catalog import listing
    print(listing())
    return
  if os.getcwd() not in sys.path:   # (python -m puts it there; the console script does not)
    sys.path.insert(1 if CONFIG.value is not None else 0, os.getcwd())
  from pdjax.policy_check import CheckFailed, check
  args = dict(CONFIG.value.scheduler.get("policy_args", None) or {}) if CONFIG.value else {}
  try:
    print(check(CHECK.value, args))
  except CheckFailed as e:
    print(str(e) if str(e).startswith("check failed") else f"check failed: {e}",
          file=sys.stderr)
    sys.exit(1)


def entry_point():
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
