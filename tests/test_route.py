"""`implementation=None` on a GPU ("auto"): the kernel, except where XLA's GEMM wins
(`pallas_gemm.route`). The rules on problems, then the public API's choice seen in the
module exported for CUDA (Mosaic custom calls counted) with a GPU pretended."""

import hypothesis
from hypothesis import example, given, settings, strategies as st
import jax
import jax.numpy as jnp
import pytest

import pallas_gemm
from pallas_gemm import _compat, compile_once, route
from pallas_gemm.config import GemmProblem


@pytest.mark.parametrize(
    "problem, why",
    [
        (GemmProblem(m=4096, n=4096, k=8), "K=8 < 64"),  # issue 16: 0.65-0.76x
        (GemmProblem(m=256, n=256, k=256), "at the roofline"),
        (GemmProblem(m=384, n=384, k=384), "at the roofline"),  # chained: 0.85-0.95x
        (GemmProblem(m=65536, n=64, k=72), "every row stride"),  # 0.21x
        (GemmProblem(m=9280, n=14072, k=320), "every row stride"),  # output sliced: 0.52x
        (GemmProblem(m=5568, n=5440, k=2701, transpose_a=True), "every row stride"),  # 0.82x
        (GemmProblem(m=704, n=5576, k=5440), "every row stride"),  # 0.62x
        (GemmProblem(m=1000, n=1000, k=1000), "every row stride"),  # 0.58x (drawn171)
        (GemmProblem(m=1000, n=1016, k=4000), "every row stride"),  # B copied: 0.64x
        (GemmProblem(m=1, n=14336, k=4096), "decode"),  # 0.83-0.93x
        (GemmProblem(m=64, n=4096, k=14336), "decode"),
        (GemmProblem(m=65536, n=16, k=2048), "B's (K, N) rows"),  # 0.88x
        (GemmProblem(m=8192, n=16, k=4096, transpose_a=True), "B's (K, N) rows"),  # 0.78x
        (GemmProblem(m=1024, n=16, k=1024, batch=64), "B's (K, N) rows"),  # 0.72x
        # a 768-wide model's weight gradient: 72 tiles on 132 SMs, 0.80x at best
        (GemmProblem(m=768, n=3072, k=16384, transpose_a=True), "fill the SMs badly"),
        # 1.1-1.5 waves at K 2048-6144: 0.66x, 0.69x (NOTES exp. 141)
        (GemmProblem(m=6144, n=768, k=2048, transpose_a=True), "fill the SMs badly"),
        (GemmProblem(m=3072, n=768, k=6144, transpose_a=True), "fill the SMs badly"),
        (GemmProblem(m=5120, n=896, k=1280), "fill the SMs badly"),  # 128x192: 0.83x
        (GemmProblem(m=391, n=5632, k=13312), "fill the SMs badly"),  # odd M: 0.66x
        # N odd in C's row stride alone: the output copy (539 us) outlasts the GEMM (304 us)
        (GemmProblem(m=14893, n=7671, k=1024, transpose_b=True), "C's row stride"),  # 0.43x
        (GemmProblem(m=8531, n=5300, k=576, transpose_b=True), "C's row stride"),  # 0.70x
    ],
)
def test_what_the_kernel_cannot_win_goes_to_xla(problem, why):
  implementation, reason = route.choose(problem)
  assert implementation == "xla" and why in reason


@pytest.mark.parametrize(
    "problem",
    [
        GemmProblem(m=16384, n=8192, k=2048),  # training projections
        GemmProblem(m=2048, n=8192, k=16384, transpose_a=True),  # their weight gradients
        GemmProblem(m=2048, n=3072, k=16384, transpose_a=True),  # tail split: 1.01x
        GemmProblem(m=640, n=1024, k=2048, transpose_b=True),  # 64x128 tiles: 2.0x
        GemmProblem(m=1024, n=1024, k=3072, transpose_a=True),  # 64x128 tiles: 1.33x
        GemmProblem(m=3072, n=766, k=6144, transpose_a=True),  # under-filled, but N % 8 != 0
        GemmProblem(m=723, n=960, k=11072, transpose_a=True),  # A (K, M), M odd: 1.99x
        GemmProblem(m=2048, n=896, k=1152, transpose_a=True),  # 64x256 at K < 2048: 1.40x
        GemmProblem(m=960, n=5101, k=10352, transpose_b=True),  # output copy 0.22x: 1.70x
        # memory-bound, copied for TMA, but XLA off its alignment too (NOTES exp. 151)
        GemmProblem(m=15104, n=11605, k=275, transpose_b=True),  # 1.44x
        GemmProblem(m=320, n=434, k=13120, transpose_a=True),  # 2.19x
        GemmProblem(m=512, n=2779, k=1152, transpose_b=True),  # under 4 us: 1.25x
        GemmProblem(m=128, n=14336, k=4096),  # past decode: 128 rows
        GemmProblem(m=512, n=512, k=512),  # 1.43-1.46x kernel time, 1.06-1.20x chained
        GemmProblem(m=1024, n=1024, k=1024),  # 1.17-1.50x, 0.72-1.29x chained (noisy)
        GemmProblem(m=32768, n=64, k=1024),  # skinny N, memory-bound: 0.98-1.10x
        GemmProblem(m=65536, n=32, k=512),  # a 32-wide tile: 1.01x
        GemmProblem(m=65536, n=16, k=2048, transpose_b=True),  # a 16-wide tile: 0.98x
        GemmProblem(m=4096, n=4096, k=7001),  # odd K: A copied (1.5-2.4x)
        GemmProblem(m=7872, n=15005, k=512, transpose_a=True),  # odd N: 1.49x
        GemmProblem(m=2048, n=128, k=2048, batch=32),  # batched
        GemmProblem(m=4096, n=4096, k=8, dtype="float8_e4m3fn", out_dtype="bfloat16"),  # fp8 kept
    ],
)
def test_the_kernel_keeps_what_it_wins_or_what_only_it_does(problem):
  assert route.choose(problem) == ("pallas", "the kernel")


