"""Prefill (ragged) paged attention: several query tokens per sequence, causal over the cached
prefix and the new chunk, read through the block table.

`api` validates the arguments and picks the platform's kernel: `tpu` (Pallas Mosaic) or `gpu`
(Pallas Triton); `reference` is the dense jnp oracle every kernel is tested against
(interpret mode on CPU).
"""
