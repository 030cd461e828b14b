"""Tier 1: every supported configuration lowers for CUDA on the CPU (jax.export),
and every rejected one fails with pallas_gemm's own error, before Mosaic sees it."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from benchmarks import device_check
from pallas_gemm import GemmConfig, GemmProblem, _compat, heuristics, matmul

pytestmark = pytest.mark.export

COOP_N = GemmConfig(wg_split="n")
PINGPONG = GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=6)


def _export(a_shape, b_shape, *, dtype="bfloat16", bias=False, c_shape=None, c_dtype=None, **kw):
  args = [jax.ShapeDtypeStruct(a_shape, dtype), jax.ShapeDtypeStruct(b_shape, dtype)]
  n = b_shape[-2] if kw.get("transpose_b") else b_shape[-1]
  args.append(jax.ShapeDtypeStruct((n,), jnp.float32) if bias else None)
  args.append(
      jax.ShapeDtypeStruct(c_shape, c_dtype or kw.get("out_dtype") or dtype) if c_shape else None
  )
  fn = jax.jit(lambda a, b, bias, c: matmul(a, b, bias=bias, c=c, implementation="pallas", **kw))
  exported = jax.export.export(fn, platforms=["cuda"])(*args)
  assert "mosaic_gpu" in exported.mlir_module()
  return exported


def _shapes(m, n, k, ta, tb, batch=()):
  return (*batch, *((k, m) if ta else (m, k))), (*batch, *((n, k) if tb else (k, n)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_layouts_and_dtypes(dtype, layout):
  ta, tb = layout[0] == "T", layout[1] == "T"
  a, b = _shapes(1000, 1016, 1000, ta, tb)
  exp = _export(a, b, dtype=dtype, transpose_a=ta, transpose_b=tb)
  assert exp.out_avals[0].shape == (1000, 1016)


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(),
        COOP_N,
        PINGPONG,
        GemmConfig(cluster=(2, 1)),
        GemmConfig(cluster=(1, 2)),
        dataclasses.replace(PINGPONG, cluster=(2, 1)),
        GemmConfig(stages=3, epilogue_tile=None),
        GemmConfig(raster="along_m", group=4),
        GemmConfig(tile_m=256, tile_n=128),
        GemmConfig(tile_m=64, tile_n=256, wg_split="n"),
    ],
    ids=lambda c: f"{c.schedule}-{c.wg_split}-{c.tile_m}x{c.tile_n}-s{c.stages}-c{c.cluster}",
)
@pytest.mark.parametrize("layout", ["NN", "TT"])
def test_configs(config, layout):
  ta, tb = layout[0] == "T", layout[1] == "T"
  if ta and config.schedule == "cooperative":
    config = dataclasses.replace(config, wg_split="n")
  a, b = _shapes(4096, 8192, 4096, ta, tb)
  _export(a, b, transpose_a=ta, transpose_b=tb, config=config)


OUT_DTYPES = ["bfloat16", "float16", "float32"]
# The plain store and C (read in the output dtype) in every output dtype; the activations,
# computed in f32 before the one cast, once each with the output dtypes taking turns.
EPILOGUE_CASES = [
    *((dtype, dict()) for dtype in OUT_DTYPES),
    *((dtype, dict(c_shape=(1000, 1016), alpha=0.5, beta=2.0, bias=True)) for dtype in OUT_DTYPES),
    *zip(
        OUT_DTYPES * 2,
        [
            dict(bias=True, activation="gelu_tanh"),
            dict(bias=True, activation="gelu_exact"),
            dict(activation="relu"),
            dict(activation="silu"),
            dict(activation="sigmoid"),
        ],
    ),
]


@pytest.mark.parametrize(
    "out_dtype,epilogue",
    [
        pytest.param(
            dtype, e, id="-".join([f"{k}={v}" for k, v in e.items()] or ["plain"]) + f"-{dtype}"
        )
        for dtype, e in EPILOGUE_CASES
    ],
)
def test_epilogues(out_dtype, epilogue):
  _export((1000, 1000), (1000, 1016), out_dtype=out_dtype, **epilogue)


@pytest.mark.parametrize(
    "case",
    [
        dict(a_shape=(3, 300, 200), b_shape=(3, 200, 264)),
        dict(a_shape=(3, 200, 300), b_shape=(3, 264, 200), transpose_a=True, transpose_b=True),
        dict(a_shape=(2, 3, 100, 64), b_shape=(64, 200)),  # batch folded into M
        dict(a_shape=(3, 64, 100), b_shape=(64, 200), transpose_a=True),  # shared 2-D B
        dict(a_shape=(100, 64), b_shape=(3, 64, 200), c_shape=(100, 200), beta=1.0),
    ],
    ids=["batched", "batched-TT", "fold-into-M", "shared-B", "shared-A-c2d"],
)
def test_batched(case):
  _export(**case)


@pytest.mark.parametrize(
    "m,n,k",
    [
        (4000, 8000, 4000),  # K % 64 != 0 -> 64-byte swizzle, no copy
        (200, 136, 72),  # nothing aligned -> pads
        (5, 1, 40),
        (1, 300, 1),
        (1001, 999, 1003),
    ],
)
def test_odd_shapes(m, n, k):
  a, b = _shapes(m, n, k, False, False)
  assert _export(a, b).out_avals[0].shape == (m, n)


@pytest.mark.parametrize(
    "layout,config,batch",
    [
        ("NN", None, ()),
        ("NT", None, ()),
        ("NN", GemmConfig(cluster=(1, 2)), ()),
        ("NN", GemmConfig(cluster=(2, 1)), ()),
        ("NN", PINGPONG, ()),
        ("NN", GemmConfig(stream_k=True), ()),
        ("NN", None, (3,)),
    ],
)
def test_rows_not_a_multiple_of_8_are_copied_without_padding(layout, config, batch):
  """K-major operands and 16-bit outputs with 1001 rows: TMA through the row-wise SMEM
  view (`smem.row_copy_transforms`), so no pad of A (or B, NT) and no output slice."""
  n = 1024 if layout == "NN" else 1003  # NT: B's rows too (its columns: the padded output's)
  a, b = _shapes(1001, n, 1024, False, layout == "NT", batch)
  kw = dict(transpose_b=layout == "NT", config=config)
  exported = _export(a, b, c_shape=(*batch, 1001, n), beta=1.0, **kw)
  text = exported.mlir_module()
  launch = next(line for line in text.splitlines() if "func.func private @_launch(" in line)
  lead = "".join(f"{d}x" for d in batch)
  b_stored = f"{n}x1024" if layout == "NT" else f"1024x{n}"
  assert f"tensor<{lead}1001x1024xbf16>" in launch and f"tensor<{lead}{b_stored}xbf16>" in launch
  if layout == "NN":  # and the output is not cut out of a padded one (NT: 1003 columns are)
    assert "stablehlo.pad" not in text and "stablehlo.slice" not in text


def test_rows_not_a_multiple_of_8_are_padded_where_the_tile_has_no_row_view():
  """A transposed A (MN-major tile, rows of several spans) and an f32 output keep the
  zero padding: one pad (A) and the output's slice."""
  text = _export((1024, 1001), (1024, 1024), transpose_a=True, out_dtype="float32").mlir_module()
  assert text.count("stablehlo.pad") == 1 and "stablehlo.slice" in text


