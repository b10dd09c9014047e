"""none: accept everything that can ever fit (the driver still rejects impossible requests)."""

from pdjax.scheduler.policies.base import AdmissionPolicy


class NoAdmission(AdmissionPolicy):

  def __init__(self, **_):
    pass
