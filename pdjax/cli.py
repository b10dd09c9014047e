"""Small helpers shared by the command-line entry points (no jax import)."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
import traceback


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


CONFIG_FLAG = "config"   # every entry point's config file flag
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "default.py")
HELP_FLAGS = {"-h": False, "-?": False, "--help": False, "--helpshort": False,
              "--helpfull": True}   # help flag -> whether it lists every module's flags


def define_config_and_workdir():
  """Defines --config (the experiment config file, default the shipped configs/default.py,
  --config.* overrides applied as it loads) and --workdir, the flags pdjax.run, pdjax.serve,
  pdjax.plan and pdjax.sweep share; returns their holders (config, workdir). Call it once per
  process, where the command defines its flags: ml_collections loads the file (reading
  sys.argv) right here; a bad file or key is one line on stderr (exit 2)."""
  from absl import flags
  from ml_collections import config_flags
  flags.disclaim_key_flags()   # absl files the flags under the calling command, not pdjax.cli
  try:
    config = config_flags.DEFINE_config_file(CONFIG_FLAG, DEFAULT_CONFIG,
                                             "Experiment config file.", lock_config=True)
  except Exception as e:  # pylint: disable=broad-except
    fail(describe_config_flag_error(e, sys.argv))
  workdir = flags.DEFINE_string("workdir", None,
                                "Output folder (default results/<config>-<time>/).")
  return config, workdir


def _config_argument(argv: list[str]) -> str | None:
  """The last --config value on the command line (path[:variant]), or None."""
  found = None
  for i, arg in enumerate(argv[1:], 1):
    name, eq, value = arg.partition("=")
    if name in (f"--{CONFIG_FLAG}", f"-{CONFIG_FLAG}"):
      found = value if eq else (argv[i + 1] if i + 1 < len(argv) else found)
  return found


def _load_config(argument: str | None):
  """get_config() of the --config file (default: the shipped one), or None when that fails."""
  path, colon, variant = (argument or DEFAULT_CONFIG).partition(":")
  try:
    spec = importlib.util.spec_from_file_location("pdjax_config_for_keys", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*([variant] if colon else []))
  except Exception:  # pylint: disable=broad-except
    return None


def _dotted_keys(cfg, prefix: str = "") -> list[str]:
  """Every key of a ConfigDict, sections included, dotted."""
  import ml_collections
  out = []
  for key in cfg.keys():
    out.append(prefix + key)
    if isinstance(cfg[key], ml_collections.ConfigDict):
      out += _dotted_keys(cfg[key], f"{prefix}{key}.")
  return out


def unknown_key_message(key: str, known: list[str]) -> str:
  """`config error: no key workload.rat (did you mean workload.rate?)`: the key of the same
  section with the closest name (difflib), else the key of any section with the closest name;
  no parenthesis when nothing is close."""
  parent, _, leaf = key.rpartition(".")
  siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
  anywhere = {}
  for k in known:
    anywhere.setdefault(k.rpartition(".")[2], k)
  for names in (siblings, anywhere):
    close = difflib.get_close_matches(leaf, list(names), n=1)
    if close:
      return f"config error: no key {key} (did you mean {names[close[0]]}?)"
  return f"config error: no key {key}"


def _unknown_override(argv: list[str], known: set[str]) -> str | None:
  """The first --config.<key> override whose key (or a section on its path) does not exist."""
  for arg in argv[1:]:
    m = re.match(rf"-{{1,2}}(?:no)?{CONFIG_FLAG}\.([^=]+)", arg)
    if m:
      parts = m.group(1).split(".")
      for n in range(1, len(parts) + 1):
        if ".".join(parts[:n]) not in known:
          return ".".join(parts[:n])
  return None


def _raised_in_config_file(error: BaseException, path: str) -> str | None:
  """`ValueError: text` when error came from running the config file at path (its import or
  get_config), else None."""
  text = str(error)
  if "Error whilst parsing config file" in text:   # ml_collections' wrapper of a ValueError
    return text.strip().splitlines()[-1].strip()
  frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
  files = [f.filename for f in frames] + [getattr(error, "filename", None) or ""]  # SyntaxError
  if any(os.path.abspath(f) == os.path.abspath(path) for f in files if f):
    return f"{type(error).__name__}: {first_and_last_line(text)}"
  return None


def describe_config_flag_error(error: BaseException, argv: list[str]) -> str:
  """One line for an error raised while ml_collections loads --config and applies overrides:
  a missing file, a file that raises, an unknown key (with the closest one), else the gist."""
  from absl import flags
  argument = _config_argument(argv)
  path = (argument or DEFAULT_CONFIG).partition(":")[0]
  if argument is not None and not os.path.isfile(path):
    return f"config error: no config file {path}"
  if isinstance(error, (AttributeError, KeyError)):
    config = _load_config(argument)
    known = set(_dotted_keys(config)) if config is not None else set()
    missing = _unknown_override(argv, known) if known else None
    if missing:
      return unknown_key_message(missing, sorted(known))
  raised = _raised_in_config_file(error, path)
  if raised:
    return f"config error: config file {argument or path} raised {raised}"
  if isinstance(error, OSError) and error.__cause__ is not None:   # the file failed to load
    return f"config error: cannot load config file {path}: {first_and_last_line(error.__cause__)}"
  if isinstance(error, flags.Error):
    return f"config error: {first_and_last_line(str(error))}"
  return f"config error: {first_and_last_line(f'{type(error).__name__}: {error}')}"


def _entry_point_module() -> dict:
  """The globals of the module whose function called absl's app.run (its docstring is the
  usage, also when run through the `pdjax` console script, whose __main__ has none)."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    name = frame.f_globals.get("__name__", "")
    if name != __name__ and not name.startswith("absl"):
      return frame.f_globals
    frame = frame.f_back
  return vars(sys.modules["__main__"])


