"""Sealed P -> D transfers between nodes (pdjax/distributed/sealed_kv.py), actor side, no Ray:
`export_sealed` and `import_sealed` of SealedActorMixin over a fake pool (`Pool`: pages are
host arrays; a scatter of fewer arrays than pages fails as the real scatter's shapes do, with
a ValueError, which is not a DeviceError and so would stop the run)."""

import asyncio
import dataclasses

import numpy as np
import pytest

from pdjax.distributed.sealed_kv import SealedActorMixin, piece_name
from pdjax.errors import DeviceError
from pdjax.kv.seal import SealError, new_run_key

PAGES = [np.full((2, 3), i, np.float32) for i in range(4)]


class Pool(SealedActorMixin):
  """An actor's pool of host arrays (`_host_copies`), its epochs never revoked."""

  def __init__(self):
    self.pages: dict[int, np.ndarray] = {}
    self._revoked: set[int] = set()

  def _host_copies(self):
    return self

  def _check_epoch(self, epoch, address, error=DeviceError):
    pass

  def gather_to_host(self, pages):
    return [PAGES[p] for p in pages]

  def scatter_from_host(self, pages, arrays):
    if len(arrays) != len(pages):
      raise ValueError(f"cannot scatter {len(arrays)} arrays into {len(pages)} pages")
    self.pages.update(zip(pages, arrays))


def _moved(pieces_of=lambda pieces: pieces, key=None):
  """Pages 0-3 of one Pool exported sealed, their pieces changed by pieces_of, imported into
  pages 10-13 of another: (the import's result, the destination's pages)."""
  key = key or new_run_key()
  src, dst = Pool(), Pool()
  pieces = asyncio.run(src.export_sealed(7, [0, 1, 2, 3], key))
  out = asyncio.run(dst.import_sealed(7, pieces_of(pieces), [10, 11, 12, 13], key))
  return out, dst.pages


def test_pieces_open_into_the_destination_pages():
  out, pages = _moved()
  assert out["bytes"] == 4 * 24
  assert sorted(pages) == [10, 11, 12, 13]
  assert all(np.array_equal(pages[10 + i], PAGES[i]) for i in range(4))


def test_a_piece_is_bound_to_its_transfer_its_place_and_their_count():
  assert piece_name(7, 2, 4) == b"kv-transfer:7:2/4"


@pytest.mark.parametrize("pieces_of, count", [(lambda p: p[:-1], 3),
                                              (lambda p: p + p[:1], 5)])
def test_a_dropped_or_added_piece_fails_the_transfer_and_writes_nothing(pieces_of, count):
  """Each piece opens (its name is its own), but the pages would not all be written (zip
  drops the last page's) or one piece has no page: SealError, a DeviceError the driver
  retries, not the scatter's ValueError."""
  with pytest.raises(SealError) as e:
    _moved(pieces_of)
  assert str(e.value) == f"sealed KV transfer 7 brought {count} pieces for 4 pages"


def test_pieces_swapped_between_places_do_not_open():
  with pytest.raises(SealError, match=r"^sealed KV page [0-9a-f]{12} did not open"):
    _moved(lambda p: [p[1], p[0]] + p[2:])


def test_a_piece_whose_shape_was_altered_does_not_open():
  def reshaped(pieces):
    return [dataclasses.replace(pieces[0], shape=(3, 2))] + pieces[1:]
  with pytest.raises(SealError, match=r"^sealed KV page [0-9a-f]{12} did not open"):
    _moved(reshaped)
