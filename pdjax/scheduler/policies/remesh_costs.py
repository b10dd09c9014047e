"""remesh's decisions from a cost model (policies/remesh.py uses them when the builder knows
each layout's step costs: the simulator's instances, or the engine's with
`scheduler.latency_profile`): predict the tier's work under the current layout and under each
other one, and switch only when another is predicted better by more than what the switch
costs. Pure Python.

  prefill  the queued prompts' drain time, sum of each prompt's prefill_s at the layout's TP
           over its instance count; switch when a layout drains them in under GAIN x the
           current time after paying the switch (`switch_s`: the tier serves nothing while
           it changes).
  decode   the running sequences plus those waiting for a slot (at the running mean
           context) spread over the layout's instances; a layout "serves" them when they fit
           its slots and its predicted decode step is under 0.9 x the TPOT SLO. Switch when the
           current layout does not serve them and another does (the fastest step among those).
"""

from __future__ import annotations

GAIN = 0.8   # another prefill layout must drain the queue in under this x the current time


def _spread(contexts: list[int], count: int) -> list[list[int]]:
  groups: list[list[int]] = [[] for _ in range(count)]
  for i, c in enumerate(sorted(contexts, reverse=True)):
    groups[i % count].append(c)
  return groups


def _costed(layouts, role: str, cost_of) -> list[tuple[int, int]]:
  """The layouts whose TP has a cost model (a calibration profile may lack some TPs)."""
  return [lay for lay in layouts if cost_of(role, lay[1]) is not None]


def prefill_layout(tier: list, layouts: list[tuple[int, int]], cost_of, switch_s: float):
  """(count, tp, reason) of a better prefill layout, or None."""
  prompts = [r.prefill_len - r.num_computed_tokens for w in tier for r in w.waiting]
  if not prompts:
    return None

  def drain(count: int, tp: int) -> float:
    cost = cost_of("prefill", tp)
    return sum(cost.prefill_s([(n, 0)]) for n in prompts) / count

  current = (len(tier), tier[0].tp)
  layouts = _costed(layouts, "prefill", cost_of)
  if current not in layouts:
    return None
  now_s = drain(*current)
  best = min((lay for lay in layouts if lay != current), key=lambda lay: drain(*lay),
             default=None)
  if best is None:
    return None
  then_s = drain(*best) + switch_s
  if then_s >= GAIN * now_s:
    return None
  return (*best, f"{len(prompts)} queued prompts drain in {then_s:.2f} s (switch included) "
                 f"instead of {now_s:.2f} s")


def decode_layout(tier: list, layouts: list[tuple[int, int]], cost_of, slo_tpot_s: float,
                  backlog: int):
  """(count, tp, reason) of a decode layout that serves the tier's sequences when the
  current one does not, or None."""
  contexts = [r.prompt_len + len(r.output_ids) for w in tier for r in w.running]
  if not contexts:
    return None
  mean = sum(contexts) // len(contexts)
  wanted = contexts + [mean] * backlog
  max_batch = tier[0].max_batch

  def step(count: int, tp: int) -> float:
    cost = cost_of("decode", tp)
    return max(cost.decode_s(g) for g in _spread(wanted, count) if g)

  def serves(count: int, tp: int) -> bool:
    return len(wanted) <= count * max_batch and step(count, tp) <= 0.9 * slo_tpot_s

  current = (len(tier), tier[0].tp)
  layouts = _costed(layouts, "decode", cost_of)
  if current not in layouts or serves(*current):
    return None
  good = [lay for lay in layouts if lay != current and serves(*lay)]
  if not good:
    return None
  best = min(good, key=lambda lay: step(*lay))
  return (*best, f"{len(wanted)} sequences: predicted step {step(*best) * 1e3:.1f} ms in "
                 f"{best[0]}x{best[1]}, {step(*current) * 1e3:.1f} ms now")
