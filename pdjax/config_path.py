"""A config file's folder goes first on sys.path, so a policy, scorer or workload function it
names by import path (`my_policies:MyRouter`) is found next to it from any working directory.
Also on PYTHONPATH, so the processes a command spawns (the simulator's pool, the server's engine
core) import the same modules."""

from __future__ import annotations

import os
import sys


def use_config_folder(config_file: str) -> str:
  """Puts the folder of `config_file` (path[:variant]) first on sys.path and PYTHONPATH;
  returns the folder."""
  path = config_file.partition(":")[0]
  folder = os.path.dirname(os.path.abspath(path))
  if folder in sys.path:
    sys.path.remove(folder)
  sys.path.insert(0, folder)
  parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != folder]
  os.environ["PYTHONPATH"] = os.pathsep.join([folder, *parts])
  return folder
