"""What a run was: backend, model, placement, workload, SLOs and seed, as summary.json's
`run_info` (a contract key) and as the lines every output opens with (pure Python, no jax).

Every number pdjax prints is read next to these: the same table from a tiny model on 8
virtual CPU devices and from Llama-3-8B simulated on H100s must not look alike.

  backend   {"name": "jax", "platform", "device_kind", "devices"}  (the real engine), or
            {"name": "sim", "cost_model", "hardware"[, "profile"]}  (the simulator)
  model     {"name": preset or checkpoint folder name, "source": preset | checkpoint,
             "params": parameter count, "dtype"}
  placement {"run", "tiers": [{"role", "instances", "tp"}], "chips", "describe"[,
             "launcher": "ray"][, "nodes", "sealed" (cluster.nodes > 1)]}
  workload  {"kind", "preset" (synthetic) or "path" (trace), "arrival", "rate", "requests"}
  slo       {"ttft_s", "tpot_s", "attainment"}
  seed      the run's seed (workload and sampling)
"""

from __future__ import annotations

import os

REAL_MODELS_NOTE = ("the `tiny` preset is a 2-layer toy: simulated numbers for it describe "
                    "no real model (use a published shape, e.g. model.preset=llama3_8b)")


def param_count(mcfg) -> int:
  """Parameters of a Llama-family model (embeddings, attention, MLP, norms, LM head)."""
  c = mcfg
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  attn = c.hidden_size * (q + 2 * kv) + q * c.hidden_size
  if getattr(c, "qkv_bias", False):
    attn += q + 2 * kv
  if getattr(c, "o_proj_bias", False):
    attn += c.hidden_size
  layer = attn + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
  embed = c.vocab_size * c.hidden_size
  head = 0 if c.tie_word_embeddings else embed
  return c.num_layers * layer + embed + head + c.hidden_size


def describe_params(n: int) -> str:
  """1234 -> '1.2K', 8030261248 -> '8.03B'."""
  for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
    if n >= div:
      return f"{n / div:.3g}{unit}"
  return str(n)


def describe_tiers(run: str, tiers) -> str:
  """'4xTP2' (colocated, chunked), '2xP(tp2) + 2xD(tp2)' (disaggregated) or
  '2xPH(tp2) + 2xDH(tp2)' (hybrid: P-heavy and D-heavy instances)."""
  heavy = "H" if run == "hybrid" else ""
  return " + ".join(f"{n}x{role[0].upper()}{heavy}(tp{tp})" if run in ("disaggregated", "hybrid")
                    else f"{n}xTP{tp}" for role, n, tp in tiers)


def placement_info(run: str, tiers, *, launcher: str = "local", nodes: int = 1,
                   sealed: bool = False, hosts: dict | None = None) -> dict:
  """launcher, nodes, sealed (cluster.launcher, cluster.nodes, kv.seal_cross_node) and hosts
  ({role: hosts}, cluster.<tier>.hosts): recorded and described only when not the
  one-process, one-node, one-host default."""
  tiers = [(str(role), int(n), int(tp)) for role, n, tp in tiers]
  describe = describe_tiers(run, tiers)
  extra = {}
  spans = {r: int(h) for r, h in (hosts or {}).items()
           if h > 1 and any(r == role for role, _, _ in tiers)}
  if spans:
    extra["hosts"] = spans
    describe += ", " + ", ".join(f"each {r} instance over {h} hosts" for r, h in spans.items())
  if launcher != "local":
    extra["launcher"] = launcher
    describe += ", one Ray actor per instance" + (" and host" if spans else "")
  if nodes > 1:
    extra.update(nodes=int(nodes), sealed=bool(sealed))
    describe += f", on {nodes} nodes" + (" (KV leaving a node sealed)" if sealed else "")
  return {"run": run, "tiers": [{"role": r, "instances": n, "tp": tp} for r, n, tp in tiers],
          "chips": sum(n * tp for _, n, tp in tiers), "describe": describe, **extra}


def backend_info(cfg, devices: dict | None = None) -> dict:
  """devices (the real engine): {"platform", "device_kind", "devices"} read from jax by the
  caller (this module imports no jax)."""
  if cfg.backend == "sim":
    info = {"name": "sim", "cost_model": cfg.sim.cost_model, "hardware": cfg.sim.hardware}
    if cfg.sim.cost_model == "calibrated":
      info["profile"] = os.path.basename(cfg.sim.profile) if cfg.sim.profile else "shipped CPU"
    return info
  return {"name": "jax", **(devices or {})}


