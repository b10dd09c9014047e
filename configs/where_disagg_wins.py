"""Re-exports pdjax/configs/where_disagg_wins.py (shipped with the package; edit that file).

Kept so that `--config=configs/where_disagg_wins.py` works from a clone's root.
"""

from pdjax.configs.where_disagg_wins import get_config  # noqa: F401
