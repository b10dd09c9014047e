"""The simulated backend: instances whose step times come from a cost model, on a virtual clock.

The driver, policies, page allocator and metrics are the same objects as on the jax backend.
"""
