"""Re-exports pdjax/configs/distserve_repro.py (shipped with the package; edit that file).

Kept so that `--config=configs/distserve_repro.py` works from a clone's root.
"""

from pdjax.configs.distserve_repro import get_config  # noqa: F401
