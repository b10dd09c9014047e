"""Small helpers shared by the command-line entry points (no jax import)."""

from __future__ import annotations

import os
import re
import sys


def fail(message: str, code: int = 2) -> None:
  """Prints one line on stderr and exits non-zero (no traceback)."""
  print(" ".join(message.split()), file=sys.stderr)
  sys.exit(code)


def use_cpu_devices(n: int) -> None:
  """Asks XLA for n virtual CPU devices; must run before jax is imported. No effect on GPU/TPU."""
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={n}".strip()


def first_and_last_line(message: str) -> str:
  """Folds a multi-line library message (sometimes a whole traceback) to its gist."""
  lines = [l.strip() for l in str(message).strip().splitlines() if l.strip()]
  if len(lines) <= 1:
    return lines[0] if lines else ""
  head = lines[0].split("Traceback")[0].strip()
  return f"{head} {lines[-1]}"


def describe_config_flag_error(error: Exception, argv: list[str]) -> str:
  """One line for an error raised while ml_collections parses --config and its overrides."""
  if isinstance(error, (AttributeError, KeyError)):
    missing = str(error).strip("\"' ")
    for arg in argv:
      m = re.match(r"--config\.([\w.]+)", arg)
      if m and missing in m.group(1).split("."):
        return f"config error: unknown config key {m.group(1)!r} (in {arg})"
  return f"config error: {first_and_last_line(f'{type(error).__name__}: {error}')}"


def parse_flags(argv):
  """absl's flag parser, but a bad flag or config key is one line on stderr (exit 2), not a
  usage dump (the entry points' `flags_parser`)."""
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(f"config error: {first_and_last_line(str(e))}")