_UNDERFILLED_EXTENTS = [512, 768, 768, 1024, 1536, 3072, 6144, 8192, 16384]


@settings(max_examples=150, deadline=None)
@given(
    m=st.one_of(st.sampled_from(_UNDERFILLED_EXTENTS), st.integers(1, 20000)),
    n=st.one_of(st.sampled_from(_UNDERFILLED_EXTENTS), st.integers(1, 20000)),
    k=st.one_of(st.sampled_from(_UNDERFILLED_EXTENTS), st.integers(1, 20000)),
    batch=st.sampled_from([1, 1, 1, 3]),
    dtype=st.sampled_from(["bfloat16", "float16", "float8_e4m3fn", "float32"]),
    transpose_a=st.booleans(),
    transpose_b=st.booleans(),
)
@example(  # routed: 72 wide tiles on 132 SMs
    m=768, n=3072, k=16384, batch=1, dtype="bfloat16", transpose_a=True, transpose_b=False
)
@example(  # the same, batched: kept
    m=768, n=3072, k=16384, batch=3, dtype="bfloat16", transpose_a=True, transpose_b=False
)
def test_the_fill_rule_routes_only_within_its_guards(
    m, n, k, batch, dtype, transpose_a, transpose_b
):
  problem = GemmProblem(
      m=m, n=n, k=k, batch=batch, dtype=dtype, transpose_a=transpose_a, transpose_b=transpose_b
  )
  implementation, why = route.choose(problem)
  assert implementation in ("xla", "pallas") and why
  if "fill the SMs badly" in why:
    assert implementation == "xla" and dtype in route.ROUTED_DTYPES
    assert k >= route.UNDERFILLED_WIDE_MIN_K and batch == 1
    assert route.xla_aligned(problem) and n % route.ALIGNED == 0
    config = route.heuristics.default_config(problem)
    assert (config.tile_m, config.tile_n) != route.SMALL_TILE
    assert k >= route.UNDERFILLED_MIN_K or config.tile_m >= 128
    assert route.heuristics.over_ideal(problem, config, 132, 1.0) >= route.MAX_OVER_IDEAL
  if "C's row stride" in why:
    a_stride = m if transpose_a else k
    b_stride = k if transpose_b else n
    assert a_stride % route.ALIGNED == 0 and b_stride % route.ALIGNED == 0
    assert n % route.ALIGNED and route.roofline_us(problem) >= route.MIN_SLICE_ROOFLINE_US
  hypothesis.event("fill rule" if "fill the SMs" in why else implementation)


def test_padding_copy_counts_the_arrays_tma_cannot_read_or_write_as_they_are():
  assert route.padding_copy_bytes(GemmProblem(m=4096, n=4096, k=4000)) == 0  # 64-byte swizzle
  # K=72 (144 bytes): A (4096, 72) is padded to 128 columns; B (72, N) is read as it is.
  assert route.padding_copy_bytes(GemmProblem(m=4096, n=4096, k=72)) == 2 * 4096 * (72 + 128)
  assert route.padding_copy_bytes(GemmProblem(m=4096, n=8192, k=72)) == 2 * 4096 * (72 + 128)
  # N = 14072: B's columns padded to 14080, the output written 14080 wide and sliced.
  b, out = 320 * (14072 + 14080), 9280 * (14080 + 14072)
  assert route.padding_copy_bytes(GemmProblem(m=9280, n=14072, k=320)) == 2 * (b + out)
  # TN with K = 2701: the MN-major tiles have no row-wise view; A's and B's rows padded to 2704.
  tn = GemmProblem(m=5568, n=5440, k=2701, transpose_a=True)
  assert route.padding_copy_bytes(tn) == 2 * (2701 + 2704) * (5568 + 5440)