@pytest.mark.parametrize(
    "m, n, layout, bias",
    [
        (65536, 32, "NN", True),
        (65536, 16, "NT", False),
        (1001, 16, "NT", False),
        (8192, 32, "NN", True),
    ],
)
def test_skinny_outputs_are_written_as_they_are(m, n, layout, bias):
  """N <= 32: the default's narrow tile (`heuristics.narrow_tile_n`) writes the output
  unwidened, and B is read as it is: no pad, no slice. (A bias takes 32 columns a
  warpgroup: `config.VECTOR_ALIGN_BYTES`.)"""
  a, b = _shapes(m, n, 2048, False, layout == "NT")
  text = _export(a, b, transpose_b=layout == "NT", bias=bias, activation="gelu").mlir_module()
  assert "stablehlo.pad" not in text and "stablehlo.slice" not in text


@pytest.mark.parametrize("check", device_check.short_k_checks(), ids=lambda c: c.name)
def test_short_k_device_checks_lower(check):
  """K <= 128: the default stores each warpgroup tile at once (`heuristics.short_k_stores`);
  the device matrix's short-K cases (every layout, a batch, epilogues, odd rows) lower."""
  assert device_check.run_check(check, 0, export_only=True)["ok"]


def _consumers3_checks():
  return [c for c in device_check.checks() if "consumers3" in c.name]


