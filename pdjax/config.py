"""Config validation: fail fast, before any compile, with one line that names the key.

Configs are Python files returning a locked `ml_collections.ConfigDict` (unknown keys fail at
override time); this module checks the values. Pure Python (no jax): the device count is passed
in by the caller once jax is up.
"""

from __future__ import annotations

import math
import os

from pdjax.config_remesh import remesh_error
from pdjax.kv.host_tier import HOST_TIER_POLICIES
from pdjax.kv.offload_admission import HOST_TIER_ADMISSIONS
from pdjax.kv.prefix_cache import EVICTION_POLICIES
from pdjax.models.llama_config import PRESETS, LlamaConfig, config_from_hf
from pdjax.models.orbax_checkpoint import checkpoint_format
from pdjax.models.param_layout import LAYOUTS
from pdjax.workload.loader import validate_workload

MODES = ("colocated", "disaggregated", "hybrid", "compare", "compare_all")
MAX_INSTANCES = 65536   # per tier: the checks below name every instance (a huge count hung)
MAX_REQUESTS = 10_000_000   # per run (2**63 failed in numpy, a traceback)


class ConfigError(ValueError):
  """A bad config value; str() is the one line shown to the user."""


TRANSFER_FAILURE_POLICIES = ("retry_then_recompute", "fail")


def fault_spec(cfg):
  """The run's FaultSpec (faults.*), with instance names checked against the cluster."""
  from pdjax.faults.spec import FaultSpecError, check_instance_names, parse_faults
  try:
    spec = parse_faults(cfg.get("faults", {}), cfg.seed)
    names = sorted({f"{role}-{i}" for mode in {RUNS[m] for m in modes(cfg)}
                    for role, n, _ in tiers(cfg)[mode] for i in range(n)})
    check_instance_names(spec, names)
  except FaultSpecError as e:
    raise ConfigError(str(e)) from None
  return spec


def flush_schedule(cfg) -> tuple[tuple[float, str], ...]:
  """kv.flush_tenants "tenant@seconds,..." -> ((seconds, tenant), ...) sorted by time: each
  tenant's cached pages are forgotten on every instance at that time of the run."""
  text = str(cfg.kv.get("flush_tenants", "") or "").strip()
  out = []
  for item in filter(None, (x.strip() for x in text.split(","))):
    tenant, at, t = item.rpartition("@")
    try:
      seconds = float(t)
    except ValueError:
      seconds = -1.0
    _require(bool(at and tenant) and seconds >= 0 and math.isfinite(seconds),
             "kv.flush_tenants", text, f"item {item!r} is not tenant@seconds (seconds >= 0)")
    out.append((seconds, tenant))
  return tuple(sorted(out))


def _require(ok: bool, key: str, value, why: str) -> None:
  if not ok:
    raise ConfigError(f"{key}={value!r} {why}")


def model_config(cfg) -> LlamaConfig:
  if cfg.model.checkpoint:
    _require(os.path.isdir(cfg.model.checkpoint), "model.checkpoint", cfg.model.checkpoint,
             "is not a directory")
    try:   # an orbax folder (pdjax.convert) or an HF one; both carry the HF config.json
      checkpoint_format(cfg.model.checkpoint)
      return config_from_hf(cfg.model.checkpoint)
    except (ValueError, KeyError, FileNotFoundError) as e:
      raise ConfigError(str(e)) from None
  _require(cfg.model.preset in PRESETS, "model.preset", cfg.model.preset,
           f"is not one of {sorted(PRESETS)}")
  return PRESETS[cfg.model.preset]


def check_tokenizer(cfg, mcfg: LlamaConfig) -> None:
  """model.tokenizer (default: the checkpoint folder, when it has a tokenizer.json) must hold
  a tokenizer.json whose token ids fit the model's vocabulary."""
  from pdjax.text.tokenizer import TextError, has_tokenizer, vocab_size_of
  folder = cfg.model.get("tokenizer", "")
  if folder:
    _require(has_tokenizer(folder), "model.tokenizer", folder,
             "is not a folder with a tokenizer.json")
  folder = folder or cfg.model.checkpoint
  if not has_tokenizer(folder):
    return
  try:
    size = vocab_size_of(folder)
  except TextError as e:
    raise ConfigError(str(e)) from None
  _require(size <= mcfg.vocab_size, "model.tokenizer", folder,
           f"has token ids up to {size - 1}, outside the model's vocab_size={mcfg.vocab_size}")


