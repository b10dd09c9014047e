"""The page DMA shared by the TPU kernels: copy one compute block's pages HBM -> VMEM slot."""

from __future__ import annotations

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def block_dma(k_hbm, v_hbm, k_buf, v_buf, sems, page_indices_ref, *,
               seq_base, head, block, slot, num_pages, pages_per_block,
               wait):
  """Starts (or waits for) the DMAs of one compute block's pages into `slot`.

  Only pages below `num_pages` (the pages the sequence uses) are copied; the
  same predicate guards the waits, so every wait pairs with one started copy.
  """
  page_size = k_hbm.shape[2]
  for j in range(pages_per_block):
    pos = block * pages_per_block + j

    @pl.when(pos < num_pages)
    def _():
      page = page_indices_ref[seq_base + pos]
      rows = pl.ds(j * page_size, page_size)
      for kv, (hbm, buf) in enumerate(((k_hbm, k_buf), (v_hbm, v_buf))):
        copy = pltpu.make_async_copy(
            hbm.at[head, page], buf.at[slot, rows], sems.at[kv, slot])
        if wait:
          copy.wait()
        else:
          copy.start()
