"""Re-exports pdjax/configs/colocated_vs_disagg.py (shipped with the package; edit that file).

Kept so that `--config=configs/colocated_vs_disagg.py` works from a clone's root.
"""

from pdjax.configs.colocated_vs_disagg import get_config, get_sweep  # noqa: F401
