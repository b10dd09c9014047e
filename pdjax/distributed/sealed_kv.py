"""KV that leaves a node, sealed (issue 32, `kv.seal_cross_node`, Ray launcher with
`cluster.nodes` > 1): a P -> D transfer between two nodes and a reload from another node's
store go through host memory as AES-GCM pieces (pdjax/kv/seal.py) under the run's key, which
the driver made (`seal.new_run_key`) and hands to each call.

P -> D: the source actor gathers the pages to host and seals each (`export_sealed`), the
destination actor receives the pieces as the export call's result (Ray moves them between the
nodes), opens every one before writing any (`import_sealed`), then scatters them into its
pool. A piece that does not open (a flipped byte, a truncated piece, one replayed from another
transfer: each page's name is the transfer's uuid and its index) fails the transfer with
SealError, a DeviceError: the driver retries it, then falls back as for any failed transfer,
and counts it (summary `faults.transfer_errors`). Nothing of it lands. `faults.tamper_prob`
flips one byte of a sealed piece in transit on purpose (the test of that path).

Store reloads from another node: the store seals the pages it hands out (`NodeStore.
get_sealed`) and the reading actor opens them (`open_pages`). The device-to-device transfer
server is not used for sealed transfers: its bytes never pass through a place to seal them.
"""

from __future__ import annotations

import dataclasses
import time

from pdjax.kv.seal import PageSealer


def piece_name(uuid: int, index: int) -> bytes:
  """A transferred page's associated data: which transfer, which page of it."""
  return f"kv-transfer:{uuid}:{index}".encode()


def seal_pages(key: bytes, names: list[bytes], arrays, tamper: bool = False) -> list:
  """Each array sealed under its name; tamper: one byte of the first piece flipped after
  sealing (faults.tamper_prob: what a corrupting link would do)."""
  sealer = PageSealer(key)
  pieces = [sealer.seal(n, a) for n, a in zip(names, arrays)]
  if tamper and pieces:
    first = pieces[0]
    flipped = bytes([first.ciphertext[0] ^ 0x01]) + first.ciphertext[1:]
    pieces[0] = dataclasses.replace(first, ciphertext=flipped)
  return pieces


def open_pages(key: bytes, names: list[bytes], pieces) -> list:
  """Every piece opened (SealError at the first that does not), before any is used."""
  sealer = PageSealer(key)
  return [sealer.open(n, p) for n, p in zip(names, pieces)]


def open_each(key: bytes, names: list[bytes], pieces) -> tuple[list, list[tuple[bytes, str]]]:
  """Every piece opened: (arrays, []) when all open, else ([], [(name, why)] of each that did
  not)."""
  from pdjax.kv.seal import SealError
  sealer, arrays, bad = PageSealer(key), [], []
  for n, p in zip(names, pieces):
    try:
      arrays.append(sealer.open(n, p))
    except SealError as e:
      bad.append((n, str(e)))
  return ([] if bad else arrays), bad


class SealedActorMixin:
  """InstanceActor's side (distributed/actor.py): needs `_host_copies()` and `_check_epoch`."""

  async def export_sealed(self, uuid: int, pages: list[int], key: bytes,
                          tamper: bool = False) -> list:
    """These pool pages gathered to host and sealed, one piece per page (the result Ray
    moves to the destination's `import_sealed`)."""
    arrays = self._host_copies().gather_to_host(pages)
    return seal_pages(key, [piece_name(uuid, i) for i in range(len(pages))], arrays, tamper)

  async def import_sealed(self, uuid: int, pieces: list, pages: list[int], key: bytes,
                          epoch: int = 0, revoked: tuple[int, ...] = ()) -> dict:
    """Opens every piece, then writes them into these pool pages; {"bytes", "seconds"}.
    SealError (nothing written) when one does not open; DeviceError when the driver gave up
    on this epoch (its pages may belong to another request)."""
    start = time.perf_counter()
    self._revoked.update(revoked)
    try:
      self._check_epoch(epoch, "a sealed transfer")
      arrays = open_pages(key, [piece_name(uuid, i) for i in range(len(pieces))], pieces)
      self._host_copies().scatter_from_host(list(pages), arrays)
    finally:
      self._revoked.discard(epoch)
    return {"bytes": sum(int(a.nbytes) for a in arrays),
            "seconds": time.perf_counter() - start}
