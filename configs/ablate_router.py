"""Re-exports pdjax/configs/ablate_router.py (shipped with the package; edit that file).

Kept so that `--config=configs/ablate_router.py` works from a clone's root.
"""

from pdjax.configs.ablate_router import get_config, get_sweep  # noqa: F401
