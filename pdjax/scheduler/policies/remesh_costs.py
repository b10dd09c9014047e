"""remesh's decisions from a cost model (policies/remesh.py uses them when the builder knows
each layout's step costs: the simulator's instances, or the engine's with
`scheduler.latency_profile`): predict the tier's work under the current layout and under each
other one, and switch only when another is predicted better by more than what the switch
costs. Pure Python.

  prefill  the queued prompts' drain time, sum of each prompt's prefill_s at the layout's TP
           over its instance count; switch when a layout drains them in under GAIN x the
           current time after paying the switch (`switch_s`: the tier serves nothing while
           it changes).
  decode   the running sequences plus those waiting for a slot (at the contexts they will
           start with when the driver passes them, else at the running mean context) spread
           over the layout's instances; a layout "serves" them when they fit its slots and its
           predicted decode step is under 0.9 x the TPOT SLO. Switch when the current layout
           does not serve them and another does (the fastest step among those); when none
           does, to the layout decoding the most sequences per second within the SLO if that
           pays for the switch over the cooldown (decode_layout).
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
                  backlog, switch_s: float = 0.0, horizon_s: float = 0.0):
  """(count, tp, reason) of a decode layout that serves the tier's sequences when the
  current one does not, or None. backlog: the number of requests waiting for a decode slot
  (each counted at the running sequences' mean context), or their contexts.

  With horizon_s > switch_s, when no layout serves them all: the layout that decodes the most
  sequences per second within the TPOT SLO (the most of them, in queue order, its slots and
  a step under 0.9 x the SLO allow, over that step), when over `horizon_s` (the cooldown:
  the least time it will serve) it is predicted to decode more than the current one even
  after `switch_s` with the tier stopped: rate x (horizon - switch) > current rate x
  horizon."""
  contexts = [r.prompt_len + len(r.output_ids) for w in tier for r in w.running]
  if isinstance(backlog, int):
    if not contexts:
      return None
    mean = sum(contexts) // len(contexts)
    wanted = contexts + [mean] * backlog
  else:
    wanted = contexts + list(backlog)
  if not wanted:
    return None
  max_batch = tier[0].max_batch

  def step_of(seqs: list[int], count: int, tp: int) -> float:
    cost = cost_of("decode", tp)
    return max(cost.decode_s(g) for g in _spread(seqs, count) if g)

  def step(count: int, tp: int) -> float:
    return step_of(wanted, count, tp)

  def serves(count: int, tp: int) -> bool:
    return len(wanted) <= count * max_batch and step(count, tp) <= 0.9 * slo_tpot_s

  def rate(count: int, tp: int) -> tuple[float, int]:
    """(sequences decoded per second within the SLO, how many) at this layout."""
    lo, hi = 0, min(len(wanted), count * max_batch)
    while lo < hi:                       # the step grows with the sequences taken
      mid = (lo + hi + 1) // 2
      if step_of(wanted[:mid], count, tp) <= 0.9 * slo_tpot_s:
        lo = mid
      else:
        hi = mid - 1
    return (lo / step_of(wanted[:lo], count, tp) if lo else 0.0), lo

  current = (len(tier), tier[0].tp)
  layouts = _costed(layouts, "decode", cost_of)
  if current not in layouts or serves(*current):
    return None
  good = [lay for lay in layouts if lay != current and serves(*lay)]
  if good:
    best = min(good, key=lambda lay: step(*lay))
    return (*best, f"{len(wanted)} sequences: predicted step {step(*best) * 1e3:.1f} ms in "
                   f"{best[0]}x{best[1]}, {step(*current) * 1e3:.1f} ms now")
  if horizon_s <= switch_s:
    return None
  now_rate, now_n = rate(*current)
  others = [(rate(*lay), lay) for lay in layouts if lay != current]
  if not others:
    return None
  (best_rate, best_n), best = max(others, key=lambda o: o[0][0])
  if best_rate * (horizon_s - switch_s) <= now_rate * horizon_s:
    return None
  return (*best, f"{len(wanted)} sequences, none serves all: {best_n} within the TPOT SLO in "
                 f"{best[0]}x{best[1]} ({best_rate:.0f} seq/s), {now_n} now "
                 f"({now_rate:.0f} seq/s)")
