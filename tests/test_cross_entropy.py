"""`head_cross_entropy`: the head GEMM's epilogue leaves each row's log-sum-exp.

Against a float64 reference of the logits as the head stores them (rounded to x's dtype):
the XLA path, the kernel in GPU interpret mode at shapes that are not whole tiles (the
stats must leave out the padded columns), split-K (the stats then come after the sum, in
XLA), the lowering for CUDA, and the argument checks; on a Hopper GPU the kernel itself
(true edge tiles, large vocabularies). `benchmarks.head_loss` times it.
"""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import GemmConfig
from pallas_gemm.cross_entropy import head_cross_entropy, logits_and_lse
from pallas_gemm.epilogue import combine_row_lse

from hypothesis_budget import examples
from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

slow = pytest.mark.slow  # a further case: CI runs it on the GPU machine's jax only


def _inputs(m, k, n, *, seed=0, lead=None, dtype=jnp.bfloat16, bias=True):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((*(lead or (m,)), k)), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k) * 3, dtype)
  labels = jnp.asarray(rng.integers(0, n, lead or (m,)), jnp.int32)
  b = jnp.asarray(rng.standard_normal(n), jnp.float32) if bias else None
  return x, w, labels, b


def _reference(x, w, labels, bias):
  """(loss, dx, dw, dbias) in float64 of the mean loss, from the stored (rounded) logits."""
  x64 = np.asarray(x.astype(jnp.float32), np.float64).reshape(-1, x.shape[-1])
  w64 = np.asarray(w.astype(jnp.float32), np.float64)
  pre = x64 @ w64 + (0 if bias is None else np.asarray(bias, np.float64))
  logits = np.asarray(jnp.asarray(pre, jnp.float32).astype(x.dtype).astype(jnp.float32), np.float64)
  top = logits.max(axis=1, keepdims=True)
  lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
  lab = np.asarray(labels).reshape(-1)
  loss = lse - logits[np.arange(len(lab)), lab]
  d = np.exp(logits - lse[:, None])
  d[np.arange(len(lab)), lab] -= 1
  d /= len(lab)
  return loss.reshape(labels.shape), d @ w64.T, x64.T @ d, d.sum(axis=0)