@pytest.mark.parametrize("check", _consumers3_checks(), ids=lambda c: c.name)
def test_three_consumer_device_checks_lower(check):
  """`GemmConfig.consumers=3`: the device matrix's cases (192x96 tiles, a 1x2 cluster,
  the tail split, an epilogue with B stored (N, K), a split along N) lower."""
  assert device_check.run_check(check, 0, export_only=True)["ok"]


@pytest.mark.parametrize(
    "problem",
    [
        GemmProblem(
            m=1536, n=1500, k=1000, has_bias=True, has_row_bias=True, residual_dtype="bfloat16"
        ),
        GemmProblem(
            m=1152,
            n=2000,
            k=700,
            dtype="float16",
            out_dtype="float32",
            transpose_b=True,
            has_c=True,
            residual_dtype="float16",
        ),
    ],
    ids=["bias-rowbias-residual", "f16-f32out-c-residual"],
)
def test_the_default_device_checks_run_three_consumers(problem):
  """The "consumers3 default" device checks pass no config: the default must take
  `heuristics.WAVE_TILE` there, with its epilogue operands, on a 132-SM board."""
  config = heuristics.default_config(problem, num_sms=132, hbm_scale=1.0)
  assert (config.consumers, config.tile_m, config.tile_n) == (3, 192, 96)
  names = [c.name for c in _consumers3_checks() if "default" in c.name]
  assert any(f"{problem.m}x{problem.n}x{problem.k}" in name for name in names), names


# -- rejected configurations: our ValueError, naming the field ----------------
@pytest.mark.parametrize(
    "fields,field",
    [
        (dict(stages=1), "stages"),
        (dict(stages=6), "stages"),  # shared memory
        (dict(tile_m=96), "tile_m"),
        (dict(tile_n=512), "tile_n"),
        (dict(tile_n=200), "tile_n"),  # MN-major B tile needs whole 32-byte spans
        (dict(tile_m=64, tile_n=48, wg_split="n", epilogue_tile=(64, 8)), "tile_n"),  # 24 per WG
        (dict(tile_k=48), "tile_k"),
        (dict(tile_m=256, tile_n=256), "tile_n"),  # accumulator registers
        (dict(cluster=(2, 2)), "cluster"),
        (dict(schedule="stream-k"), "schedule"),
        (dict(wg_split="k"), "wg_split"),
        (dict(raster="hilbert"), "raster"),
        (dict(group=0), "group"),
        (dict(tile_k=0), "tile_k"),  # at construction, not a ZeroDivisionError
        (dict(stages=2.5), "stages"),
        (dict(cluster=(2,)), "cluster"),
        (dict(num_sms=3, cluster=(2, 1)), "num_sms"),
        (dict(epilogue_tile=(32, 64)), "epilogue_tile"),
        (dict(epilogue_tile=(64, 96)), "epilogue_tile"),
        (dict(consumers=4), "consumers"),
        (dict(consumers=3, schedule="pingpong", tile_m=128, tile_n=128), "consumers"),
        (dict(consumers=3, tile_m=128, tile_n=96), "tile_m"),  # 128 rows in three
        (dict(consumers=3, tile_m=192, tile_n=128), "tile_n"),  # 64x128: registers of 3
    ],
)
def test_rejected_configs(fields, field):
  with pytest.raises(ValueError, match=rf"^GemmConfig\.{field}="):
    _export((1024, 1024), (1024, 1024), config=GemmConfig(**fields))


