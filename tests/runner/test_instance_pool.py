"""InstancePool: a command's runs on one placement share its instances (built once, reset per
run); two placements are held at once, a third releases the least recently used; closing the
pool releases everything; nested scopes share the outer pool."""

from pdjax.runner.instance_pool import InstancePool, open_pool, pool_scope


class _Inst:
  def __init__(self, name):
    self.name, self.resets = name, []

  def reset(self, run_seed):
    self.resets.append(run_seed)


def _builder(built, name):
  def build():
    built.append(name)
    return [_Inst(f"{name}-0"), _Inst(f"{name}-1")]
  return build


def test_runs_on_one_placement_build_once_and_reset_with_their_seed():
  built, params = [], object()
  with InstancePool() as pool:
    first = pool.instances(("a",), params, _builder(built, "a"), run_seed=0)
    again = pool.instances(("a",), params, _builder(built, "a"), run_seed=1)
    other = pool.instances(("b",), params, _builder(built, "b"), run_seed=1)
    third = pool.instances(("a",), params, _builder(built, "a"), run_seed=2)
  assert built == ["a", "b"]
  assert first is again is third and other is not first
  assert [i.run_seed for i in first] == [0, 0]   # set on the build: no reset for run one
  assert [i.resets for i in first] == [[1, 2], [1, 2]]
  assert (pool.builds, pool.reuses) == (2, 2)


def test_a_third_placement_releases_the_least_recently_used():
  built, params = [], object()
  with InstancePool(max_placements=2) as pool:
    pool.instances(("a",), params, _builder(built, "a"), run_seed=0)
    pool.instances(("b",), params, _builder(built, "b"), run_seed=0)
    pool.instances(("a",), params, _builder(built, "a"), run_seed=1)   # b is now the older
    pool.instances(("c",), params, _builder(built, "c"), run_seed=0)
    pool.instances(("a",), params, _builder(built, "a"), run_seed=2)
    pool.instances(("b",), params, _builder(built, "b"), run_seed=0)
  assert built == ["a", "b", "c", "b"]


def test_closing_releases_and_nested_scopes_share_the_outer_pool():
  built, params = [], object()
  assert open_pool() is None
  with pool_scope() as outer:
    with pool_scope() as inner:
      assert inner is outer is open_pool()
      inner.instances(("a",), params, _builder(built, "a"), run_seed=0)
    outer.instances(("a",), params, _builder(built, "a"), run_seed=1)
  assert open_pool() is None and built == ["a"]
  with pool_scope() as fresh:
    fresh.instances(("a",), params, _builder(built, "a"), run_seed=0)
  assert built == ["a", "a"]   # a new command builds again
