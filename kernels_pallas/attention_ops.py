"""The model's attention calls, bound to one implementation: XLA (jnp) or the Pallas kernels.

Lives beside the kernels so models pick an implementation without importing the engine; the
engine only decides which (`pdjax.engine.attention.resolve_impl`) and hands over its mesh.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import Mesh, PartitionSpec as P

from kernels_pallas import xla_attention
from kernels_pallas.paged_attention.api import paged_attention
from kernels_pallas.prefill_attention.api import ragged_paged_attention


@dataclasses.dataclass(frozen=True)
class AttentionOps:
  """Decode and ragged paged attention, bound to an implementation and a mesh.

  "xla" runs kernels_pallas.xla_attention (GSPMD partitions it). "pallas" runs the kernels
  per TP shard under shard_map (a pallas_call is not auto-partitioned): each device attends
  its own query heads over its own kv heads, which is exactly the TP layout of the pools.
  """

  impl: str = "xla"                 # "xla" | "pallas"
  mesh: Mesh | None = None          # the instance mesh, axis "tp"; None = unsharded
  interpret: bool = False           # Pallas interpret mode (CPU)
  variant: str | None = None        # "tpu" | "gpu": force a kernel flavour (ahead-of-time
                                    # lowering for a target this host is not); None: by platform

  def _sharded(self, fn, args, specs, out_spec):
    if self.mesh is None:
      return fn(*args)
    return jax.shard_map(fn, mesh=self.mesh, in_specs=specs, out_specs=out_spec,
                         check_vma=False)(*args)

  def decode(self, q, k_pages, v_pages, lengths, page_indices, layer=None):
    """k_pages, v_pages: one layer's [KVH, P, ps, D], or the whole pools [L, ...] and the
    `layer` to read (the XLA path reads it in place; the Pallas kernels take that layer)."""
    if self.impl == "xla":
      return xla_attention.paged_attention_xla(q, k_pages, v_pages, lengths, page_indices,
                                               layer=layer)
    if layer is not None:
      k_pages, v_pages = k_pages[layer], v_pages[layer]
    fn = functools.partial(paged_attention, interpret=self.interpret, variant=self.variant)
    heads, pages = P(None, "tp", None), P("tp", None, None, None)
    return self._sharded(fn, (q, k_pages, v_pages, lengths, page_indices),
                         (heads, pages, pages, P(), P()), heads)

  def ragged(self, q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
             layer=None):
    """As `decode`: one layer's pages, or the whole pools and the `layer` to read."""
    if self.impl == "xla":
      return xla_attention.ragged_paged_attention_xla(
          q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs, layer=layer)
    if layer is not None:
      k_pages, v_pages = k_pages[layer], v_pages[layer]
    args = (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    fn = functools.partial(ragged_paged_attention, interpret=self.interpret,
                           variant=self.variant)
    heads, pages = P(None, "tp", None), P("tp", None, None, None)
    return self._sharded(fn, args, (heads, pages, pages, P(), P(), P(), P()), heads)
