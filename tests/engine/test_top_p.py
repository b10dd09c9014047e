"""Nucleus (top_p) sampling: a sampled row draws, with its own key, from the smallest set of most
likely tokens whose mass reaches top_p, renormalised; top_p = 1 draws exactly as plain
temperature sampling, greedy rows ignore top_p, and a tiny top_p is greedy. Rows of five
elements (no top_p) still build batches, with top_p 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine import batch as batch_lib
from pdjax.engine import programs
from pdjax.engine.cluster import build_instances
from pdjax.engine.sampling import NON_FINITE, row_keys, sample
from pdjax.request import Request, SamplingParams, Status

V = 64


def _keys(n, seed=0):
  return row_keys(seed, jnp.arange(n, dtype=jnp.int32) * 7 + 3, jnp.arange(n, dtype=jnp.int32))


def _categorical(keys, scaled):
  return np.asarray(jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, scaled))


def _nucleus_mask(scaled, top_p):
  """Reference (numpy, float64): the scaled logits with every token outside the nucleus at
  -inf."""
  x = np.asarray(scaled, np.float64)
  probs = np.exp(x - x.max())
  probs /= probs.sum()
  order = np.argsort(-probs, kind="stable")
  before = np.cumsum(probs[order]) - probs[order]
  keep = order[before < top_p]
  out = np.full_like(np.asarray(scaled), -np.inf)
  out[keep] = np.asarray(scaled)[keep]
  return out


def _skewed_logits():
  """Token 3 holds 0.5 of the mass, token 7 0.4, the other 62 share 0.1."""
  probs = np.full(V, 0.1 / (V - 2))
  probs[3], probs[7] = 0.5, 0.4
  return np.log(probs).astype(np.float32)


def test_top_p_one_draws_exactly_as_plain_temperature_sampling():
  logits = jax.random.normal(jax.random.key(1), (16, V)) * 3
  temps = jnp.linspace(0.3, 2.0, 16)
  keys = _keys(16)
  expected = _categorical(keys, logits / temps[:, None])
  np.testing.assert_array_equal(np.asarray(sample(logits, temps, keys, jnp.ones(16))), expected)
  np.testing.assert_array_equal(np.asarray(sample(logits, temps, keys)), expected)


def test_tiny_top_p_is_greedy_for_sampled_rows():
  logits = jax.random.normal(jax.random.key(2), (256, V)) * 2
  tokens = sample(logits, jnp.full(256, 1.5), _keys(256), jnp.full(256, 1e-6))
  np.testing.assert_array_equal(np.asarray(tokens), np.argmax(np.asarray(logits), axis=-1))


@pytest.mark.parametrize("top_p", [0.85, 0.89])
def test_draws_stay_in_the_nucleus_renormalised(top_p):
  n = 2000
  logits = jnp.tile(jnp.asarray(_skewed_logits()), (n, 1))
  keys, temps = _keys(n, seed=5), jnp.ones(n)
  drawn = np.asarray(sample(logits, temps, keys, jnp.full(n, top_p)))
  assert set(drawn.tolist()) == {3, 7}
  # Exactly the draw from the renormalised top 2 with the same keys.
  top2 = np.full(V, -np.inf, np.float32)
  top2[[3, 7]] = _skewed_logits()[[3, 7]]
  np.testing.assert_array_equal(drawn, _categorical(keys, jnp.tile(top2, (n, 1))))
  # Without the filter the tail shows up (its mass is 0.1).
  free = np.asarray(sample(logits, temps, keys, jnp.ones(n)))
  assert len(set(free.tolist()) - {3, 7}) > 10
  # A nucleus below the top token's mass is that token alone.
  assert set(np.asarray(sample(logits, temps, keys, jnp.full(n, 0.45))).tolist()) == {3}


def test_mixed_rows_in_one_batch():
  logits = np.array(jax.random.normal(jax.random.key(3), (6, V)))
  logits[5, 9] = np.nan
  temps = np.array([0.0, 0.7, 1.3, 0.0, 1.0, 1.0], np.float32)
  top_ps = np.array([0.3, 0.8, 1.0, 1.0, 0.5, 0.5], np.float32)
  keys = _keys(6, seed=9)
  got = np.asarray(sample(jnp.asarray(logits), jnp.asarray(temps), keys, jnp.asarray(top_ps)))
  scaled = logits / np.where(temps > 0, temps, 1.0)[:, None]
  for row in (0, 3):                                     # greedy, whatever the top_p
    assert got[row] == np.argmax(logits[row])
  for row in (1, 4):                                     # nucleus
    nucleus = _nucleus_mask(scaled[row], top_ps[row])
    assert 1 < np.isfinite(nucleus).sum() < V
    assert got[row] == _categorical(keys[row:row + 1], nucleus[None])[0]
  assert got[2] == _categorical(keys[2:3], scaled[2:3])[0]   # top_p 1: unfiltered
  assert got[5] == NON_FINITE
  assert len({int(t) for t in got[:5]}) > 1


def test_an_unfiltered_batch_does_not_sort_outside_a_cond():
  jaxpr = jax.make_jaxpr(sample)(jnp.zeros((4, V)), jnp.ones(4), _keys(4), jnp.ones(4))
  assert "sort" not in {e.primitive.name for e in jaxpr.jaxpr.eqns}
  assert "sort" in str(jaxpr)


def test_rows_of_five_or_six_elements_build_the_same_batch_but_top_p():
  geom = batch_lib.PageGeometry(num_pages=8, page_size=4, pages_per_seq=4)
  five = [([5, 6, 7], 0, [1], 0.5, 11), ([8], 2, [2], 0.0, 12)]
  six = [five[0] + (0.3,), five[1] + (1.0,)]
  for build in (lambda s: batch_lib.prefill_batch(geom, s, num_tokens=8, max_seqs=3),
                lambda s: batch_lib.decode_batch(geom, [(ids[0], *rest) for ids, *rest in s],
                                                 batch_size=4)):
    a, b = build(five), build(six)
    assert batch_lib.layout(a) == batch_lib.layout(b)
    assert all(np.array_equal(a[k], b[k]) for k in a if k != "top_ps")
    np.testing.assert_array_equal(a["top_ps"][:2], [1.0, 1.0])
    np.testing.assert_array_equal(b["top_ps"][:2], np.float32([0.3, 1.0]))
    assert (b["top_ps"][2:] == 1).all()


@pytest.mark.parametrize("overlap", [False, True])
def test_engine_tiny_top_p_gives_the_greedy_tokens(tiny_model, overlap):
  """Served, a tiny top_p at temperature 1 is greedy, prefill and decode rows alike (overlap:
  decode rows whose input token is still on the device)."""
  cfg, params = tiny_model
  prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(n)] for i, n in enumerate((9, 30))]
  instances = build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())
  reqs = [Request(id=f"p{i}", arrival_s=0.0, prompt_ids=p,
                  sampling=SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=8,
                                          ignore_eos=True))
          for i, p in enumerate(prompts)]
  free = Request(id="free", arrival_s=0.0, prompt_ids=prompts[0],
                 sampling=SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True))
  result = serving.serve("colocated", instances, reqs + [free], overlap=overlap, debug=True)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 3
  greedy = [programs.reference_generate(params, cfg, p, 8) for p in prompts]
  assert [r.output_ids for r in reqs] == greedy
  assert free.output_ids != greedy[0]   # the same batch's top_p = 1 row still samples
