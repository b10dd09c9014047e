"""What a compiled CPU decode step must not do, read from its optimized HLO: copy a whole KV
pool (a one-token write turned into a dynamic-update-slice did, every layer), copy one layer of
a pool out for the attention, or copy weights out before a dot (scanned stacked weights were
sliced and copied every layer). Each of these cost more than the step's own work."""

import re

import jax
import pytest

from conftest import tiny_engine_options
from pdjax.engine import mesh as mesh_lib
from pdjax.engine.instance import Instance

# tiny: 2 layers, 4 kv heads, 256 pages of 8 tokens, head_dim 16; a block table of 128 pages,
# so the attention walks its pages in a loop (16-page blocks of 128 tokens)
POOL = r"f32\[2,4,(256,8|2048),16\]"
LAYER = r"f32\[(1,)?4,(256,8|2048),16\]"     # one layer of a pool
WEIGHT = r"f32\[(128,128|128,8,16|128,4,16|8,16,128|128,256|256,128|128,512)\]"   # a layer's kernels


def _decode_hlo(tiny_model, batch: int, layout: str) -> str:
  cfg, params = tiny_model
  spec = mesh_lib.InstanceSpec("colocated-0", "colocated", tuple(jax.devices()[:1]))
  opts = tiny_engine_options(decode_buckets=(batch,), param_layout=layout, num_pages=256,
                            max_model_len=1024)
  inst = Instance(spec, cfg, params, opts)
  return inst._program("decode", batch).as_text()


def _materialized(hlo: str) -> list[str]:
  """The instructions that write a buffer: those of every computation but fusion bodies (an
  op inside a fusion reads its inputs where they are)."""
  fused = set(re.findall(r"fusion\(.*calls=(%[\w.-]+)", hlo))
  lines, skip = [], False
  for line in hlo.splitlines():
    header = re.match(r"^(ENTRY )?(%[\w.-]+) .*\{$", line)
    if header:
      skip = header.group(2) in fused
    elif not skip:
      lines.append(line)
  return lines


def _produced(hlo: str, shape: str, ops: str) -> list[str]:
  return [line.strip()[:160] for line in _materialized(hlo)
          if re.search(rf"= {shape}\{{[0-9,]*\}} ({ops})\(", line)]


@pytest.mark.parametrize("layout", ["unrolled", "stacked"])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_decode_step_copies_no_pool_and_no_layer_of_it(tiny_model, batch, layout):
  hlo = _decode_hlo(tiny_model, batch, layout)
  assert _produced(hlo, POOL, "copy") == []
  assert _produced(hlo, LAYER, "copy|fusion|dynamic-slice|slice") == []


def test_the_unrolled_layout_feeds_its_weights_to_the_dots_in_place(tiny_model):
  hlo = _decode_hlo(tiny_model, 1, "unrolled")
  assert _produced(hlo, WEIGHT, "copy|fusion|dynamic-slice|slice|transpose") == []


def test_a_decode_step_reads_keys_128_tokens_at_a_time(tiny_model):
  """A block is read whole whatever the context: 512-token blocks made a 128-token context
  read 4x its keys (a batch-4 SmolLM2 step 15-20% slower at max_model_len 1024). The gather
  of one block: batch 4 x 16 pages of 8 tokens, one layer, 4 kv heads, head_dim 16."""
  hlo = _decode_hlo(tiny_model, 4, "unrolled")
  blocks = set(re.findall(r"= f32\[(\d+),1,4,1,8,16\]\S* gather\(", hlo))
  assert blocks == {str(4 * 16)}


def test_decode_attention_has_no_batched_dots(tiny_model):
  """A decode tile's scores and weighted values are a fused multiply and reduce, not
  KVH x batch tiny matmuls (XLA on CPU runs a batched dot one matmul at a time: a batch-64
  SmolLM2 step 12% slower). The projections' dots have no batch dimensions."""
  hlo = _decode_hlo(tiny_model, 4, "unrolled")
  assert re.findall(r"lhs_batch_dims=\{[0-9,]+\}", hlo) == []
