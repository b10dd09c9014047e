"""docs/config.md is generated from the config schema's source comments and kept current:
every key of get_config() has a description there, and the committed file is byte-identical
to a fresh generation."""

import subprocess
import sys
import textwrap

from helpers.paths import ROOT
from pdjax import config_reference
from pdjax.configs.default import get_config

REFERENCE = ROOT / "docs" / "config.md"
REGENERATE = "python -m pdjax.config --markdown > docs/config.md"


def test_committed_reference_is_current():
  assert REFERENCE.read_bytes() == config_reference.markdown().encode("utf-8"), (
      f"docs/config.md is out of date with the config's source comments; regenerate it "
      f"(from the repository root) with: {REGENERATE}")


def test_every_key_has_a_description():
  text = config_reference.markdown()
  keys = list(config_reference.leaves(get_config()))
  rows = {line.split(" | ")[0][3:-1]: line.split(" | ")[2]
          for line in text.splitlines() if line.startswith("| `")}
  undocumented = [key for key in keys if not rows.get(key, "").strip(" |")]
  assert len(keys) > 100 and not undocumented, (
      f"keys without a description in docs/config.md: {undocumented}; give each a trailing "
      f"`# ...` comment where pdjax/configs/default.py (or workload/loader.py) sets it, then "
      f"run: {REGENERATE}")


def test_the_documented_command_writes_the_reference():
  proc = subprocess.run([sys.executable, "-m", "pdjax.config", "--markdown"], cwd=ROOT,
                        capture_output=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == config_reference.markdown().encode("utf-8")
  assert REGENERATE in proc.stdout.decode("utf-8")


SCHEMA = '''
import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.mode = "a"            # a | b | c (one
                          # line more)
  c.seed = 0
  c.tier = ml_collections.ConfigDict(dict(instances=2, tp=2))   # tp: devices per
  # instances: how many
  #   of them
  c.part = ml_collections.ConfigDict()   # the part
  c.part.lo = 1.0         # req/s; the search starts at [lo, hi] and
  c.part.hi = 16.0        #   doubles hi | and
  c.part.pick = "x"       # x|y|
  c.part.other = "y"      #   z
  if arg == "small":      # fewer
    c.part.hi = 2.0
  return c
'''


def test_comment_conventions(tmp_path, monkeypatch):
  (tmp_path / "toy_schema.py").write_text(textwrap.dedent(SCHEMA))
  monkeypatch.syspath_prepend(str(tmp_path))
  described, sections, variants, _ = config_reference.schema("toy_schema")
  search = "req/s; the search starts at [lo, hi] and doubles hi | and"
  assert described == {
      "mode": "a | b | c (one line more)", "seed": "", "tier.instances": "how many of them",
      "tier.tp": "devices per", "part.lo": search, "part.hi": search, "part.pick": "x|y|z",
      "part.other": "x|y|z"}
  assert sections == {"tier": "", "part": "the part"}
  assert variants == {"small": "fewer"}
  text = config_reference.markdown("toy_schema")
  assert "| `seed` | `0` |  |" in text
  assert f"| `part.hi` | `16.0` | {search.replace('|', chr(92) + '|')} |" in text
  assert "### `:small`\n\nfewer\n\n| Key | Default | `:small` |\n| --- | --- | --- |\n" \
         "| `part.hi` | `16.0` | `2.0` |\n" in text