def test_a_column_vector_needs_128_bytes_per_warpgroup():
  """A bias staged as 16 f32 per warpgroup faulted on the H200 (misaligned TMA destination):
  refused by name, before Mosaic; 32 f32 pass."""
  narrow = GemmConfig(tile_n=32, wg_split="n", stages=4, epilogue_tile=None)
  with pytest.raises(ValueError, match=r"^GemmConfig\.tile_n=32: .*128-byte aligned"):
    _export((1024, 1024), (1024, 32), bias=True, config=narrow)
  _export((1024, 1024), (1024, 32), config=narrow)  # no vector: fine
  _export((1024, 1024), (1024, 32), bias=True, config=dataclasses.replace(narrow, wg_split="m"))


def test_a_list_cluster_is_kept_as_a_hashable_pair():
  assert GemmConfig(cluster=[2, 1]) == GemmConfig(cluster=(2, 1))
  assert hash(GemmConfig(cluster=[2, 1], epilogue_tile=[64, 64]))


def test_k_major_b_may_split_n_into_slices_narrower_than_a_swizzle_span():
  config = GemmConfig(tile_m=64, tile_n=192, wg_split="n", stages=4, epilogue_tile=(64, 32))
  _export((1024, 1024), (1024, 1024), transpose_b=True, config=config)


def test_transposed_a_needs_split_n():
  with pytest.raises(ValueError, match=r"^GemmConfig\.wg_split="):
    _export((1024, 1024), (1024, 1024), transpose_a=True, config=GemmConfig(wg_split="m"))


@pytest.mark.parametrize(
    "kwargs,error,name",
    [
        (
            dict(a=jnp.ones((8, 8), jnp.int16), b=jnp.ones((8, 8), jnp.int16)),
            TypeError,
            "a must be",
        ),
        (
            dict(a=jnp.ones((8, 8), jnp.bfloat16), b=jnp.ones((8, 8), jnp.float16)),
            TypeError,
            "a and b",
        ),
        (
            dict(a=jnp.ones((8, 8), jnp.float32), b=jnp.ones((8, 8), jnp.bfloat16)),
            TypeError,
            "a and b",
        ),
        (dict(out_scale=2.0), ValueError, "out_scale"),
        (dict(out_scale=jnp.float32(2.0), out_dtype="float8_e4m3fn"), TypeError, "out_scale"),
        (dict(c=jnp.ones((8, 8)), beta=1.0, out_dtype="float8_e4m3fn"), ValueError, "c "),
        (dict(clamp=(1.0,)), TypeError, "clamp"),
        (dict(clamp=(2.0, 1.0)), ValueError, "clamp"),
        (dict(row_bias=jnp.ones((7,))), ValueError, "row_bias"),
        (dict(residual=jnp.ones((8, 7))), ValueError, "residual"),
        (dict(residual=jnp.ones((8, 8), jnp.int8)), TypeError, "residual"),
        (
            dict(a=jnp.ones((8, 8), jnp.bfloat16), b=jnp.ones((9, 8), jnp.bfloat16)),
            ValueError,
            "contracting",
        ),
        (
            dict(a=jnp.ones((8,), jnp.bfloat16), b=jnp.ones((8, 8), jnp.bfloat16)),
            ValueError,
            "a must have",
        ),
        (dict(bias=jnp.ones((7,))), ValueError, "bias"),
        (dict(c=jnp.ones((8, 7)), beta=1.0), ValueError, "c must"),
        (dict(beta=1.0), ValueError, "beta"),
        (dict(alpha=jnp.float32(2.0)), TypeError, "alpha"),
        (dict(activation="tanh"), ValueError, "activation"),
        (dict(out_dtype=jnp.int8), TypeError, "out_dtype"),
        (dict(implementation="triton"), ValueError, "implementation"),
        (dict(config=dict(tile_m=128)), TypeError, "config"),
        (
            dict(a=jnp.ones((2, 8, 8), jnp.bfloat16), b=jnp.ones((3, 8, 8), jnp.bfloat16)),
            ValueError,
            "batch",
        ),
    ],
)
def test_bad_arguments(kwargs, error, name):
  args = dict(a=jnp.ones((8, 8), jnp.bfloat16), b=jnp.ones((8, 8), jnp.bfloat16))
  args.update(kwargs)
  with pytest.raises(error, match=name):
    matmul(args.pop("a"), args.pop("b"), **args)


