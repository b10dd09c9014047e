"""The experiment configs, shipped with the package so an installed pdjax finds its default.

`python -m pdjax.run` (or the `pdjax` script) without --config loads default.py here; the
others build on it through `sibling_config`. In a clone, configs/<name>.py re-exports these.
CONFIG_DIR is this folder, for `--config=<CONFIG_DIR>/pd_ratio.py` from an installed copy.
"""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


def simulate_published_shape(c, preset: str = "llama3_8b", hardware: str = "h100", *,
                             max_model_len: int = 2048,
                             prefill_buckets: tuple[int, ...] = (512, 1024, 2048)):
  """Sets config c to simulate a published model shape: backend sim, the roofline cost model
  on a hardware preset, bfloat16, 16-token pages, 4096 pages per instance (plain runs; the
  planner sizes pools from HBM), max(prefill_buckets) prompt tokens and 16 prompts per
  prefill step, up to 128 running sequences per instance. Returns c."""
  c.backend = "sim"
  c.model.preset, c.model.dtype = preset, "bfloat16"
  c.sim.hardware, c.sim.cost_model = hardware, "roofline"
  c.kv.page_size, c.kv.max_model_len, c.kv.pages_per_instance = 16, max_model_len, 4096
  c.scheduler.prefill_buckets = tuple(prefill_buckets)
  c.scheduler.max_prefill_seqs = 16
  c.scheduler.decode_buckets = (16, 32, 64, 128)
  return c
