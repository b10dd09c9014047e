"""Sealing KV pages that leave a node (issue 32, `kv.seal_cross_node`): AES-GCM from the
`cryptography` package, with a per-run key that the driver holds and hands to the processes
that seal and open. Pure Python over numpy buffers (host memory: a page is sealed after its
device -> host copy and opened before its host -> device copy).

A sealed page carries its nonce (12 random bytes, never reused under a key), the ciphertext
with GCM's 16-byte tag, and the array's shape and dtype; the page's name is the associated
data, so a piece replayed under another page's name fails to open as surely as a flipped
byte or a truncated piece does (`SealError`, a DeviceError: the transfer or reload that
carried it fails and its recovery takes over; nothing it carried lands).

Not wired into a transport yet: the cross-node stage (a store read from another node, P -> D
between nodes) is the next part of issue 32. Its cost on this machine:
benchmarks/kv_seal.py (BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from pdjax.errors import DeviceError

NONCE_BYTES = 12


class SealError(DeviceError):
  """A sealed piece did not open: tampered, truncated, under another name, or another key."""


@dataclasses.dataclass(frozen=True)
class SealedPage:
  nonce: bytes
  ciphertext: bytes        # the page's bytes, encrypted, and GCM's 16-byte tag
  shape: tuple[int, ...]
  dtype: str


def new_run_key() -> bytes:
  """A fresh 256-bit key for one run (the driver's; handed to the actors)."""
  from cryptography.hazmat.primitives.ciphers.aead import AESGCM
  return AESGCM.generate_key(bit_length=256)


class PageSealer:

  def __init__(self, key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    self._aead = AESGCM(key)

  def seal(self, name: bytes, page: np.ndarray) -> SealedPage:
    nonce = os.urandom(NONCE_BYTES)
    data = np.ascontiguousarray(page)
    return SealedPage(nonce, self._aead.encrypt(nonce, data.tobytes(), name), data.shape,
                      data.dtype.str)

  def open(self, name: bytes, sealed: SealedPage) -> np.ndarray:
    from cryptography.exceptions import InvalidTag
    try:
      data = self._aead.decrypt(sealed.nonce, sealed.ciphertext, name)
    except InvalidTag:
      raise SealError(f"sealed KV page {name.hex()[:12]} did not open (tampered, truncated, "
                      f"or not this page's)") from None
    return np.frombuffer(data, dtype=np.dtype(sealed.dtype)).reshape(sealed.shape)