def tiers(cfg) -> dict[str, list[tuple[str, int, int]]]:
  """For each serving mode the (role, instances, tp) tiers it runs on."""
  c = cfg.cluster
  return {
      "colocated": [("colocated", c.colocated.instances, c.colocated.tp)],
      "disaggregated": [("prefill", c.prefill.instances, c.prefill.tp),
                        ("decode", c.decode.instances, c.decode.tp)],
      # hybrid: the P-heavy instances serve as the prefill tier, the D-heavy as the decode
      # tier (their names prefill-<i>, decode-<i>): runner/hybrid.py
      "hybrid": [("prefill", c.p_heavy.instances, c.p_heavy.tp),
                 ("decode", c.d_heavy.instances, c.d_heavy.tp)],
  }


RUNS = {"colocated": "colocated", "chunked": "colocated", "disaggregated": "disaggregated",
        "hybrid": "hybrid"}
COMPARED = {"compare": ["colocated", "chunked", "disaggregated"],
            "compare_all": ["colocated", "chunked", "disaggregated", "hybrid"]}
HYBRID_PATHS = ("taichi", "always_colocated", "always_disagg")   # a prompt starts on P-heavy
                                                                 # (taichi: or on D-heavy)


def tier_key(mode: str, role: str) -> str:
  """The cluster.<key> a tier of `mode` is configured by (hybrid: p_heavy, d_heavy)."""
  return {"prefill": "p_heavy", "decode": "d_heavy"}[role] if mode == "hybrid" else role


def modes(cfg) -> list[str]:
  """The runs of an experiment: compare = plain colocated, chunked-prefill colocated and
  disaggregated, on the same workload and chips (subfolders colocated/, chunked/,
  disaggregated/); compare_all adds hybrid (hybrid/)."""
  return list(COMPARED.get(cfg.mode, [cfg.mode]))


