"""What `python -m pdjax.serve`'s engine-core process runs (ServePlan, engine_core.py's plan):
jax on the config's devices, the tokenizer and the weights (configure), the Ray cluster under
cluster.launcher=ray (session), the instances compiled on the driver's thread (build), and at
the end the run's outputs written into the workdir as `pdjax.run` writes them (finish).
Built in the HTTP process from the parsed config, pickled into the spawned process, and only
there does anything import jax.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from pdjax.server.engine_api import PlanError, error_text


@dataclasses.dataclass
class ServePlan:
  cfg: object            # the experiment config (ml_collections), validated without devices
  mcfg: object           # its model config
  run: str               # the run served: colocated, chunked or disaggregated
  name: str              # the model id clients name
  workdir: str
  params: object = None  # host weights, once configure() loaded them
  tokenizer: object = None
  stop_ids: tuple = ()
  ray_cluster: object = None

  def configure(self, startup) -> None:
    """Devices, compile cache, tokenizer and weights; PlanError for what the config gets
    wrong (pdjax.serve exits with "config error: ...")."""
    from pdjax import config as config_lib
    from pdjax.cli import use_cpu_devices
    cfg = self.cfg
    use_cpu_devices(cfg.num_cpu_devices)
    import jax
    try:
      config_lib.validate(cfg, device_count=jax.device_count())
    except config_lib.ConfigError as e:
      raise PlanError(str(e)) from None
    from pdjax.engine.cluster import enable_compile_cache, host_params
    from pdjax.text.stops import load_text
    from pdjax.text.tokenizer import TextError
    enable_compile_cache(cfg.compile_cache_dir)
    self.stop_ids = tuple(self.mcfg.eos_token_ids)
    try:
      if cfg.model.checkpoint or cfg.model.tokenizer:
        self.tokenizer, _, self.stop_ids = load_text(cfg.model.checkpoint, cfg.model.tokenizer,
                                                     self.mcfg)
      if config_lib.launcher(cfg) == "local" or cfg.debug:
        startup.begin("loading weights", cfg.model.checkpoint or
                      f"random {cfg.model.preset} weights, seed {cfg.seed}")
        self.params = host_params(self.mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
                                  dtype=cfg.model.dtype)
        startup.end()
    except (TextError, KeyError, ValueError) as e:
      raise PlanError(e.args[0]) from None

  @contextlib.contextmanager
  def session(self):
    """The Ray cluster's context (a null one without Ray): serving happens inside it."""
    from pdjax.runner.build import ray_cluster_for
    with ray_cluster_for(self.cfg) as self.ray_cluster:
      yield
    self.ray_cluster = None

  def bridge_kwargs(self) -> dict:
    from pdjax.server.prometheus import ServerMetrics
    os.makedirs(self.workdir, exist_ok=True)
    return dict(tokenizer=self.tokenizer, eos_ids=self.stop_ids,
                metrics=ServerMetrics(model_name=self.name),
                requests_path=os.path.join(self.workdir, "requests.jsonl"))

  def build(self, startup):
    """On the driver's thread: the instances compiled, reporting each program to startup."""
    from pdjax.runner.build import build_run
    startup.begin("compiling programs")
    return build_run(self.cfg, self.mcfg, self.run, self.params, self.ray_cluster,
                     progress=startup.program)

  def finish(self, bridge) -> dict:
    """Writes the run's files (after a crash too: what it served); what the HTTP process
    reports: {"served", "error"} (error: the driver's, as "Type: message", or None)."""
    error = error_text(bridge.error) if bridge.error is not None else None
    if bridge.driver is None:     # stopped, or failed, before it was ready: nothing served
      return {"served": False, "error": error}
    from pdjax.runner.execute import run_info_of, summarize_run
    from pdjax.runner.outputs import write_outputs
    result = bridge.result
    summary = summarize_run(self.cfg, self.run, result, result.instances or bridge.instances)
    summary["run_info"] = run_info_of(self.cfg, self.mcfg, self.run, workload={
        "kind": "http", "requests": len(result.requests)})
    write_outputs(self.workdir, self.cfg, self.run, summary, result, requests_written=True)
    return {"served": True, "error": error}