# -- fp8 and tf32 operands, fp8 outputs, epilogue extras ----------------------
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float32"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_k_major_dtypes(dtype, layout):
  """Every layout runs; only the non-K-major operands are transposed by XLA."""
  ta, tb = layout[0] == "T", layout[1] == "T"
  a, b = _shapes(1000, 1016, 1024, ta, tb)
  exp = _export(a, b, dtype=dtype, transpose_a=ta, transpose_b=tb)
  want = "bfloat16" if dtype.startswith("float8") else dtype
  assert exp.out_avals[0].shape == (1000, 1016) and exp.out_avals[0].dtype == want
  transposes = exp.mlir_module().count("stablehlo.transpose")
  assert transposes == int(ta) + int(not tb), transposes


@pytest.mark.parametrize(
    "out_dtype", ["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"]
)
def test_fp8_outputs(out_dtype):
  kw = dict(out_scale=0.5) if out_dtype.startswith("float8") else {}
  exp = _export(
      (512, 1024),
      (768, 1024),
      dtype="float8_e4m3fn",
      transpose_b=True,
      out_dtype=out_dtype,
      bias=True,
      activation="gelu_tanh",
      **kw,
  )
  assert exp.out_avals[0].dtype == out_dtype


def test_bf16_in_fp8_out():
  _export((1000, 1000), (1000, 1016), out_dtype="float8_e5m2", out_scale=4.0)


def test_mixed_fp8():
  a, b = jax.ShapeDtypeStruct((512, 1024), "float8_e4m3fn"), jax.ShapeDtypeStruct(
      (768, 1024), "float8_e5m2"
  )
  fn = jax.jit(lambda a, b: matmul(a, b, transpose_b=True, implementation="pallas"))
  if _compat.SUPPORTS_MIXED_FP8:
    assert "mosaic_gpu" in jax.export.export(fn, platforms=["cuda"])(a, b).mlir_module()
  else:
    with pytest.raises(TypeError, match="a and b: mixed fp8"):
      jax.export.export(fn, platforms=["cuda"])(a, b)


