"""Sealed KV under the Ray launcher on several nodes (issue 32, `kv.seal_cross_node`,
`cluster.nodes` > 1): AES-GCM pieces (pdjax/kv/seal.py) under keys derived from the run's key,
which the driver made (`seal.new_run_key`) and hands to each call that seals or opens. Each
instance actor keeps one PageSealer for the run key (`sealer_of`), so its seals count towards
key rotation and the keys it derived stay cached.

P -> D between nodes: the source actor gathers the pages to host and seals each
(`export_sealed`), the destination actor receives the pieces as the export call's result (Ray
moves them between the nodes), checks it got one piece per page, opens every one before
writing any (`import_sealed`), then scatters them into its pool. Each page's name is the
transfer's uuid, its index and the page count. A piece that does not open (a flipped byte, a
truncated piece, one replayed from another transfer or place) or a piece too few or too many
fails the transfer with SealError, a DeviceError: the driver retries it, then falls back as
for any failed transfer, and counts it (summary `faults.transfer_errors`). Nothing of it
lands. `faults.tamper_prob` flips one byte of a sealed piece in transit on purpose.

The node KV stores (node_store.py) hold sealed pages only: the writing actor seals each page
under its name before the store's `put` (`store_items`), and every reader, of its own node's
store or another's, opens them (actor.py's `_read_sealed`). The store never has the key. The
device-to-device transfer server is not used for sealed transfers: its bytes never pass
through a place to seal them.
"""

from __future__ import annotations

import dataclasses
import time

from pdjax.kv.seal import PageOpener, PageSealer, SealedPage, SealError


def piece_name(uuid: int, index: int, count: int) -> bytes:
  """A transferred page's name: which transfer, which page of it, of how many."""
  return f"kv-transfer:{uuid}:{index}/{count}".encode()


def sealer_of(actor, key: bytes) -> PageSealer:
  """The actor's sealer for this run key (made on first use; a new key, a new sealer)."""
  sealer = getattr(actor, "_sealer", None)
  if sealer is None or sealer.run_key != key:
    sealer = actor._sealer = PageSealer(key)
  return sealer


def tampered(piece: SealedPage) -> SealedPage:
  """The piece with the first byte of its ciphertext flipped (fault injection: what a
  corrupting link would do)."""
  return dataclasses.replace(piece, ciphertext=bytes([piece.ciphertext[0] ^ 0x01])
                             + piece.ciphertext[1:])


def seal_pages(sealer: PageSealer, names: list[bytes], arrays, tamper: bool = False) -> list:
  """Each array sealed under its name; tamper: the first piece `tampered` after sealing
  (faults.tamper_prob)."""
  pieces = [sealer.seal(n, a) for n, a in zip(names, arrays)]
  if tamper and pieces:
    pieces[0] = tampered(pieces[0])
  return pieces


def open_pages(opener: PageOpener, names: list[bytes], pieces) -> list:
  """Every piece opened (SealError at the first that does not), before any is used."""
  return [opener.open(n, p) for n, p in zip(names, pieces, strict=True)]


def open_each(opener: PageOpener, names: list[bytes],
              pieces) -> tuple[list, list[tuple[bytes, str]]]:
  """Every piece opened: (arrays, []) when all open, else ([], [(name, why)] of each that did
  not)."""
  arrays, bad = [], []
  for n, p in zip(names, pieces, strict=True):
    try:
      arrays.append(opener.open(n, p))
    except SealError as e:
      bad.append((n, str(e)))
  return ([] if bad else arrays), bad


class SealedActorMixin:
  """InstanceActor's side (distributed/actor.py): needs `_host_copies()`, `_check_epoch` and
  `_revoked`."""

  def store_items(self, names: list[bytes], arrays, key: bytes | None) -> dict:
    """name -> what the node store keeps of each page: the page sealed under its name when
    the run has a key (its store then holds no plaintext), else the array itself."""
    if key is None:
      return dict(zip(names, arrays))
    return dict(zip(names, seal_pages(sealer_of(self, key), names, arrays)))

  async def export_sealed(self, uuid: int, pages: list[int], key: bytes,
                          tamper: bool = False) -> list:
    """These pool pages gathered to host and sealed, one piece per page (the result Ray
    moves to the destination's `import_sealed`)."""
    arrays = self._host_copies().gather_to_host(pages)
    names = [piece_name(uuid, i, len(pages)) for i in range(len(pages))]
    return seal_pages(sealer_of(self, key), names, arrays, tamper)

  async def import_sealed(self, uuid: int, pieces: list, pages: list[int], key: bytes,
                          epoch: int = 0, revoked: tuple[int, ...] = ()) -> dict:
    """Opens every piece, then writes them into these pool pages; {"bytes", "seconds"}.
    SealError (nothing written) when there is not one piece per page or one does not open;
    DeviceError when the driver gave up on this epoch (its pages may belong to another
    request)."""
    start = time.perf_counter()
    self._revoked.update(revoked)
    try:
      self._check_epoch(epoch, "a sealed transfer")
      if len(pieces) != len(pages):
        raise SealError(f"sealed KV transfer {uuid} brought {len(pieces)} pieces for "
                        f"{len(pages)} pages")
      names = [piece_name(uuid, i, len(pages)) for i in range(len(pages))]
      arrays = open_pages(sealer_of(self, key), names, pieces)
      self._host_copies().scatter_from_host(list(pages), arrays)
    finally:
      self._revoked.discard(epoch)
    return {"bytes": sum(int(a.nbytes) for a in arrays),
            "seconds": time.perf_counter() - start}
