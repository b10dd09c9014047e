"""The config of `scheduler.role_switch=remesh` (scheduler/remesh.py): the TPs and layouts a
re-mesh may switch a tier to, and their one-line errors (called by pdjax.config.validate)."""

from __future__ import annotations

from pdjax.scheduler.policies.remesh import parse_schedule, schedule_error


def remesh_tps(cfg, mcfg) -> tuple[int, ...]:
  """The TPs a re-mesh may give an instance: those dividing the model's heads, KV heads and
  MLP width (and 1 with model.param_layout='unrolled')."""
  if cfg.model.get("param_layout", "auto") == "unrolled":
    return (1,)
  return tuple(tp for tp in (1, 2, 4, 8, 16, 32, 64)
               if not (mcfg.num_kv_heads % tp or mcfg.num_heads % tp
                       or mcfg.intermediate_size % tp))


def remesh_layouts(cfg, mcfg) -> dict[str, list[tuple[int, int]]]:
  """{role: [(instances, tp)]}: the layouts a run with role_switch=remesh may switch each tier
  to (the schedule's; without one, every allowed TP dividing the tier's devices)."""
  c = cfg.cluster
  devices = {role: c[role].instances * c[role].tp for role in ("prefill", "decode")}
  text = cfg.scheduler.get("remesh_schedule", "")
  if text:
    out: dict[str, list[tuple[int, int]]] = {"prefill": [], "decode": []}
    for _, role, count, tp in parse_schedule(text):
      if (count, tp) not in out[role]:
        out[role].append((count, tp))
    return out
  return {role: [(n // tp, tp) for tp in remesh_tps(cfg, mcfg) if n % tp == 0]
          for role, n in devices.items()}


def remesh_error(cfg, mcfg) -> str | None:
  """A one-line reason the re-mesh keys are wrong (or do not fit the tiers), else None."""
  for ok, key, value, why in _checks(cfg, mcfg):
    if not ok:
      return why if key is None else f"{key}={value!r} {why}"
  return None


def _checks(cfg, mcfg):
  """(ok, key, value, why), lazily: a failing check stops the ones after it."""
  s = cfg.scheduler
  drain = s.get("remesh_drain", "migrate")
  yield (drain in ("migrate", "finish"), "scheduler.remesh_drain", drain,
         "is not one of ['migrate', 'finish']")
  text = s.get("remesh_schedule", "")
  yield (not text or s.role_switch == "remesh", "scheduler.remesh_schedule", text,
         "needs scheduler.role_switch='remesh'")
  yield (s.get("remesh_cooldown_s", 5.0) >= 0, "scheduler.remesh_cooldown_s",
         s.get("remesh_cooldown_s"), "must be >= 0")
  yield (cfg.sim.get("remesh_compile_s", 1.0) >= 0, "sim.remesh_compile_s",
         cfg.sim.get("remesh_compile_s"), "must be >= 0")
  if s.role_switch != "remesh":
    return
  yield (not cfg.kv.get("stream_layers", 0), "scheduler.role_switch", "remesh",
         "does not combine with kv.stream_layers yet")
  c = cfg.cluster
  devices = {role: c[role].instances * c[role].tp for role in ("prefill", "decode")}
  error = schedule_error(text, devices, remesh_tps(cfg, mcfg)) if text else None
  yield error is None, None, None, error
  layouts = remesh_layouts(cfg, mcfg)
  for p in {c.prefill.tp} | {tp for _, tp in layouts["prefill"]}:
    for d in {c.decode.tp} | {tp for _, tp in layouts["decode"]}:
      yield (p % d == 0 or d % p == 0, "scheduler.remesh_schedule", text,
             f"gives prefill TP{p} and decode TP{d}: one must divide the other to move KV")
