"""Arrivals into the driver: static checks (what can never be served), the path policy, the
router, then admission control and the per-tenant KV quota; accepted requests join their
worker's waiting queue, rejected ones end with a one-line reason. A mixin of `Driver`; pure
Python."""

from __future__ import annotations

from collections import deque

from pdjax.kv.prefix_cache import salt_for
from pdjax.request import Request, Status
from pdjax.scheduler import batching
from pdjax.scheduler.policies import PATHS
from pdjax.scheduler.policies.base import PathChoice

COLOCATED = PathChoice("colocated", "colocated")
PATH_NAMES = {cls: name for name, cls in PATHS.items()}


class Admission:

  def _admit(self, arrivals: deque[Request]) -> None:
    now = self.clock.now()
    o, p = self.opts, self.policies
    if self._holds_arrivals():   # a re-mesh replaces a tier they need: they wait
      return
    while arrivals and arrivals[0].arrival_s <= now:
      req = arrivals.popleft()
      reason = batching.rejection_reason(
          req, max_model_len=o.max_model_len, pool_pages=o.pool_pages, page_size=o.page_size,
          vocab_size=o.vocab_size)
      if not reason:
        choice, worker = self._route(req)
        req.path_reason = choice.reason or self._path_reason(choice)
        reason = ("no instance in the " + choice.tier + " tier" if worker is None else
                  p.admission.check(req, worker, choice, self.tier("decode"))
                  or self._quota_reason(req, choice))
      if reason:
        self._finish(req, Status.REJECTED, now, reason)
        continue
      req.path, req.prefill_instance = choice.path, worker.name
      worker.waiting.append(req)
      self._touch(worker)
      self._plan_cancel(req)

  def _route(self, req: Request) -> tuple[PathChoice, object]:
    """The request's path and its first instance (None: none in that tier). A path policy that
    `uses_picks` decides for the routers' picks of both tiers, and the request goes to the
    chosen tier's pick."""
    p = self.policies
    if self.mode == "colocated":
      return COLOCATED, p.prefill_router.choose(req, self.tier("colocated"))
    if getattr(p.path, "uses_picks", False):   # optional for a user's path policy
      picks = (p.prefill_router.choose(req, self.tier("prefill")),
               p.decode_router.choose(req, self.tier("decode")))
      choice = p.path.choose(req, self.tier("prefill"), self.tier("decode"), picks)
      return choice, picks[1] if choice.tier == "decode" else picks[0]
    choice = p.path.choose(req, self.tier("prefill"), self.tier("decode"))
    router = p.decode_router if choice.tier == "decode" else p.prefill_router
    return choice, router.choose(req, self.tier(choice.tier))

  def _path_reason(self, choice: PathChoice) -> dict:
    """The path_reason of a policy that gives none: its name and the choice (one shared dict
    per choice: a simulated run may hold millions of requests)."""
    if choice.path not in self._path_reasons:
      name = ("mode" if self.mode == "colocated" else
              PATH_NAMES.get(type(self.policies.path.policy),
                            type(self.policies.path.policy).__name__))
      self._path_reasons[choice.path] = {"policy": name, "choice": choice.path}
    return self._path_reasons[choice.path]

  def _salt(self, r: Request) -> str:
    return salt_for(r.tenant, self.opts.shared_salt, r.cache_salt)

  def _quota_reason(self, req: Request, choice: PathChoice) -> str | None:
    """Per-tenant KV quota on each tier the request will use: the pages its admitted requests
    there may grow to (max_len each) plus this one's must stay within tenant_quota_pages."""
    quota = self.opts.tenant_quota_pages
    if not quota:
      return None
    tiers = [choice.tier] + (["decode"] if choice.path == "disaggregated" else [])
    need = -(-req.max_len // self.opts.page_size)
    for tier in tiers:
      mine = [r for w in self.tier(tier) for r in list(w.waiting) + w.running
              if r.tenant == req.tenant]
      if tier == "decode":
        mine += [r for r, _ in self.transfer_queue if r.tenant == req.tenant]
      held = sum(-(-r.max_len // self.opts.page_size) for r in mine)
      if held + need > quota:
        return (f"tenant {req.tenant!r} over its KV quota on the {tier} tier: {held} + {need} "
                f"pages > {quota}")
    return None
