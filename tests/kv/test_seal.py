"""Sealed KV pages (pdjax/kv/seal.py): a page opens to its exact bytes; a flipped byte, a
truncated piece, another page's name or another run's key is refused with one line."""

import dataclasses

import numpy as np
import pytest

from pdjax.kv.seal import PageSealer, SealError, new_run_key
from pdjax.errors import DeviceError

PAGE = np.arange(2 * 3 * 2 * 16 * 8, dtype=np.float32).reshape(2, 3, 2, 16, 8)


def test_a_sealed_page_opens_to_its_exact_bytes_and_hides_them():
  sealer = PageSealer(new_run_key())
  sealed = sealer.seal(b"page-0", PAGE)
  assert PAGE.tobytes() not in sealed.ciphertext
  assert len(sealed.ciphertext) == PAGE.nbytes + 16 and len(sealed.nonce) == 12
  opened = sealer.open(b"page-0", sealed)
  assert opened.dtype == PAGE.dtype and np.array_equal(opened, PAGE)
  assert sealer.seal(b"page-0", PAGE).nonce != sealed.nonce      # never the same nonce


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "another name", "another key"])
def test_a_tampered_piece_is_refused(how):
  key = new_run_key()
  sealer, sealed, name = PageSealer(key), None, b"page-0"
  sealed = sealer.seal(name, PAGE)
  if how == "flipped byte":
    c = bytearray(sealed.ciphertext)
    c[100] ^= 0x01
    sealed = dataclasses.replace(sealed, ciphertext=bytes(c))
  elif how == "truncated":
    sealed = dataclasses.replace(sealed, ciphertext=sealed.ciphertext[:-1])
  elif how == "another name":
    name = b"page-1"
  else:
    sealer = PageSealer(new_run_key())
  with pytest.raises(SealError) as e:
    sealer.open(name, sealed)
  assert isinstance(e.value, DeviceError)
  assert str(e.value) == (f"sealed KV page {name.hex()[:12]} did not open (tampered, "
                          "truncated, or not this page's)")
