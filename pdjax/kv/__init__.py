"""Paged KV-cache bookkeeping, host side and pure Python (the block manager).

`pages`: the page allocator (refcounts) and per-sequence block tables (`BlockTables`, one per
instance); `prefix_cache`: automatic prefix caching on a pool; `host_tier`: a node's host-memory
KV tier that evicted prefix pages go to; `transfer_result`: what one KV transfer cost.
"""
