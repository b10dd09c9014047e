"""Decode paged attention: one new query token per sequence over its paged KV cache.

`api.paged_attention` validates the arguments and picks the platform's kernel: `tpu` (Pallas
Mosaic, pages DMA'd into a VMEM double buffer), `gpu` (Pallas Triton, flash-decoding splits);
`reference` is the dense jnp oracle every kernel is tested against (interpret mode on CPU).
"""
