"""Lists every policy name each scheduler key takes: built-in, installed by a package under the
entry-point group `pdjax.policies`, and the weighted router's scorers.

  python -m pdjax.policies

A key also takes `module:Attr`, a class of your own, found with the config file's folder first
on sys.path (docs/policies.md).
"""

from __future__ import annotations

from absl import app

from pdjax.cli import fail, parse_flags


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  from pdjax.scheduler.policies.catalog import listing
  print(listing())


def entry_point():
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
