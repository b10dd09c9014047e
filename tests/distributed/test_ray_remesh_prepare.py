"""A Ray re-mesh's new actors are prepared like the run's first ones (issue 47, item 11): the
prefix cache, the node's host tier, the latency profile's cost model, the node and its seal
key and cross-node link. Before, `RayRemeshBuilder.build` started them bare: after a switch
the tier had no prefix cache or host tier and slo_headroom's predictions lost their cost
model without a word. A fast test: the actors are stand-ins (no Ray process starts)."""

import dataclasses

from pdjax.distributed import remesh as ray_remesh


@dataclasses.dataclass(frozen=True)
class _Opts:
  num_pages: int


@dataclasses.dataclass(frozen=True)
class _Spec:
  name: str
  role: str
  tp: int
  opts: object


class _FakeRemote:
  """What RayRemeshBuilder needs of a RemoteInstance: spec, opts, start / finish_start."""

  def __init__(self, spec, new_actor, warm_up_args):
    self.spec, self.opts, self.name = spec, spec.opts, spec.name

  def start(self):
    return "ref"

  def finish_start(self, ref):
    assert ref == "ref"


class _FakeCluster:
  def __init__(self):
    self._live, self.released = [], []
    self.node_store = object()

  def _new_actor(self, *_):
    raise AssertionError("not called by the stand-ins")

  def _warm_up_transfers(self, instances, involving):
    self.warmed = [i.name for i in involving]

  def release(self, instances):
    self.released += instances


def test_new_actors_are_prepared_as_the_first_ones(monkeypatch):
  monkeypatch.setattr(ray_remesh, "RemoteInstance", _FakeRemote)
  opts = _Opts(num_pages=64)
  old = []
  for i in range(2):
    inst = _FakeRemote(_Spec(f"decode-{i}", "decode", 1, opts), None, ())
    inst._warm_up_args = ()
    inst.node, inst.seal_key, inst.node_link = 1, b"k" * 32, 12.5e9
    old.append(inst)
  prepared = []
  builder = ray_remesh.RayRemeshBuilder(_FakeCluster(), old, prepare=prepared.append)
  new, phases = builder.build(old, "decode", 1, 2, ["decode-2"])
  assert [i.name for i in new] == ["decode-2"] and new[0].opts.num_pages == 128
  assert prepared == new                      # each new actor went through the run's prepare
  assert (new[0].node, new[0].seal_key, new[0].node_link) == (1, b"k" * 32, 12.5e9)
  assert phases["reshard_s"] == 0.0
