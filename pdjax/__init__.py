"""pdjax: prefill/decode disaggregated LLM serving on JAX."""
