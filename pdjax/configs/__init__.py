"""The experiment configs, shipped with the package so an installed pdjax finds its default.

`python -m pdjax.run` (or the `pdjax` script) without --config loads default.py here; the
others build on it through `sibling_config`. In a clone, configs/<name>.py re-exports these.
CONFIG_DIR is this folder, for `--config=<CONFIG_DIR>/pd_ratio.py` from an installed copy.
"""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
