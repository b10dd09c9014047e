"""Sealing KV pages (issue 32, `kv.seal_cross_node`): AES-GCM from the `cryptography` package.
Pure Python over numpy buffers (host memory: a page is sealed after its device -> host copy
and opened before its host -> device copy). Used by the Ray launcher on several nodes
(distributed/sealed_kv.py): P -> D transfers between nodes, and every page of the node KV
stores, which hold sealed pages only (node_store.py). Its cost on this machine:
benchmarks/kv_seal.py (BENCHMARKS.md).

Keys: the driver makes one run key (`new_run_key`) and hands it to the processes that seal
and open; nothing is encrypted under it directly. Each `PageSealer` (one per process and run
key) has a random 8-byte sealer id and works under a key derived from the run key and (sealer
id, generation) with HKDF-SHA256, moving to the next generation after SEALS_PER_KEY seals:
random 96-bit nonces stay under NIST's 2^32 encryptions per key however long the run. A
sealed page records its key id (sealer id, generation); any opener derives that key from the
run key (and keeps it), so a page opens for as long as it exists, whoever sealed it.

A sealed page carries its nonce (12 random bytes), the ciphertext with GCM's 16-byte tag, the
array's shape and dtype, and its key id. The associated data binds the page's name, shape and
dtype: a piece replayed under another page's name, a flipped byte, a truncated piece, an
altered shape, dtype or key id all fail to open (`SealError`, a DeviceError: the transfer or
reload that carried it fails and its recovery takes over; nothing it carried lands).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from pdjax.errors import DeviceError

NONCE_BYTES = 12
SEALER_ID_BYTES = 8
SEALS_PER_KEY = 2 ** 31    # seals under one derived key before the sealer moves to the next
                           # (half NIST's 2^32 cap for random 96-bit nonces)


class SealError(DeviceError):
  """A sealed piece did not open: tampered, truncated, under another name, or another key."""


@dataclasses.dataclass(frozen=True)
class SealedPage:
  """One page, sealed: what a node store holds and what crosses between nodes."""
  nonce: bytes
  ciphertext: bytes        # the page's bytes, encrypted, and GCM's 16-byte tag
  shape: tuple[int, ...]
  dtype: str
  key_id: tuple[bytes, int]   # (sealer id, generation): which derived key sealed it

  @property
  def nbytes(self) -> int:
    """Its size as stored (the ciphertext's bytes, tag included)."""
    return len(self.ciphertext)


def new_run_key() -> bytes:
  """A fresh 256-bit key for one run (the driver's; handed to the actors)."""
  from cryptography.hazmat.primitives.ciphers.aead import AESGCM
  return AESGCM.generate_key(bit_length=256)


def dtype_name(dtype: np.dtype) -> str:
  """A dtype as a sealed page records it: numpy's code ("<f4"), or the name of an ml_dtypes
  type (bfloat16's code, "<V2", would read back as raw bytes)."""
  return dtype.name if dtype.kind == "V" else dtype.str


def numpy_dtype(name: str) -> np.dtype:
  try:
    return np.dtype(name)
  except TypeError:
    import ml_dtypes
    return np.dtype(getattr(ml_dtypes, name))


def associated_data(name: bytes, shape: tuple[int, ...], dtype: str) -> bytes:
  """What a page's seal binds besides its bytes: its name (length-prefixed), shape and
  dtype."""
  dims = ",".join(str(int(d)) for d in shape)
  return len(name).to_bytes(4, "big") + name + f"|{dims}|{dtype}".encode()


class PageOpener:
  """Opens pages sealed under one run key, by any sealer: each key id's key is derived once
  and kept."""

  def __init__(self, run_key: bytes):
    self.run_key = run_key
    self._aeads: dict[tuple[bytes, int], object] = {}

  def _aead(self, key_id: tuple[bytes, int]):
    aead = self._aeads.get(key_id)
    if aead is None:
      from cryptography.hazmat.primitives import hashes
      from cryptography.hazmat.primitives.ciphers.aead import AESGCM
      from cryptography.hazmat.primitives.kdf.hkdf import HKDF
      sealer_id, generation = key_id
      info = b"pdjax-kv-seal:" + bytes(sealer_id) + int(generation).to_bytes(8, "big")
      key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(
          self.run_key)
      aead = self._aeads[key_id] = AESGCM(key)
    return aead

  def open(self, name: bytes, sealed: SealedPage) -> np.ndarray:
    from cryptography.exceptions import InvalidTag
    try:
      data = self._aead(tuple(sealed.key_id)).decrypt(
          sealed.nonce, sealed.ciphertext, associated_data(name, sealed.shape, sealed.dtype))
    except (InvalidTag, ValueError, TypeError, OverflowError):   # (a malformed key id too)
      raise SealError(f"sealed KV page {name.hex()[:12]} did not open (tampered, truncated, "
                      f"or not this page's)") from None
    return np.frombuffer(data, dtype=numpy_dtype(sealed.dtype)).reshape(sealed.shape)


class PageSealer(PageOpener):
  """Seals pages (and opens them, as PageOpener): one per process and run key, so that its
  count of seals under each derived key accumulates (see the module's docstring)."""

  def __init__(self, run_key: bytes, sealer_id: bytes | None = None):
    super().__init__(run_key)
    self.sealer_id = sealer_id or os.urandom(SEALER_ID_BYTES)
    self.generation, self.seals = 0, 0    # seals under the current generation's key

  def seal(self, name: bytes, page: np.ndarray) -> SealedPage:
    if self.seals >= SEALS_PER_KEY:
      self.generation, self.seals = self.generation + 1, 0
    self.seals += 1
    key_id = (self.sealer_id, self.generation)
    nonce = os.urandom(NONCE_BYTES)
    data = np.ascontiguousarray(page)
    shape, dtype = tuple(int(d) for d in data.shape), dtype_name(data.dtype)
    return SealedPage(nonce, self._aead(key_id).encrypt(
        nonce, data.tobytes(), associated_data(name, shape, dtype)), shape, dtype, key_id)