def model_info(cfg, mcfg) -> dict:
  checkpoint = cfg.model.checkpoint
  name = os.path.basename(os.path.normpath(checkpoint)) if checkpoint else cfg.model.preset
  return {"name": name, "source": "checkpoint" if checkpoint else "preset",
          "params": param_count(mcfg), "dtype": cfg.model.dtype}


def workload_info(cfg, requests: int | None = None) -> dict:
  w = cfg.workload
  info = {"kind": w.kind}
  if w.kind == "synthetic":
    info.update(preset=w.preset, arrival=w.arrival, rate=float(w.rate))
  else:
    info.update(path=os.path.basename(w.path), time_scale=float(w.get("time_scale", 1.0)))
  info["requests"] = int(w.num_requests) if requests is None else int(requests)
  return info


def run_info(cfg, mcfg, run: str, tiers, *, devices: dict | None = None,
             requests: int | None = None, workload: dict | None = None) -> dict:
  """summary.json's run_info for one run (run: colocated | chunked | disaggregated; tiers:
  its (role, instances, tp) list; requests: how many the workload loaded; workload: instead
  of the config's, e.g. {"kind": "http", "requests": n} for what a server was sent)."""
  return {"backend": backend_info(cfg, devices), "model": model_info(cfg, mcfg),
          "placement": placement_info(run, tiers, launcher=cfg.cluster.get("launcher", "local"),
                                      nodes=cfg.cluster.get("nodes", 1),
                                      sealed=cfg.kv.get("seal_cross_node", False),
                                      hosts={r: cfg.cluster[r].get("hosts", 1)
                                             for r, _, _ in tiers}),
          "workload": workload or workload_info(cfg, requests),
          "slo": {"ttft_s": float(cfg.slo.ttft_s), "tpot_s": float(cfg.slo.tpot_s),
                  "attainment": float(cfg.slo.attainment)},
          "seed": int(cfg.seed)}


def describe_backend(b: dict) -> str:
  if b["name"] == "sim":
    extra = f", profile {b['profile']}" if "profile" in b else ""
    return f"sim ({b['cost_model']} cost model, {b['hardware']}{extra})"
  if "platform" in b:
    return f"jax on {b['devices']} {b['platform']} devices ({b['device_kind']})"
  return "jax"


def describe_model(m: dict) -> str:
  return f"{m['name']} ({m['source']}, {describe_params(m['params'])} params, {m['dtype']})"


def describe_workload(w: dict) -> str:
  if w["kind"] == "http":
    return f"requests sent over HTTP, {w['requests']} served"
  if w["kind"] == "synthetic":
    return (f"synthetic {w['preset']}, {w['requests']} requests, {w['arrival']} "
            f"at {w['rate']:g} req/s")
  return f"{w['kind']} trace {w['path']}, {w['requests']} requests, time x{w['time_scale']:g}"


def describe_slo(s: dict) -> str:
  return (f"TTFT <= {s['ttft_s'] * 1e3:g} ms, TPOT <= {s['tpot_s'] * 1e3:g} ms, "
          f"target {s['attainment'] * 100:g}% attainment")


def header_lines(infos: list[dict]) -> list[str]:
  """What ran, for the top of a table or report: the parts every run shares, one per line
  (a part that differs between runs lists each run's value)."""
  parts = (("backend", describe_backend), ("model", describe_model),
           ("workload", describe_workload), ("SLO", describe_slo))
  keys = {"backend": "backend", "model": "model", "workload": "workload", "SLO": "slo"}
  lines = []
  for label, describe in parts:
    values = list(dict.fromkeys(describe(i[keys[label]]) for i in infos))
    lines.append(f"{label}: {' | '.join(values)}")
  seeds = [i["seed"] if isinstance(i["seed"], list) else [i["seed"]] for i in infos]
  seeds = list(dict.fromkeys(", ".join(map(str, s)) for s in seeds))
  lines.append(f"seed: {' | '.join(seeds)}")
  return lines


def tiny_sim_warning(info: dict) -> str | None:
  """The one-line warning for a simulated run of the toy preset (None otherwise)."""
  if info["backend"]["name"] == "sim" and info["model"]["source"] == "preset" \
      and info["model"]["name"] == "tiny":
    return f"warning: {REAL_MODELS_NOTE}"
  return None
