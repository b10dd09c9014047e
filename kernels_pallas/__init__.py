"""Pallas kernels (paged attention for decode and ragged prefill). Arrive with issue 3."""
