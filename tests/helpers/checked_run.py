"""One run of a config through `execute`, checked as every host-tier and cross-node test
needs: every request of the workload finished and no KV page leaked."""

from pdjax import config as config_lib
from pdjax.runner.execute import execute


def checked_run(cfg, run: str = "colocated", ray_cluster=None):
  """(summary, RunResult, instances) of cfg's `run`; the jax backend's parameters are made
  here when it runs in this process (no ray_cluster)."""
  params = None
  if cfg.backend == "jax" and ray_cluster is None:
    from pdjax.engine.cluster import host_params
    params = host_params(config_lib.validate(cfg), checkpoint="", seed=cfg.seed,
                         dtype=cfg.model.dtype)
  summary, result, instances = execute(cfg, config_lib.validate(cfg), run, params, quiet=True,
                                       ray_cluster=ray_cluster)
  assert summary["kv_pages_leaked"] == 0
  assert [r.status.value for r in result.requests] == ["finished"] * cfg.workload.num_requests
  return summary, result, instances
