"""none: tiers keep the roles the config gave them."""

from pdjax.scheduler.policies.base import RoleSwitchPolicy


class NoRoleSwitch(RoleSwitchPolicy):

  def __init__(self, **_):
    pass
