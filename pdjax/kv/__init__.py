"""Paged KV-cache bookkeeping: page allocation and per-sequence block tables."""
