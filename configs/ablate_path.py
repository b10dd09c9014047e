"""Re-exports pdjax/configs/ablate_path.py (shipped with the package; edit that file).

Kept so that `--config=configs/ablate_path.py` works from a clone's root.
"""

from pdjax.configs.ablate_path import get_config, get_sweep  # noqa: F401