def _check_hybrid(cfg, mcfg: LlamaConfig) -> None:
  """cluster.p_heavy / cluster.d_heavy (mode=hybrid, compare_all) and the hybrid run's path:
  mode=hybrid takes scheduler.path from HYBRID_PATHS (compare_all's hybrid run: taichi)."""
  if "hybrid" not in modes(cfg):
    return
  for kind in ("p_heavy", "d_heavy"):
    tier, key = cfg.cluster[kind], f"cluster.{kind}"
    _require(type(tier.instances) is int and 1 <= tier.instances <= MAX_INSTANCES,
             f"{key}.instances", tier.instances, f"must be an integer in [1, {MAX_INSTANCES}]")
    _require(type(tier.tp) is int and tier.tp >= 1, f"{key}.tp", tier.tp,
             "must be an integer >= 1")
    for what, n in (("num_kv_heads", mcfg.num_kv_heads), ("num_heads", mcfg.num_heads),
                    ("intermediate_size", mcfg.intermediate_size)):
      _require(n % tier.tp == 0, f"{key}.tp", tier.tp, f"does not divide the model's {what}={n}")
    budget, top = tier.chunk_budget, max(cfg.scheduler.prefill_buckets)
    _require(type(budget) is int and 1 <= budget <= top, f"{key}.chunk_budget", budget,
             f"must be within [1, {top}] (the largest prefill bucket)")
    _require(tier.get("hosts", 1) == 1, f"{key}.hosts", tier.get("hosts", 1),
             "must be 1 (a hybrid instance spans one host so far)")
    pages, per_seq = tier.get("kv_pages", 0), -(-cfg.kv.max_model_len // cfg.kv.page_size)
    _require(pages == 0 or pages >= per_seq, f"{key}.kv_pages", pages,
             f"cannot hold one max_model_len sequence ({per_seq} pages); 0 means "
             f"kv.pages_per_instance")
  p, d = cfg.cluster.p_heavy.tp, cfg.cluster.d_heavy.tp
  _require(p % d == 0 or d % p == 0, "cluster.d_heavy.tp", d,
           f"and cluster.p_heavy.tp={p}: one must divide the other to move KV")
  if cfg.mode == "hybrid":   # (a built-in path made for prefill and decode tiers is refused;
    from pdjax.scheduler.policies import PATHS   # your own class is yours to judge)
    path = cfg.scheduler.path
    _require(path in HYBRID_PATHS or path not in PATHS, "scheduler.path", path,
             f"is not a path of mode=hybrid (built-in: {', '.join(HYBRID_PATHS)}; or your own)")
    _require(cfg.scheduler.get("role_switch", "none") == "none", "scheduler.role_switch",
             cfg.scheduler.get("role_switch"), "must be none with mode=hybrid (its instances "
             "keep their kind)")


def load_config_module(path: str):
  """Imports a config file by path (e.g. a sibling config a sweep config builds on)."""
  import importlib.util
  name = "pdjax_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sibling_config(config_file: str, name: str = "default.py"):
  """The config module `name` next to `config_file` (pass __file__)."""
  return load_config_module(os.path.join(os.path.dirname(os.path.abspath(config_file)), name))


LAUNCHERS = ("local", "ray")
RAY_ACCELERATORS = ("auto", "cpu", "gpu", "tpu")


def _check_host_tier(cfg) -> None:
  """kv.host_tier_pages / kv.host_tier_policy (issue 18): the host tier holds prefix pages by
  their prefix-cache names, so it needs the prefix cache; so far it runs on the simulator."""
  kv = cfg.kv
  pages = kv.get("host_tier_pages", 0)
  _require(isinstance(pages, int) and pages >= 0, "kv.host_tier_pages", pages,
           "must be an integer >= 0 (0: no host tier)")
  _require(kv.get("host_tier_policy", "lru") in HOST_TIER_POLICIES, "kv.host_tier_policy",
           kv.get("host_tier_policy"), f"is not one of {', '.join(HOST_TIER_POLICIES)}")
  admission = kv.get("host_tier_admission", "all")
  _require(admission in HOST_TIER_ADMISSIONS, "kv.host_tier_admission", admission,
           f"is not one of {', '.join(HOST_TIER_ADMISSIONS)}")
  half_life = kv.get("host_tier_half_life_s", 60.0)
  _require(math.isfinite(half_life) and half_life > 0, "kv.host_tier_half_life_s", half_life,
           "must be a finite number > 0")
  _require(kv.get("host_tier_handoff", "transfer") in ("transfer", "host"),
           "kv.host_tier_handoff", kv.get("host_tier_handoff"), "is not one of transfer, host")
  _require(kv.get("host_tier_handoff", "transfer") == "transfer" or pages,
           "kv.host_tier_handoff", kv.get("host_tier_handoff"),
           "needs a host tier (kv.host_tier_pages > 0)")
  if pages:
    _require(kv.prefix_cache, "kv.host_tier_pages", pages,
             "needs kv.prefix_cache=True (host pages are found by their prefix names)")
  if pages and launcher(cfg) == "ray":
    _require(kv.get("host_tier_handoff", "transfer") == "transfer", "kv.host_tier_handoff",
             kv.get("host_tier_handoff"), "needs cluster.launcher=local (with ray: transfer)")
  gbps = cfg.sim.get("host_link_gbps", 0.0)
  _require(math.isfinite(gbps) and gbps >= 0, "sim.host_link_gbps", gbps,
           "must be a finite number >= 0 (0: the hardware preset's)")
  _check_nodes(cfg)


def _check_nodes(cfg) -> None:
  """cluster.nodes and what crosses between them (issue 32): store reloads from another node
  (kv.remote_store) and sealing (kv.seal_cross_node)."""
  kv, nodes = cfg.kv, cfg.cluster.get("nodes", 1)
  _require(isinstance(nodes, int) and nodes >= 1, "cluster.nodes", nodes,
           "must be an integer >= 1")
  _require(nodes == 1 or cfg.backend == "sim" or launcher(cfg) == "ray", "cluster.nodes", nodes,
           "needs cluster.launcher=ray or backend='sim' (one process is one node)")
  _require(nodes == 1 or cfg.scheduler.get("role_switch", "none") != "remesh", "cluster.nodes",
           nodes, "needs scheduler.role_switch other than remesh (re-meshing is within a node)")
  for key in ("cross_node_gbps", "seal_gbps"):
    value = kv.get(key, 1.0)
    _require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0,
             f"kv.{key}", value, "must be a finite number > 0")
  latency = kv.get("cross_node_latency_s", 0.0)
  _require(isinstance(latency, (int, float)) and math.isfinite(latency) and latency >= 0,
           "kv.cross_node_latency_s", latency, "must be a finite number >= 0")
  if nodes > 1:
    _require(not kv.get("stream_layers", 0), "kv.stream_layers", kv.get("stream_layers"),
             "needs cluster.nodes=1 (layer-group streams are not sealed or timed across nodes)")
    _require(kv.get("host_tier_handoff", "transfer") == "transfer", "kv.host_tier_handoff",
             kv.get("host_tier_handoff"), "needs cluster.nodes=1 (a node's tier is its own)")
  if kv.get("remote_store", False):
    _require(kv.get("host_tier_pages", 0) > 0, "kv.remote_store", True,
             "needs a host tier on every node (kv.host_tier_pages > 0)")
    _require(nodes > 1, "kv.remote_store", True,
             "needs cluster.nodes > 1 (with one node every store is local)")
    _require(cfg.backend == "sim" or cfg.scheduler.get("latency_profile", ""),
             "kv.remote_store", True, "needs scheduler.latency_profile on the jax backend (the "
             "recompute a remote reload must beat is predicted from it)")
  if kv.get("seal_cross_node", False):
    _require(nodes > 1, "kv.seal_cross_node", True,
             "needs cluster.nodes > 1 (nothing leaves a node)")
  tamper = cfg.faults.get("tamper_prob", 0.0)
  if tamper:
    _require(kv.get("seal_cross_node", False) and launcher(cfg) == "ray", "faults.tamper_prob",
             tamper, "needs kv.seal_cross_node=True and cluster.launcher=ray (a real sealed "
             "piece to flip)")


