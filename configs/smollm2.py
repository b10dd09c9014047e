"""Re-exports pdjax/configs/smollm2.py (shipped with the package; edit that file).

Kept so that `--config=configs/smollm2.py` works from a clone's root.
"""

from pdjax.configs.smollm2 import get_config  # noqa: F401
