"""Latency predictions from a run's live state: one copy, shared by `predicted_slo` admission
and the `slo_headroom` path policy. Pure Python.

Everything here reads the workers' measured signals (`InstanceQueue`: EWMAs of the prefill
rate per second of prefill step, of the drain rate per second of wall time while requests
waited, of the decode step time and of the KV transfer time per page landed there) and their
prefix caches; a prediction whose inputs are not measured yet is None.

  TTFT on a worker  = (prompt tokens queued there + this request's uncached tokens) / its
                      prefill rate (the drain rate once a backlog was seen: it counts the decode
                      steps and stalls between prefill steps)
  TPOT on a worker  = its decode step time, or the token interval its finished requests
                      measured when longer (prefill steps between decode steps stretch it)
                      (+, after a remote prefill, the KV transfer spread
                      over the output: pdjax's TTFT is the prefill's token, so the transfer
                      delays the second token)
  transfer          = pages that travel (those the decode worker does not cache) x the
                      decode worker's measured seconds per page

A decode worker that never prefilled has no prefill rate of its own: the prefill tier's
per-step rate, scaled by the TP ratio, stands in for it, plus one decode step per prefill
step (a local prefill's chunks carry the running batch's decode rows).

Where the worker's instance carries a step cost model (a simulated instance's roofline or
calibrated cost: `instance.cost`), the slo_headroom candidates are predicted from it instead:
the steps in flight there finishing (their end is known on the virtual clock; the request
arrives now, at its arrival time), then the prompts waiting there and this one packed FCFS
into steps of the token budget, each step's seconds from the model (bucket padding included:
a lone short prompt costs its bucket, which a tokens-per-second rate misses), the decode step
from the running batch's contexts plus this one, the transfer from the model's link unless
one was measured. Where the instances share one host's cores (the real engine on the CPU:
every instance's programs run on the same cores, one after another), a step also waits for
the steps in flight on the other instances (`host_wait_s`).
"""

from __future__ import annotations

import dataclasses
import math

from pdjax.kv.prefix_cache import prefix_names, salt_for


def uncached_tokens(worker, req, shared_salt: str = "") -> int:
  """The prompt tokens req would still compute on worker: all but the longest prefix its
  prefix cache holds (host-tier pages weighted as in `InstanceQueue.prefix_credit`); at least
  one (the last token is always computed)."""
  tokens = req.prefill_tokens
  if not tokens:
    return 0
  page_size = worker.page_size
  salt = salt_for(req.tenant, shared_salt, req.cache_salt)
  cached = int(worker.prefix_credit(prefix_names(salt, tokens, page_size), salt) * page_size)
  return max(len(tokens) - cached, 1)


def prefill_rate(worker) -> float | None:
  """Prompt tokens per second the worker drains (None until measured)."""
  return worker.prefill_drain_tok_s or worker.prefill_tok_s


def predicted_ttft_s(worker, tokens: int) -> float | None:
  """Seconds until worker has prefilled what is queued there and `tokens` more."""
  rate = prefill_rate(worker)
  return None if not rate else (worker.queued_tokens() + tokens) / rate


def predicted_step_s(tier: list) -> float | None:
  """The least busy measured decode step time of the tier (None until one was measured)."""
  times = [w.decode_step_s for w in tier if w.decode_step_s]
  return min(times) if times else None