def launcher(cfg) -> str:
  """cluster.launcher: local (every instance in this process) or ray (one process each)."""
  return cfg.cluster.get("launcher", "local")


def _check_launcher(cfg) -> None:
  c = cfg.cluster
  _require(launcher(cfg) in LAUNCHERS, "cluster.launcher", launcher(cfg),
           f"is not one of {list(LAUNCHERS)}")
  if launcher(cfg) != "ray":
    return
  _require(cfg.backend == "jax", "cluster.launcher", "ray",
           f"needs backend='jax' (the simulator runs in one process), got {cfg.backend!r}")
  _require(c.get("ray_accelerator", "auto") in RAY_ACCELERATORS, "cluster.ray_accelerator",
           c.get("ray_accelerator"), f"is not one of {list(RAY_ACCELERATORS)}")
  timeout = c.get("pull_timeout_s", 30.0)
  _require(math.isfinite(timeout) and timeout > 0, "cluster.pull_timeout_s", timeout,
           "must be a finite number > 0")
  timeout = c.get("collective_timeout_s", 300.0)
  _require(math.isfinite(timeout) and timeout > 0, "cluster.collective_timeout_s", timeout,
           "must be a finite number > 0")
  _require(bool(str(c.get("transfer_host", "127.0.0.1")).strip()), "cluster.transfer_host",
           c.get("transfer_host"), "must name an address to listen on")


