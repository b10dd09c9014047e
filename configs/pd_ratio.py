"""Re-exports pdjax/configs/pd_ratio.py (shipped with the package; edit that file).

Kept so that `--config=configs/pd_ratio.py` works from a clone's root.
"""

from pdjax.configs.pd_ratio import get_config, get_sweep  # noqa: F401