def predicted_transfer_s(dst, req, shared_salt: str = "") -> float | None:
  """The KV transfer of req's prompt into dst: the pages dst does not cache, at dst's measured
  seconds per page (None until a transfer landed there)."""
  if not dst.transfer_s_per_page:
    return None
  pages = -(-uncached_tokens(dst, req, shared_salt) // dst.page_size)
  return pages * dst.transfer_s_per_page


@dataclasses.dataclass(frozen=True)
class PathPrediction:
  """One candidate path's prediction for a request (seconds), and its headroom against the
  SLOs: min over TTFT and TPOT of (margin x SLO - predicted) / SLO."""
  ttft_s: float
  tpot_s: float
  cost_s: float        # device seconds it takes from the instances (the cheaper path's test)
  headroom: float
  batch_tpot_s: float | None = None   # local: the running batch's worst TPOT with it (None:
                                      # nothing runs there)
  feedback: dict | None = None   # the online correction in ttft_s and its size class
                                 # (latency_feedback.py; None: off)

  def to_json(self) -> dict:
    out = {"ttft_s": round(self.ttft_s, 6), "tpot_s": round(self.tpot_s, 6),
           "cost_s": round(self.cost_s, 6), "headroom": round(self.headroom, 4)}
    if self.batch_tpot_s is not None:
      out["batch_tpot_s"] = round(self.batch_tpot_s, 6)
    if self.feedback is not None:
      out["feedback"] = {k: round(v, 6) if isinstance(v, float) else v
                         for k, v in self.feedback.items()}
    return out


def headroom(ttft_s: float, tpot_s: float, slo_ttft_s: float, slo_tpot_s: float,
             margin: float = 0.9) -> float:
  return min((margin * slo_ttft_s - ttft_s) / slo_ttft_s,
             (margin * slo_tpot_s - tpot_s) / slo_tpot_s)


def batch_tpot_s(dw, step_s: float, stall_s: float) -> float | None:
  """The worst TPOT among dw's running requests when a local prefill of stall_s device seconds
  runs between their decode steps: a request's TPOT is its decode time over its tokens after
  the first, so the stall adds stall_s / (its tokens - 1) to each token interval. Requests
  holding a slot there (KV on its way) count as running. None when nothing runs there. A
  local path's headroom is judged on this too: a prefill that meets its own SLOs by stalling
  a batch of short answers past theirs is not headroom."""
  batch = [*dw.running, *dw.reserved]
  if not batch:
    return None
  return max(step_s + stall_s / max(r.sampling.max_new_tokens - 1, 1) for r in batch)


def _local(ttft: float, tpot: float, cost_s: float, batch: float | None,
           slo: tuple[float, float]) -> PathPrediction:
  worst = tpot if batch is None else max(tpot, batch)
  return PathPrediction(ttft, tpot, cost_s, headroom(ttft, worst, *slo), batch)


def step_cost(worker):
  """The worker's step cost model (sim/roofline.py, sim/calibrated.py) when its instance has
  one, else None."""
  return worker.cost


def host_wait_s(worker, host: list, now: float) -> float:
  """Seconds from `now` until the steps in flight on the other instances that share worker's
  host cores have ended (each from its own cost model: `InstanceView.step_ends_s`); 0 unless
  worker's instance shares them (`shares_host`: set on the real engine's instances on the
  CPU)."""
  if not worker.shares_host:
    return 0.0
  ends = [end - now for w in host if w is not worker and w.shares_host
          for end in w.step_ends_s()]
  return max(ends + [0.0])


def modelled_prefill_s(cost, worker, tokens: int, token_budget: int, now: float,
                       wait_s: float = 0.0, mixed_rows: int = 0) -> float:
  """Seconds from `now` for worker to finish its steps in flight (`step_ends_s`) and wait
  wait_s (`host_wait_s`), then prefill what waits there and `tokens`, FCFS in steps of at
  most token_budget tokens, each step's time from the cost model. mixed_rows > 0: each step
  also carries up to that many of the worker's running decodes, one token each out of the
  budget, timed by the cost model's decode step (chunked prefill beside decodes: the hybrid
  instances' steps); 0: steps of prompts alone."""
  total = max([e - now for e in worker.step_ends_s()] + [wait_s, 0.0])
  contexts = ([r.prompt_len + len(r.output_ids) for r in worker.running][:mixed_rows]
              if mixed_rows > 0 else [])
  rows = min(len(contexts), token_budget - 1)
  ride_s = cost.decode_s(contexts[:rows]) if rows else 0.0
  per_step = token_budget - rows
  step, used = [], 0
  for n in [r.prefill_len - r.num_computed_tokens for r in worker.waiting] + [tokens]:
    while n > 0:
      take = min(n, per_step - used)
      step.append((take, 0))
      used, n = used + take, n - take
      if used == per_step:
        total += cost.prefill_s(step) + ride_s
        step, used = [], 0
  return total + (cost.prefill_s(step) + ride_s if step else 0.0)


def interval_s(step_s: float, worker) -> float:
  """A token interval on worker: its decode step, or the interval its finished requests
  measured when longer (`InstanceQueue.token_interval_s`: prefill steps between decode
  steps stretch it)."""
  return max(step_s, worker.token_interval_s or 0.0)


def modelled_step_s(cost, dw, req) -> float:
  """dw's token interval with req joining its running batch: the decode step from the cost
  model (`interval_s`)."""
  return interval_s(cost.decode_s([r.prompt_len + len(r.output_ids) for r in dw.running]
                                  + [req.prompt_len]), dw)


def modelled_transfer_s(cost, dst, req, shared_salt: str = "") -> float:
  """The measured transfer (`predicted_transfer_s`) once one landed on dst, else the cost
  model's link for the pages that travel."""
  measured = predicted_transfer_s(dst, req, shared_salt)
  if measured is not None:
    return measured
  pages = -(-uncached_tokens(dst, req, shared_salt) // dst.page_size)
  return cost.transfer_s(dst.kv_bytes(cost.moved_pages(pages)))


def predict_remote(req, pw, dw, slo: tuple[float, float], token_budget: int,
                   shared_salt: str = "", host: list = (),
                   mixed_rows: int = 0) -> PathPrediction | None:
  """Prefill on pw, KV to dw, decode there. None while pw's prefill rate or dw's decode step
  is unmeasured (an unmeasured transfer counts 0 until one lands), unless the instances carry
  a cost model (then `host`: every worker of the run, for `host_wait_s`)."""
  tokens = uncached_tokens(pw, req, shared_salt)
  pcost, dcost = step_cost(pw), step_cost(dw)
  if pcost is not None and dcost is not None:
    ttft = modelled_prefill_s(pcost, pw, tokens, token_budget, req.arrival_s,
                              host_wait_s(pw, host, req.arrival_s), mixed_rows)
    transfer = modelled_transfer_s(dcost, dw, req, shared_salt)
    tpot = modelled_step_s(dcost, dw, req) + transfer / max(req.sampling.max_new_tokens - 1, 1)
    cost = pcost.prefill_s([(tokens, 0)]) + transfer
    return PathPrediction(ttft, tpot, cost, headroom(ttft, tpot, *slo))
  ttft, step = predicted_ttft_s(pw, tokens), dw.decode_step_s
  if ttft is None or step is None:
    return None
  step = interval_s(step, dw)
  transfer = predicted_transfer_s(dw, req, shared_salt) or 0.0
  tpot = step + transfer / max(req.sampling.max_new_tokens - 1, 1)
  cost = tokens / prefill_rate(pw) + transfer
  return PathPrediction(ttft, tpot, cost, headroom(ttft, tpot, *slo))


def predict_local(req, dw, prefill_tier: list, slo: tuple[float, float], token_budget: int,
                  shared_salt: str = "", host: list = (),
                  mixed_rows: int = 0) -> PathPrediction | None:
  """Prefill on the decode worker dw, chunked into its batch, and decode there. Without a
  prefill rate of its own, the prefill tier's per-step rate (scaled by TP) plus a decode step
  per prefill step stands in. None while nothing gives a rate or dw's decode step."""
  tokens, cost = uncached_tokens(dw, req, shared_salt), step_cost(dw)
  if cost is not None:
    ttft = modelled_prefill_s(cost, dw, tokens, token_budget, req.arrival_s,
                              host_wait_s(dw, host, req.arrival_s), mixed_rows)
    tpot = modelled_step_s(cost, dw, req)
    stall = cost.prefill_s([(tokens, 0)])
    return _local(ttft, tpot, stall * (1 + dw.num_running()), batch_tpot_s(dw, tpot, stall),
                  slo)
  if dw.decode_step_s is None:
    return None
  step = interval_s(dw.decode_step_s, dw)
  ttft = predicted_ttft_s(dw, tokens)
  rate = prefill_rate(dw)
  if ttft is None:
    borrowed = [w.prefill_tok_s * dw.tp / w.tp for w in prefill_tier if w.prefill_tok_s]
    if not borrowed:
      return None
    rate = max(borrowed)
    ahead = dw.queued_tokens() + tokens
    ttft = ahead / rate + (math.ceil(ahead / token_budget) * step if dw.running else 0.0)
  stall = tokens / rate
  return _local(ttft, step, stall * (1 + dw.num_running()),   # (it stalls the running batch)
                batch_tpot_s(dw, step, stall), slo)
