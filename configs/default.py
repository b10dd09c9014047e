"""Re-exports pdjax/configs/default.py (shipped with the package; edit that file).

Kept so that `--config=configs/default.py` works from a clone's root.
"""

from pdjax.configs.default import get_config  # noqa: F401