@pytest.mark.parametrize("res_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_epilogue_extras(res_dtype, out_dtype):
  m, n, k = 1000, 1016, 1000
  fn = jax.jit(
      lambda a, b, bias, rb, res, c: matmul(
          a,
          b,
          bias=bias,
          row_bias=rb,
          residual=res,
          c=c,
          beta=0.5,
          clamp=(-1.0, None),
          activation="silu",
          out_dtype=out_dtype,
          implementation="pallas",
      )
  )
  args = (
      jax.ShapeDtypeStruct((m, k), "bfloat16"),
      jax.ShapeDtypeStruct((k, n), "bfloat16"),
      jax.ShapeDtypeStruct((n,), "float32"),
      jax.ShapeDtypeStruct((m,), "float32"),
      jax.ShapeDtypeStruct((m, n), res_dtype),
      jax.ShapeDtypeStruct((m, n), out_dtype),
  )
  assert "mosaic_gpu" in jax.export.export(fn, platforms=["cuda"])(*args).mlir_module()


@pytest.mark.parametrize(
    "config",
    [  # a residual tile needs SMEM: one stage fewer
        dataclasses.replace(COOP_N, stages=3),
        dataclasses.replace(PINGPONG, stages=4),
        GemmConfig(cluster=(2, 1), stages=3),
    ],
    ids=["coop-n", "pingpong", "cluster21"],
)
def test_epilogue_extras_batched_schedules(config):
  fn = jax.jit(
      lambda a, b, rb, res: matmul(
          a, b, row_bias=rb, residual=res, clamp=(None, 2.0), config=config, implementation="pallas"
      )
  )
  args = (
      jax.ShapeDtypeStruct((2, 3, 300, 256), "bfloat16"),
      jax.ShapeDtypeStruct((256, 264), "bfloat16"),
      jax.ShapeDtypeStruct((300,), "float32"),
      jax.ShapeDtypeStruct((2, 3, 300, 264), "bfloat16"),
  )
  assert jax.export.export(fn, platforms=["cuda"])(*args).out_avals[0].shape == (2, 3, 300, 264)


@pytest.mark.parametrize(
    "problem,field",
    [
        (GemmProblem(m=1024, n=1024, k=1024, dtype="float8_e4m3fn"), "transpose_a"),
        (
            GemmProblem(
                m=1024, n=1024, k=1024, dtype="float32", transpose_a=True, transpose_b=True
            ),
            "transpose_a",
        ),
        (GemmProblem(m=1024, n=1024, k=1024, dtype="int16", transpose_b=True), "dtype"),
        (GemmProblem(m=1024, n=1024, k=1024, transpose_b=True, b_dtype="float16"), "b_dtype"),
        (GemmProblem(m=1024, n=1024, k=1024, out_dtype="int8"), "out_dtype"),
        (GemmProblem(m=1024, n=1024, k=1024, out_dtype="float8_e4m3fn", has_c=True), "has_c"),
        (GemmProblem(m=1024, n=1024, k=1024, residual_dtype="int8"), "residual_dtype"),
    ],
)
def test_rejected_problems(problem, field):
  with pytest.raises(ValueError, match=rf"^GemmProblem\.{field}="):
    GemmConfig(tile_k=128).validate(problem)


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(tile_k=64),  # fp8: one 128-byte span is 128
        GemmConfig(tile_k=128, stages=5),  # shared memory
    ],
)
def test_rejected_fp8_configs(config):
  field = "tile_k" if config.tile_k == 64 else "stages"
  problem = GemmProblem(m=4096, n=4096, k=4096, dtype="float8_e4m3fn", transpose_b=True)
  with pytest.raises(ValueError, match=rf"^GemmConfig\.{field}="):
    config.validate(problem)


@pytest.mark.parametrize("stages", [2, 3, 5])
def test_pingpong_needs_even_stages_from_4(stages):
  config = GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=stages)
  with pytest.raises(ValueError, match=r"^GemmConfig\.stages=.*even and >= 4 for pingpong"):
    config.validate(GemmProblem(m=4096, n=4096, k=4096))


@pytest.mark.parametrize(
    "config",
    [
        None,
        GemmConfig(schedule="pingpong", tile_n=128, stages=4),
        GemmConfig(stages=3, epilogue_tile=None),
    ],
    ids=["default", "pingpong", "whole-tile-epilogue"],
)
def test_return_pre(config):
  """y and pre from one epilogue: two outputs of the same kernel (what training saves)."""
  from pallas_gemm.gemm import gemm as kernel_matmul  # the kernel entry

  args = (
      jax.ShapeDtypeStruct((1000, 520), jnp.bfloat16),
      jax.ShapeDtypeStruct((1016, 520), jnp.bfloat16),
      jax.ShapeDtypeStruct((1016,), jnp.float32),
  )
  fn = jax.jit(
      lambda a, b, bias: kernel_matmul(
          a,
          b,
          bias=bias,
          transpose_b=True,
          activation="gelu_tanh",
          return_pre=True,
          config=config,
          implementation="pallas",
      )
  )
  exported = jax.export.export(fn, platforms=["cuda"])(*args)
  assert [a.shape for a in exported.out_avals] == [(1000, 1016)] * 2
  assert re.findall(r"custom_call @(\w+)", exported.mlir_module()) == [
      "mosaic_gpu_v2"
  ]  # one launch