def exit_on_help(argv: list[str]) -> None:
  """-h, -?, --help, --helpshort: the entry point's docstring and its own flags; --helpfull:
  every flag. On stdout, exit 0 (absl's own help flags exit 1, and it has no -h)."""
  args = argv[1:argv.index("--")] if "--" in argv else argv[1:]
  wanted = [HELP_FLAGS[arg] for arg in args if arg in HELP_FLAGS]
  if not wanted:
    return
  from absl import flags
  doc = (_entry_point_module().get("__doc__") or f"USAGE: {argv[0]} [flags]").strip()
  if any(wanted):
    flag_help, tail = flags.FLAGS.get_help(), ""
  else:   # pdjax's own flags (--config: define_config_and_workdir's), under `python -m` or not
    ours = [name for name in flags.FLAGS.flags_by_module_dict()
            if name.startswith("pdjax.") or name == sys.argv[0]]
    flag_help = "\n\n".join(flags.FLAGS.module_help(name) for name in ours)
    tail = "\nTry --helpfull to get a list of all flags.\n"
  print(f"{doc}\n\nflags:\n{flag_help}\n{tail}", end="")
  sys.exit(0)


def parse_flags(argv):
  """absl's flag parser (the entry points' `flags_parser`), but a bad flag, config key or
  config file is one line on stderr (exit 2), not a usage dump or a traceback; help exits 0."""
  from absl import flags
  exit_on_help(argv)
  argument = _config_argument(argv)
  if argument:   # its folder first on sys.path: policies named module:Attr are found there
    from pdjax.config_path import use_config_folder
    use_config_folder(argument)
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except  (a config file may raise anything)
    fail(describe_config_flag_error(e, argv))
  if CONFIG_FLAG in flags.FLAGS:
    try:   # ml_collections defers a config file's load error to the first use of the config
      getattr(flags.FLAGS[CONFIG_FLAG].value, "keys", None)
    except OSError as e:
      fail(describe_config_flag_error(e, argv))
  return rest