def _kernels(fn, *shapes):
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
  text = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args).mlir_module()
  return compile_once.module_kernel_count(text)


@pytest.fixture
def pretend_gpu(monkeypatch):
  monkeypatch.setattr(_compat, "on_hopper", lambda: True)


def test_the_default_routes_each_gemm_of_a_training_step(pretend_gpu):
  loss = lambda a, b: jnp.square(pallas_gemm.matmul(a, b).astype(jnp.float32)).sum()
  step = jax.grad(loss, argnums=(0, 1))
  assert _kernels(step, (2048, 2048), (2048, 2048)) == 3  # forward, dA, dB on the kernel
  assert _kernels(step, (256, 256), (256, 256)) == 0  # all three under 0.3 us: XLA
  assert _kernels(lambda a, b: pallas_gemm.matmul(a, b), (4096, 8), (8, 4096)) == 0


@pytest.mark.parametrize("tokens, kernels", [(1, 0), (64, 0), (2048, 2)])
def test_the_gated_mlp_and_its_unit_route_like_their_up_projection(pretend_gpu, tokens, kernels):
  # Decode (M <= 64 rows, memory-bound) runs XLA's GEMV as a plain GEMM would (NOTES
  # exp. 79: the Llama model's 1-token forward ran the unit's kernel at 249 us against
  # XLA's 163); prefill keeps the kernels: the unit, and the down projection.
  mlp = lambda x, wg, wu, wd: pallas_gemm.gated_mlp(x, wg, wu, wd)
  assert _kernels(mlp, (tokens, 2048), (2048, 5632), (2048, 5632), (5632, 2048)) == kernels
  unit = lambda x, wg, wu: pallas_gemm.gated_linear_unit(x, wg, wu)
  assert _kernels(unit, (tokens, 2048), (2048, 5632), (2048, 5632)) == kernels // 2


def test_a_config_or_an_explicit_implementation_means_the_kernel(pretend_gpu):
  small = ((256, 256), (256, 256))
  assert _kernels(lambda a, b: pallas_gemm.matmul(a, b, implementation="pallas"), *small) == 1
  config = pallas_gemm.GemmConfig(tile_m=64, tile_n=128, wg_split="n")
  assert _kernels(lambda a, b: pallas_gemm.matmul(a, b, config=config), *small) == 1


def test_auto_is_xla_without_a_gpu():
  a = jnp.ones((256, 256), jnp.bfloat16)
  out = pallas_gemm.matmul(a, a, implementation="auto")
  assert out.shape == (256, 256) and float(out[0, 0]) == 256.0


def _dot_result_types(fn, *shapes):
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
  text = jax.jit(fn).lower(*args).as_text()
  return [line.split("->")[-1].strip() for line in text.splitlines() if "dot_general" in line]


def test_routed_decode_rounds_the_product_as_jnp_dot_does(pretend_gpu):
  # At M = 1 XLA strength-reduces the dot to multiply + reduce; an f32 product made that
  # reduce f32 and 40% slower than nnx's bf16 dot in the Llama model's 1-token forward.
  with_residual = lambda x, w, r: pallas_gemm.matmul(x, w, residual=r)
  (decode,) = _dot_result_types(with_residual, (1, 2048), (2048, 2048), (1, 2048))
  assert decode.endswith("bf16>")
  (prefill,) = _dot_result_types(
      lambda x, w, r: pallas_gemm.matmul(x, w, residual=r, implementation="xla"),
      (1, 2048),
      (2048, 2048),
      (1, 2048),
  )
  assert prefill.endswith("f32>")  # asked for XLA: the f32 epilogue on the f32 product


def test_the_gated_mlp_routed_at_decode_rounds_its_products_too(pretend_gpu):
  # The Llama model's 1-token forward on the H200 ran the gated MLP's XLA route at 0.89x
  # nnx's: its gate and up products were f32 (NOTES exp. 99). Now all three GEMMs of a
  # routed decode step give bf16 products, as nnx's layers; asked for XLA, f32 as before.
  shapes = ((1, 2048), (2048, 5632), (2048, 5632), (5632, 2048), (1, 2048))
  mlp = lambda x, wg, wu, wd, r: pallas_gemm.gated_mlp(x, wg, wu, wd, residual=r)
  assert all(t.endswith("bf16>") for t in _dot_result_types(mlp, *shapes))
  unit = lambda x, wg, wu: pallas_gemm.gated_linear_unit(x, wg, wu)
  assert all(t.endswith("bf16>") for t in _dot_result_types(unit, *shapes[:3]))
  asked = lambda x, wg, wu, wd, r: pallas_gemm.gated_mlp(
      x, wg, wu, wd, residual=r, implementation="xla"
  )
  assert all(t.endswith("f32>") for t in _dot_result_types(asked, *shapes))