def _rel(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.isfinite(got).all()
  return np.linalg.norm(got - want) / np.linalg.norm(want)


def _check(implementation, x, w, labels, bias, config=None, grad_bound=2e-2):
  # The row statistics against a float64 log-sum-exp of the very logits stored: exact up
  # to f32 sums (a padded column counted, or a tile left out, is far above this bound).
  flat = x.reshape(-1, x.shape[-1])
  logits, lse = logits_and_lse(flat, w, bias, implementation, config)
  l64 = np.asarray(logits.astype(jnp.float32), np.float64)
  top = l64.max(axis=1, keepdims=True)
  assert _rel(lse, top[:, 0] + np.log(np.exp(l64 - top).sum(axis=1))) < 1e-6

  def mean_loss(x, w, bias):
    loss = head_cross_entropy(x, w, labels, bias=bias, implementation=implementation, config=config)
    return loss.mean(), loss

  (_, loss), grads = jax.value_and_grad(mean_loss, argnums=(0, 1, 2), has_aux=True)(x, w, bias)
  want_loss, *want_grads = _reference(x, w, labels, bias)
  assert loss.shape == labels.shape and loss.dtype == jnp.float32
  # Against float64's logits rounded to bf16: the kernel's f32 sums round a few logits to
  # the neighbouring bf16 value (NOTES exp. 136), hence not the 1e-6 above.
  assert _rel(loss, want_loss) < 1e-3
  # The backward rounds dlogits to x's dtype before its GEMMs, as the model's own does.
  for got, want in zip(grads, want_grads):
    if want is not None and got is not None:
      assert _rel(got.reshape(want.shape), want) < grad_bound


def test_xla_path_against_float64():
  _check("xla", *_inputs(96, 64, 300))


def test_xla_path_matches_optax_on_the_same_logits():
  optax = pytest.importorskip("optax")
  x, w, labels, _ = _inputs(64, 32, 200, bias=False)
  logits = jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
  want = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  got = head_cross_entropy(x, w, labels, implementation="xla")
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.interpret
@needs_transposes  # the backward's GEMMs
@pytest.mark.parametrize(
    "m, k, n, lead, bias",
    [(100, 64, 300, None, True), pytest.param(64, 128, 520, (2, 32), False, marks=slow)],
    ids=["odd-rows-and-columns", "batched-lead"],
)
def test_kernel_in_the_interpreter(m, k, n, lead, bias):
  _check("interpret", *_inputs(m, k, n, lead=lead, bias=bias))


@pytest.mark.interpret
@needs_transposes
@slow
def test_kernel_split_k_in_the_interpreter():
  # Partial sums in the kernel; the log-sum-exp of the stored logits in XLA after the sum.
  config = GemmConfig(tile_m=64, tile_n=128, wg_split="n", split_k=2)
  _check("interpret", *_inputs(64, 256, 200, seed=3), config=config)


def test_lowers_for_cuda():
  x, w, labels, b = _inputs(1000, 256, 1200)

  def step(x, w, b):
    return jax.grad(
        lambda x, w, b: head_cross_entropy(x, w, labels, bias=b, implementation="pallas").mean(),
        argnums=(0, 1, 2),
    )(x, w, b)

  text = jax.export.export(jax.jit(step), platforms=["cuda"])(x, w, b).mlir_module()
  assert "mosaic_gpu" in text
  logits, lse = jax.eval_shape(lambda x, w: logits_and_lse(x, w, None, "pallas"), x, w)
  assert logits.shape == (1000, 1200) and logits.dtype == jnp.bfloat16
  assert lse.shape == (1000,) and lse.dtype == jnp.float32


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(x=jnp.ones((4, 8), jnp.float32)), TypeError, "^x and w must share one of"),
        (dict(w=jnp.ones((9, 16), jnp.bfloat16)), ValueError, r"^x \(\.\.\., K\) and w \(K, N\)"),
        (dict(labels=jnp.zeros((5,), jnp.int32)), ValueError, "^labels must be integers"),
        (dict(labels=jnp.zeros((4,), jnp.float32)), ValueError, "^labels must be integers"),
        (dict(bias=jnp.ones((15,))), ValueError, r"^bias must be \(N,\) = \(16,\)"),
        (dict(implementation="cuda"), ValueError, "^implementation must be one of"),
        (dict(config="big"), TypeError, "^config must be a GemmConfig"),
    ],
)
def test_bad_arguments_are_named(change, error, match):
  args = (
      dict(
          x=jnp.ones((4, 8), jnp.bfloat16),
          w=jnp.ones((8, 16), jnp.bfloat16),
          labels=jnp.zeros((4,), jnp.int32),
          bias=None,
          implementation="xla",
          config=None,
      )
      | change
  )
  x, w, labels = args.pop("x"), args.pop("w"), args.pop("labels")
  with pytest.raises(error, match=match):
    head_cross_entropy(x, w, labels, **args)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n, lead, bias",
    [
        (1000, 256, 1200, None, True),  # true edge tiles in both dims
        (257, 2048, 32000, None, False),  # a GPT head's vocabulary, one partial row tile
        (64, 1024, 50257, (4, 16), True),  # GPT-2's odd vocabulary, batched lead
    ],
    ids=["edges", "vocab32000", "vocab50257-lead"],
)
def test_kernel_on_the_gpu(m, k, n, lead, bias):
  _check("pallas", *_inputs(m, k, n, lead=lead, bias=bias))


@hypothesis.settings(max_examples=examples(30), deadline=None)
@hypothesis.given(
    st.lists(st.floats(-60, 60, width=32), min_size=1, max_size=40), st.integers(1, 8)
)
def test_combined_parts_are_the_log_sum_exp_for_any_tiling(values, width):
  # Any cut of a row into column tiles, tile maxima and sums as the kernel keeps them.
  y = np.asarray(values, np.float64)[None]
  parts = []
  for start in range(0, y.shape[1], width):
    tile = y[:, start : start + width]
    top = tile.max(axis=1)
    parts.append(np.stack([top, np.exp(tile - top[:, None]).sum(axis=1)]))
  got = combine_row_lse(jnp.asarray(np.stack(parts), jnp.float32))
  top = y.max()
  np.testing.assert_allclose(got, [top + np.log(np.exp(y - top).sum())], rtol=1e-5, atol=1e-5)
