"""session_sticky: requests of one session go to the instance that served the session before,
while it is eligible (has room); otherwise, and for requests without a session, least_loaded
(its ties rotating, seeded)."""

from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.least_loaded import LeastLoaded


class SessionSticky(Router):

  def __init__(self, seed: int = 0, **_):
    self._home: dict[str, str] = {}
    self._fallback = LeastLoaded(seed=seed)

  def choose(self, req, candidates):
    if not candidates:
      return None
    home = self._home.get(req.session) if req.session else None
    pick = next((w for w in candidates if w.name == home), None)
    pick = pick or self._fallback.choose(req, candidates)
    if req.session:
      self._home[req.session] = pick.name
    return pick
