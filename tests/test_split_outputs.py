"""`matmul_split`: one GEMM whose output pieces the kernel stores as separate arrays.

Against float64 (values and gradients): the XLA path, the kernel in GPU interpret mode
(pieces stored apart, and a split the kernel cannot store apart, split in XLA), the CUDA
lowering (one kernel with one result per piece), the argument checks; the GPU itself in
the `gpu` test.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import GemmConfig
from pallas_gemm import gemm as gemm_lib
from pallas_gemm.epilogue import EpilogueSpec
from pallas_gemm.split_outputs import matmul_split

from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

slow = pytest.mark.slow  # a further case: CI runs it on the GPU machine's jax only


def _inputs(m, k, n, seed=0, bias=True):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal(n), jnp.float32) if bias else None
  return x, w, b


def _rel(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.isfinite(got).all()
  return np.linalg.norm(got - want) / np.linalg.norm(want)


def _check(implementation, x, w, b, sizes, config=None):
  cot = [
      jnp.asarray(np.random.default_rng(9 + i).standard_normal((x.shape[0], s)), x.dtype)
      for i, s in enumerate(sizes)
  ]
  f = lambda x, w, b: matmul_split(
      x, w, sizes, bias=b, implementation=implementation, config=config
  )
  pieces, vjp = jax.vjp(f, x, w, b)
  dx, dw, db = vjp(tuple(cot))
  x64, w64 = (np.asarray(v.astype(jnp.float32), np.float64) for v in (x, w))
  y64 = x64 @ w64 + np.asarray(b, np.float64)
  g64 = np.concatenate([np.asarray(c.astype(jnp.float32), np.float64) for c in cot], axis=1)
  starts = np.cumsum(sizes)[:-1]
  assert [p.shape for p in pieces] == [(x.shape[0], s) for s in sizes]
  for got, want in zip(pieces, np.split(y64, starts, axis=1)):
    assert got.dtype == x.dtype and _rel(got, want) < 8e-3
  assert _rel(dx, g64 @ w64.T) < 8e-3
  assert _rel(dw, x64.T @ g64) < 8e-3
  assert _rel(db, g64.sum(axis=0)) < 1e-5


def test_xla_path_against_float64():
  _check("xla", *_inputs(96, 64, 320), (192, 64, 64))


@pytest.mark.interpret
@needs_transposes  # the backward's GEMMs
@pytest.mark.parametrize(
    "sizes",
    [(96, 64, 96), pytest.param((100, 156), marks=slow)],
    ids=["stored-apart", "split-in-xla"],
)
def test_kernel_in_the_interpreter(sizes):
  # 32-column epilogue chunks; (100, 156) is not whole chunks: one output, split after.
  config = GemmConfig(tile_m=64, tile_n=128, wg_split="n", epilogue_tile=(64, 32))
  _check("interpret", *_inputs(100, 64, 256), sizes, config=config)


def _mosaic_results(sizes, config=None):
  x, w, b = _inputs(1000, 256, sum(sizes))
  f = jax.jit(
      lambda x, w, b: matmul_split(x, w, sizes, bias=b, implementation="pallas", config=config)
  )
  text = jax.export.export(f, platforms=["cuda"])(x, w, b).mlir_module()
  (call,) = [l for l in text.splitlines() if "stablehlo.custom_call" in l and "@mosaic_gpu" in l]
  return call.split("->")[-1].count("tensor<")


def test_the_kernel_stores_each_piece_apart():
  assert _mosaic_results((2048, 512, 512)) == 3
  assert _mosaic_results((2000, 48)) == 1  # not whole epilogue chunks: split in XLA


@pytest.mark.interpret
@pytest.mark.parametrize("which, split_k", [("a", 1), ("b", 1), pytest.param("a", 2, marks=slow)])
def test_kernel_reads_an_operand_in_pieces_in_the_interpreter(which, split_k):
  # A (128, 256) in pieces along K, or B (256, 256) along N: each box from one piece
  # (with split-K, each K slice's boxes).
  rng = np.random.default_rng(4)
  a = jnp.asarray(rng.standard_normal((128, 256)), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal((256, 256)) / 16, jnp.bfloat16)
  config = GemmConfig(tile_m=64, tile_n=128, tile_k=64, wg_split="n", stages=2, split_k=split_k)
  cut = lambda x: (x[:, :128], x[:, 128:192], x[:, 192:])
  args = (cut(a), b) if which == "a" else (a, cut(b))
  problem, _ = gemm_lib.gemm_problem(a, b, False, False, None, None, 0.0, None)
  y = gemm_lib.kernel_gemm(
      *args, problem, (), EpilogueSpec(), None, None, config, interpret=True, autotune=None
  )
  want = np.asarray(a.astype(jnp.float32), np.float64) @ np.asarray(
      b.astype(jnp.float32), np.float64
  )
  assert _rel(y, want) < 8e-3


def test_the_backward_reads_the_pieces_where_they_are():
  x, w, _ = _inputs(1024, 256, 3072, bias=False)
  sizes = (2048, 512, 512)

  def loss(x, w):  # linear in q, k, v: the forward GEMM is dead code in the gradient
    q, k, v = matmul_split(x, w, sizes, implementation="pallas")
    return (q.astype(jnp.float32).sum() + 2 * k.astype(jnp.float32).sum()
            + 3 * v.astype(jnp.float32).sum())  # fmt: skip

  text = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1))), platforms=["cuda"])(
      x, w
  ).mlir_module()
  calls = [l for l in text.splitlines() if "stablehlo.custom_call" in l and "@mosaic_gpu" in l]
  operands = sorted(c.split("@mosaic_gpu_v2(")[1].split(")")[0].count("%") for c in calls)
  assert operands == [4, 4]  # dX (3 pieces, w; split-K here) and dW (x, 3 pieces)
  assert "concatenate" not in text


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(sizes=(8, 9)), ValueError, r"^sizes must be positive ints summing to N=16"),
        (dict(sizes=(16, 0)), ValueError, r"^sizes must be positive ints"),
        (dict(x=jnp.ones((4, 8), jnp.float32)), TypeError, "^x and w must share bf16 or f16"),
        (dict(w=jnp.ones((9, 16), jnp.bfloat16)), ValueError, r"^x \(\.\.\., K\) and w \(K, N\)"),
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
          sizes=(8, 8),
          bias=None,
          implementation="xla",
          config=None,
      )
      | change
  )
  x, w, sizes = args.pop("x"), args.pop("w"), args.pop("sizes")
  with pytest.raises(error, match=match):
    matmul_split(x, w, sizes, **args)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, sizes", [(1000, (2048, 512, 512)), (16384, (2048, 2048, 2048))], ids=["gqa", "mha"]
)
def test_kernel_on_the_gpu(m, sizes):
  _check("pallas", *_inputs(m, 2048, sum(sizes)), sizes)