def _check_hosts(cfg, role: str) -> None:
  """cluster.<role>.hosts: an instance over that many processes (multi-controller JAX), each
  owning tp / hosts devices; the engine runs them under the Ray launcher only."""
  tier = cfg.cluster[role]
  hosts = tier.get("hosts", 1)
  _require(type(hosts) is int and hosts >= 1, f"cluster.{role}.hosts", hosts,
           "must be an integer >= 1")
  _require(tier.tp % hosts == 0, f"cluster.{role}.hosts", hosts,
           f"does not divide cluster.{role}.tp={tier.tp} (each host owns tp / hosts devices)")
  if hosts > 1 and cfg.backend == "jax":
    _require(launcher(cfg) == "ray", f"cluster.{role}.hosts", hosts,
             "needs cluster.launcher='ray' (one process per host)")
    kv, used = cfg.kv, any(r == role for run in modes(cfg) for r, _, _ in tiers(cfg)[RUNS[run]])
    for on, what in ((kv.get("host_tier_pages", 0) > 0, "kv.host_tier_pages > 0"),
                     (kv.get("stream_layers", 0) > 0, "kv.stream_layers > 0"),
                     (kv.get("seal_cross_node", False), "kv.seal_cross_node"),
                     (cfg.cluster.get("nodes", 1) > 1, "cluster.nodes > 1"),
                     (cfg.scheduler.get("role_switch", "none") != "none",
                      f"scheduler.role_switch={cfg.scheduler.get('role_switch')!r}")):
      _require(not (on and used), f"cluster.{role}.hosts", hosts,
               f"is not supported with {what} yet (an instance over several hosts has no node "
               f"KV store, streams, sealed transfers, node placement or role changes)")
  if cfg.backend == "sim":
    _check_host_chips(cfg, role, hosts)


def _check_host_chips(cfg, role: str, hosts: int) -> None:
  """On the simulator, a tier that runs may put no more chips on a host (tp / hosts) than the
  hardware's hosts hold (sim.hardware's chips_per_host; a file without it: no limit)."""
  from pdjax.sim.hardware import hardware_for
  if all(r != role for run in modes(cfg) for r, _, _ in tiers(cfg)[RUNS[run]]):
    return
  hw, tp = hardware_for(cfg.sim.hardware), cfg.cluster[role].tp
  if hw.chips_per_host and tp // hosts > hw.chips_per_host:
    where = "one host" if hosts == 1 else "each host"
    raise ConfigError(f"cluster.{role}.tp={tp} over hosts={hosts} puts {tp // hosts} chips on "
                      f"{where}; hardware {hw.name} has {hw.chips_per_host} per host (set "
                      f"cluster.{role}.hosts={hw.hosts_for(tp)})")


def _check_buckets(key: str, buckets) -> None:
  ok = (len(buckets) > 0 and all(isinstance(b, int) and b > 0 for b in buckets)
        and list(buckets) == sorted(set(buckets)))
  _require(ok, key, tuple(buckets), "must be positive integers in increasing order")


DEFAULT_PROFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim", "profiles",
                               "cpu_tiny_float32.json")


def sim_profile(cfg, mcfg: LlamaConfig) -> dict | None:
  """The calibrated profile a sim run uses (sim.profile, or the shipped CPU profile), checked
  against the run's model, dtype and TP degrees; None for the roofline model."""
  if cfg.backend != "sim" or cfg.sim.cost_model != "calibrated":
    return None
  return _checked_profile(cfg, mcfg, cfg.sim.profile or DEFAULT_PROFILE, "sim.profile")


def latency_feedback(cfg) -> int:
  """slo_headroom's feedback window (scheduler.latency_feedback; 0 off): auto (-1) is 16
  requests on the real engine and off on the simulator, whose predictions come from the step
  model its instances run (an error there is the policy's, which a correction would hide)."""
  window = cfg.scheduler.get("latency_feedback", -1)
  if window == -1:
    return 16 if cfg.backend == "jax" else 0
  return window


def latency_profile(cfg, mcfg: LlamaConfig) -> dict | None:
  """The calibrated profile the real engine's path predictions use (scheduler.latency_profile:
  slo_headroom's step costs instead of measured rates), checked as sim_profile's; None when
  unset or on the simulator (whose instances carry their own cost model)."""
  path = cfg.scheduler.get("latency_profile", "")
  if cfg.backend != "jax" or not path:
    return None
  return _checked_profile(cfg, mcfg, path, "scheduler.latency_profile")


