"""Re-exports pdjax/configs/plan_default.py (shipped with the package; edit that file).

Kept so that `--config=configs/plan_default.py` works from a clone's root.
"""

from pdjax.configs.plan_default import get_config  # noqa: F401
