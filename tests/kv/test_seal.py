"""Sealed KV pages (pdjax/kv/seal.py): a page opens to its exact bytes; a flipped byte, a
truncated piece, another page's name, an altered shape, dtype or key id, or another run's key
is refused with one line. A sealer moves to a new derived key every SEALS_PER_KEY seals, and
any opener of the run key opens every page it sealed."""

import dataclasses

import numpy as np
import pytest

import ml_dtypes

import pdjax.kv.seal as seal_mod
from pdjax.kv.seal import PageOpener, PageSealer, SealError, new_run_key
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


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "another name", "another key",
                                 "shape", "dtype", "sealer id", "generation"])
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
  elif how == "another key":
    sealer = PageSealer(new_run_key())
  elif how == "shape":              # (the same bytes: it would reshape without complaint)
    sealed = dataclasses.replace(sealed, shape=(3, 2, 2, 16, 8))
  elif how == "dtype":
    sealed = dataclasses.replace(sealed, dtype="<i4")
  elif how == "sealer id":
    sealed = dataclasses.replace(sealed, key_id=(bytes(8), 0))
  else:
    sealed = dataclasses.replace(sealed, key_id=(sealed.key_id[0], 1))
  with pytest.raises(SealError) as e:
    sealer.open(name, sealed)
  assert isinstance(e.value, DeviceError)
  assert str(e.value) == (f"sealed KV page {name.hex()[:12]} did not open (tampered, "
                          "truncated, or not this page's)")


def test_a_bfloat16_page_opens_as_bfloat16():
  page = PAGE.astype(ml_dtypes.bfloat16)
  sealer = PageSealer(new_run_key())
  sealed = sealer.seal(b"page-0", page)
  assert sealed.dtype == "bfloat16"
  opened = sealer.open(b"page-0", sealed)
  assert opened.dtype == page.dtype and np.array_equal(opened, page)


def test_a_sealer_moves_to_a_new_key_every_seals_per_key_and_any_opener_opens_them(
    monkeypatch):
  monkeypatch.setattr(seal_mod, "SEALS_PER_KEY", 3)
  key = new_run_key()
  sealer = PageSealer(key)
  names = [f"page-{i}".encode() for i in range(7)]
  pages = [PAGE + i for i in range(7)]
  sealed = [sealer.seal(n, p) for n, p in zip(names, pages)]
  assert len(sealer.sealer_id) == 8
  assert [s.key_id for s in sealed] == [(sealer.sealer_id, g) for g in (0, 0, 0, 1, 1, 1, 2)]
  opener = PageOpener(key)                      # (another process's: derives each key)
  assert all(np.array_equal(opener.open(n, s), p) for n, s, p in zip(names, sealed, pages))
  assert sorted(g for _, g in opener._aeads) == [0, 1, 2]     # (derived once each)
  assert PageSealer(key).sealer_id != sealer.sealer_id