def _checked_profile(cfg, mcfg: LlamaConfig, path: str, key: str) -> dict:
  import dataclasses
  from pdjax.sim import calibrated
  try:
    profile = calibrated.load_profile(path, key)
    used = {tp for run in modes(cfg) for _, _, tp in tiers(cfg)[RUNS[run]]}
    calibrated.check_profile(profile, path, model=dataclasses.asdict(mcfg),
                             dtype=cfg.model.dtype, tps=used, key=key)
  except calibrated.ProfileError as e:
    raise ConfigError(str(e)) from None
  return profile


def validate(cfg, device_count: int | None = None) -> LlamaConfig:
  """Raises ConfigError on the first bad value; returns the model config."""
  from pdjax.config_types import type_error
  wrong = type_error(cfg)   # before any check compares a value of the wrong type
  if wrong:
    raise ConfigError(wrong)
  _require(cfg.mode in MODES, "mode", cfg.mode, f"is not one of {list(MODES)}")
  _require(cfg.backend in ("jax", "sim"), "backend", cfg.backend, "is not one of ['jax', 'sim']")
  limit = cfg.get("server", {}).get("max_body_bytes", 1)
  _require(isinstance(limit, int) and limit >= 1, "server.max_body_bytes", limit,
           "must be an integer >= 1")
  public = cfg.get("server", {}).get("metrics_public", False)
  _require(isinstance(public, bool), "server.metrics_public", public, "must be true or false")
  keys = cfg.get("server", {}).get("api_keys", "")
  if keys:
    from pdjax.server.protocol import load_api_keys
    try:
      load_api_keys(keys)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  repeats = cfg.get("repeats", 1)
  _require(isinstance(repeats, int) and repeats >= 1, "repeats", repeats,
           "must be an integer >= 1")
  if cfg.backend == "sim":
    from pdjax.sim.hardware import HardwareError, hardware_for
    _require(cfg.sim.cost_model in ("roofline", "calibrated"), "sim.cost_model",
             cfg.sim.cost_model, "is not one of ['calibrated', 'roofline']")
    try:
      hardware_for(cfg.sim.hardware)
    except HardwareError as e:
      raise ConfigError(str(e)) from None
    _require(cfg.sim.link_gbps >= 0, "sim.link_gbps", cfg.sim.link_gbps, "must be >= 0")
  _require(cfg.model.dtype in ("float32", "bfloat16"), "model.dtype", cfg.model.dtype,
           "is not float32 or bfloat16")
  _require(cfg.model.attention_impl in ("auto", "pallas", "xla"), "model.attention_impl",
           cfg.model.attention_impl, "is not one of ['auto', 'pallas', 'xla']")
  layout = cfg.model.get("param_layout", "auto")
  layouts = ["auto", *LAYOUTS]
  _require(layout in layouts, "model.param_layout", layout, f"is not one of {layouts}")
  mcfg = model_config(cfg)
  check_tokenizer(cfg, mcfg)

  for role in ("prefill", "decode", "colocated"):
    tier = cfg.cluster[role]
    _require(tier.instances >= 1, f"cluster.{role}.instances", tier.instances, "must be >= 1")
    _require(tier.instances <= MAX_INSTANCES, f"cluster.{role}.instances", tier.instances,
             f"must be at most {MAX_INSTANCES} (instances per tier)")
    _require(tier.tp >= 1, f"cluster.{role}.tp", tier.tp, "must be >= 1")
    for what, n in (("num_kv_heads", mcfg.num_kv_heads), ("num_heads", mcfg.num_heads),
                    ("intermediate_size", mcfg.intermediate_size)):
      _require(n % tier.tp == 0, f"cluster.{role}.tp", tier.tp,
               f"does not divide the model's {what}={n}")
    _require(layout != "unrolled" or tier.tp == 1, f"cluster.{role}.tp", tier.tp,
             "must be 1 with model.param_layout='unrolled'")
    _check_hosts(cfg, role)
  _check_launcher(cfg)
  error = remesh_error(cfg, mcfg)
  if error:
    raise ConfigError(error)
  p, d = cfg.cluster.prefill.tp, cfg.cluster.decode.tp
  _require(p % d == 0 or d % p == 0, "cluster.decode.tp", d,
           f"and cluster.prefill.tp={p}: one must divide the other to move KV")
  if device_count is not None and cfg.backend == "jax" and launcher(cfg) == "local":
    for mode in sorted({RUNS[m] for m in modes(cfg)}):
      need = sum(n * tp for _, n, tp in tiers(cfg)[mode])
      if need > device_count:
        parts = " + ".join(f"cluster.{tier_key(mode, role)}.instances={n} x tp={tp}"
                           for role, n, tp in tiers(cfg)[mode])
        raise ConfigError(f"{parts} needs {need} devices, only {device_count} available")

  if cfg.backend == "sim" and cfg.sim.cost_model == "calibrated":
    sim_profile(cfg, mcfg)
  latency_profile(cfg, mcfg)
  kv = cfg.kv
  _require(kv.page_size >= 1, "kv.page_size", kv.page_size, "must be >= 1")
  _require(kv.max_model_len >= 2, "kv.max_model_len", kv.max_model_len,
           "must be >= 2 (one prompt and one output token)")
  _require(kv.max_model_len <= mcfg.max_position_embeddings, "kv.max_model_len",
           kv.max_model_len, f"exceeds the model's {mcfg.max_position_embeddings} positions")
  try:
    mcfg.check_max_model_len(kv.max_model_len)   # no sliding-window attention here
  except ValueError as e:
    raise ConfigError(str(e)) from None
  pages_per_seq = -(-kv.max_model_len // kv.page_size)
  _require(kv.pages_per_instance >= pages_per_seq, "kv.pages_per_instance",
           kv.pages_per_instance, f"cannot hold one max_model_len sequence ({pages_per_seq} pages)")
  _require(kv.get("tenant_quota_pages", 0) >= 0, "kv.tenant_quota_pages",
           kv.get("tenant_quota_pages", 0), "must be >= 0 (0: no quota)")
  _require(kv.get("cache_pages", 0) >= 0, "kv.cache_pages", kv.get("cache_pages", 0),
           "must be >= 0 (0: the whole pool)")
  _require(kv.get("ttl_s", 0.0) >= 0, "kv.ttl_s", kv.get("ttl_s", 0.0), "must be >= 0 (0: never)")
  stream = kv.get("stream_layers", 0)
  _require(isinstance(stream, int) and 0 <= stream <= mcfg.num_layers, "kv.stream_layers", stream,
           f"must be an int in [0, {mcfg.num_layers}] (0: off; at most the model's layers)")
  _require(isinstance(kv.get("stream_min_tokens", 0), int) and kv.get("stream_min_tokens", 0) >= 0,
           "kv.stream_min_tokens", kv.get("stream_min_tokens", 0), "must be an int >= 0")
  if stream:
    _require(kv.get("host_tier_handoff", "transfer") == "transfer", "kv.stream_layers", stream,
             "needs kv.host_tier_handoff=transfer (a host-tier hand-off is not streamed)")
  _require(kv.get("eviction", "lru") in EVICTION_POLICIES, "kv.eviction", kv.get("eviction"),
           f"is not one of {', '.join(EVICTION_POLICIES)}")
  flush_schedule(cfg)
  _check_host_tier(cfg)
  _require(kv.get("transfer_failure_policy", "retry_then_recompute") in TRANSFER_FAILURE_POLICIES,
           "kv.transfer_failure_policy", kv.get("transfer_failure_policy"),
           f"is not one of {', '.join(TRANSFER_FAILURE_POLICIES)}")
  _check_hybrid(cfg, mcfg)
  _require(isinstance(kv.get("transfer_retries", 3), int) and kv.get("transfer_retries", 3) >= 0,
           "kv.transfer_retries", kv.get("transfer_retries"), "must be an integer >= 0")
  for key in ("transfer_backoff_s", "transfer_timeout_s", "lease_s"):
    v = kv.get(key, 0.0)
    _require(math.isfinite(v) and v >= 0, f"kv.{key}", v, "must be a finite number >= 0")
  fault_spec(cfg)
  for role in ("prefill", "decode", "colocated"):
    pages = cfg.cluster[role].get("kv_pages", 0)
    _require(pages == 0 or pages >= pages_per_seq, f"cluster.{role}.kv_pages", pages,
             f"cannot hold one max_model_len sequence ({pages_per_seq} pages); 0 means "
             f"kv.pages_per_instance")

  s = cfg.scheduler
  _check_buckets("scheduler.prefill_buckets", s.prefill_buckets)
  _check_buckets("scheduler.decode_buckets", s.decode_buckets)
  _require(s.max_prefill_seqs >= 1, "scheduler.max_prefill_seqs", s.max_prefill_seqs,
           "must be >= 1")

  from pdjax.scheduler.policies import policy_config, registry
  try:   # names, import paths, scorers, policy_args: before anything is built or compiled
    policy_config.check(s)
  except (registry.PolicyError, ValueError) as e:
    raise ConfigError(str(e)) from None
  _require(1 <= s.chunk_budget <= max(s.prefill_buckets), "scheduler.chunk_budget",
           s.chunk_budget, f"must be within [1, {max(s.prefill_buckets)}] (the largest "
           "prefill bucket)")
  overlap = s.get("overlap", "auto")
  _require(overlap in (True, False) or str(overlap).lower() in ("auto", "true", "false"),
           "scheduler.overlap", overlap, "must be true, false or 'auto'")
  _require(s.max_queue >= 1, "scheduler.max_queue", s.max_queue, "must be >= 1")
  h = s.get("admission_headroom", 1.0)
  _require(0 < h <= 1, "scheduler.admission_headroom", h, "must be in (0, 1]")
  _require(s.length_threshold >= 0, "scheduler.length_threshold", s.length_threshold,
           "must be >= 0")
  _require(0 < s.saturation <= 1, "scheduler.saturation", s.saturation, "must be in (0, 1]")
  _require(0 < s.get("isl_ratio", 0.7) <= 1, "scheduler.isl_ratio", s.get("isl_ratio", 0.7),
           "must be in (0, 1]")
  _require(s.get("local_prefill", "whole") in ("whole", "chunked"), "scheduler.local_prefill",
           s.get("local_prefill", "whole"), "is not one of ['whole', 'chunked']")
  _require(s.get("latency_feedback", -1) >= -1, "scheduler.latency_feedback",
           s.get("latency_feedback", -1), "must be >= 0 (requests), or -1 (auto)")

  trace_steps = cfg.get("output", {}).get("trace_steps", "auto")
  _require(trace_steps in ("auto", "full"), "output.trace_steps", trace_steps,
           "is not one of ['auto', 'full']")
  error = validate_workload(cfg.workload)
  if error:
    raise ConfigError(error)
  requests = cfg.workload.get("num_requests", 0)
  _require(requests <= MAX_REQUESTS, "workload.num_requests", requests,
           f"must be at most {MAX_REQUESTS:,} (a run holds its requests in memory)")
  _require(cfg.sampling.temperature >= 0, "sampling.temperature", cfg.sampling.temperature,
           "must be >= 0")
  _require(cfg.slo.ttft_s > 0, "slo.ttft_s", cfg.slo.ttft_s, "must be > 0")
  _require(cfg.slo.tpot_s > 0, "slo.tpot_s", cfg.slo.tpot_s, "must be > 0")
  _require(0 < cfg.slo.attainment <= 1, "slo.attainment", cfg.slo.attainment,
           "must be in (0, 1]")
  for key, auto in (("plan", "one process per core"), ("sim", "as many as keep the cores busy")):
    workers = cfg.get(key, {}).get("workers", 0)
    _require(type(workers) is int and workers >= 0, f"{key}.workers", workers,
             f"must be an integer >= 0 (0: {auto}, 1: in-process)")
  return mcfg


if __name__ == "__main__":   # python -m pdjax.config --markdown > docs/config.md
  import sys
  from pdjax.config_reference import main
  sys.exit(main(sys.argv[1:]))
