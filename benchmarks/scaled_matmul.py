"""Scaled fp8 GEMM on the H100: correctness of `scaled_matmul`, then timing against XLA.

    python -m benchmarks.scaled_matmul [--skip-correctness] [--skip-timing]

Correctness: fresh N(0,1) fp8 inputs and uniform(0.5, 2) scales per case, the
output memory poisoned with NaN first (as `device_check`), the kernel run before
any reference, relative error vs a float64 numpy reference (an f32 GPU
reference above 2^31 flops) and the amax vs the reference's max |y|.

Timing (`benchmarks.matmul.run_cases`: CUPTI, interleaved rounds, median; every
kernel of a contender counted, e.g. XLA's dot + elementwise fusion + reduction,
our kernel + the max over its partial maxima), e4m3 8192^3 with A (M, K), B (N, K):
  scale            y = bf16(sa * sb * (a @ b)); targets ours/XLA >= 1.0
  bias_gelu_amax   y = bf16(gelu(sa * sb * (a @ b) + bias)), amax = max |y|; >= 1.1
  fp8out_amax      as bias_gelu_amax, y = e4m3(y * out_scale) (delayed scaling)
XLA contenders (the best of each family is reported): `lax.dot_general` of the
fp8 operands with preferred_element_type f32 or bf16, then the scales and the
rest as jnp ops (XLA fuses what it can); and the dequantize-then-dot pattern
XLA's GEMM rewriter turns into cuBLASLt's scaled fp8 GEMM.

Without a GPU it lowers every kernel for CUDA (jax.export) and runs the XLA
contenders at a small shape on the CPU (no timings).

>>> [c.label for c in timing_cases()][0]
'8192x8192x8192 float8_e4m3fn NT +scale'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import matmul as harness
from pallas_gemm import GemmConfig, scaled_matmul

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
BOUNDS = {"bfloat16": 8e-3, "float32": 5e-3, E4M3: 5e-2, E5M2: 1e-1}
"""Relative error bounds by output dtype (fp8 accumulation on Hopper: ~2e-3 at K=8192,
NOTES.md exp. 14; fp8 output rounding ~2^-4 e4m3, ~2^-3 e5m2)."""
AMAX_BOUND = 5e-3
TARGETS = {"scale": 1.0, "bias_gelu_amax": 1.1}


@dataclasses.dataclass(frozen=True)
class Check:
  name: str
  m: int
  n: int
  k: int
  out_dtype: str = "bfloat16"
  a_scale: str = "tensor"  # "tensor" or "row"
  b_scale: str = "tensor"  # "tensor" or "col"
  bias: bool = False
  bias_shift: float = 0.0
  activation: str | None = None
  out_scale: float | None = None
  amax: bool = False
  lead: tuple = ()
  a_dtype: str = E4M3
  b_dtype: str = E4M3
  transpose_b: bool = True
  config: GemmConfig | None = None


def checks() -> list[Check]:
  ping = GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, tile_k=128, stages=4)
  return [
      Check("per-tensor bf16 1000x1016x1024", 1000, 1016, 1024),
      Check(
          "row+col bias+gelu amax 1000x1016x1024",
          1000,
          1016,
          1024,
          a_scale="row",
          b_scale="col",
          bias=True,
          activation="gelu_tanh",
          amax=True,
      ),
      Check(
          "row+col e4m3 out_scale amax 1000x1016x1024",
          1000,
          1016,
          1024,
          E4M3,
          "row",
          "col",
          out_scale=4.0,
          amax=True,
      ),
      Check(
          "e5m2 e5m2-out amax 520x1000x1024",
          520,
          1000,
          1024,
          E5M2,
          a_dtype=E5M2,
          b_dtype=E5M2,
          out_scale=0.5,
          amax=True,
      ),
      Check(
          "batched f32 col amax 2x3x100x264x256",
          100,
          264,
          256,
          "float32",
          b_scale="col",
          amax=True,
          lead=(2, 3),
      ),
      Check(
          "B (K,N) row bias 1000x1016x1024",
          1000,
          1016,
          1024,
          a_scale="row",
          bias=True,
          transpose_b=False,
      ),
      # amax masking: N=136 leaves a ragged column tile whose padding would read sigmoid(0)=0.5.
      Check(
          "sigmoid amax masked N=136 200x136x256",
          200,
          136,
          256,
          bias=True,
          bias_shift=-8.0,
          activation="sigmoid",
          amax=True,
      ),
      Check("narrow N=64 amax 256x64x512", 256, 64, 512, amax=True, b_scale="col"),
      Check(
          "pingpong amax 1000x1016x1024",
          1000,
          1016,
          1024,
          bias=True,
          activation="relu",
          amax=True,
          config=ping,
      ),
      Check(
          "split-n cluster12 amax 1000x1016x1024",
          1000,
          1016,
          1024,
          b_scale="col",
          amax=True,
          config=GemmConfig(wg_split="n", cluster=(1, 2), tile_k=128, stages=3),
      ),
      Check("e4m3 x e5m2 amax 1000x1016x1024", 1000, 1016, 1024, b_dtype=E5M2, amax=True),
      # Fp8Linear(backward="e5m2"): dx = dy(e5m2) . W(e4m3), dW = x^T(e4m3) . dy^T(e5m2), f32 out.
      Check("e5m2 x e4m3 (dx-like) 1000x1016x1024", 1000, 1016, 1024, a_dtype=E5M2),
      Check("e4m3 x e5m2 f32 (dW-like) 1016x1024x1000", 1016, 1024, 1000, "float32", b_dtype=E5M2),
      Check(
          "8192^3 bias+gelu amax", 8192, 8192, 8192, bias=True, activation="gelu_tanh", amax=True
      ),
      Check(
          "8192^3 e4m3 out_scale amax",
          8192,
          8192,
          8192,
          E4M3,
          bias=True,
          activation="gelu_tanh",
          out_scale=8.0,
          amax=True,
      ),
  ]


def _inputs(check: Check, seed: int):
  keys = jax.random.split(jax.random.key(seed), 5)
  a = jax.random.normal(keys[0], (*check.lead, check.m, check.k), jnp.float32).astype(check.a_dtype)
  b_shape = (check.n, check.k) if check.transpose_b else (check.k, check.n)
  b = jax.random.normal(keys[1], b_shape, jnp.float32).astype(check.b_dtype)
  a_scale = jax.random.uniform(
      keys[2], (check.m,) if check.a_scale == "row" else (), minval=0.5, maxval=2.0
  )
  b_scale = jax.random.uniform(
      keys[3], (check.n,) if check.b_scale == "col" else (), minval=0.5, maxval=2.0
  )
  bias = (jax.random.normal(keys[4], (check.n,)) + check.bias_shift) if check.bias else None
  out_scale = None if check.out_scale is None else jnp.float32(check.out_scale)
  return a, b, a_scale, b_scale, bias, out_scale


def _fn(check: Check, implementation="pallas"):
  return jax.jit(
      lambda a, b, sa, sb, bias, so: scaled_matmul(
          a,
          b,
          sa,
          sb,
          out_dtype=check.out_dtype,
          bias=bias,
          activation=check.activation,
          out_scale=so,
          return_amax=check.amax,
          transpose_b=check.transpose_b,
          config=check.config,
          implementation=implementation,
      )
  )


def _reference(check: Check, a, b, a_scale, b_scale, bias):
  """float64 (f32 on the GPU for big shapes) y before output scaling."""
  if 2 * check.m * check.n * check.k > 2**31:
    f = jax.jit(
        lambda a, b: jax.lax.dot_general(
            a.astype(jnp.float32),
            b.astype(jnp.float32),
            (((a.ndim - 1,), (1 if check.transpose_b else 0,)), ((), ())),
            precision=jax.lax.Precision.HIGHEST,
        )
    )
    acc = np.asarray(f(a, b), np.float64)
  else:
    a64 = np.asarray(a.astype(jnp.float32), np.float64)
    b64 = np.asarray(b.astype(jnp.float32), np.float64)
    acc = a64 @ (b64.T if check.transpose_b else b64)
  sa, sb = np.asarray(a_scale, np.float64), np.asarray(b_scale, np.float64)
  y = acc * (sa[:, None] if sa.ndim else sa) * sb
  if bias is not None:
    y = y + np.asarray(bias, np.float64)
  if check.activation == "gelu_tanh":
    y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
  elif check.activation == "relu":
    y = np.maximum(y, 0)
  elif check.activation == "sigmoid":
    y = 1 / (1 + np.exp(-y))
  return y


def run_check(check: Check, seed: int, export_only: bool = False) -> dict:
  args = _inputs(check, seed)
  fn = _fn(check)
  if export_only:
    jax.export.export(fn, platforms=["cuda"])(*args)
    return dict(name=check.name, ok=True, exported=True)
  t0 = time.time()
  fn.lower(*args).compile()
  compile_s = time.time() - t0
  nbytes = 4 * check.m * check.n * int(np.prod(check.lead or (1,)))
  buf = jnp.full((nbytes // 4 + (1 << 18),), jnp.nan, jnp.float32)
  buf.block_until_ready()
  del buf
  out = fn(*args)
  out, amax = out if check.amax else (out, None)
  out = np.asarray(out.astype(jnp.float32), np.float64)
  y = _reference(check, *args[:5])
  ref = y
  if check.out_dtype.startswith("float8"):
    fp8_max = float(jnp.finfo(check.out_dtype).max)
    ref = np.clip(y * (check.out_scale or 1.0), -fp8_max, fp8_max)
  nan = int(np.isnan(out).sum())
  err = float(np.linalg.norm(np.nan_to_num(out - ref, nan=1e30)) / np.linalg.norm(ref))
  bound = BOUNDS[check.out_dtype]
  ok = nan == 0 and err <= bound and out.shape == ref.shape
  result = dict(name=check.name, rel_err=err, bound=bound, nan=nan, compile_s=round(compile_s, 2))
  if amax is not None:
    ref_amax = float(np.abs(y).max())
    amax_err = abs(float(amax) - ref_amax) / ref_amax
    result.update(amax=float(amax), ref_amax=ref_amax, amax_rel_err=amax_err)
    ok = ok and amax_err <= AMAX_BOUND
  return dict(result, ok=bool(ok))


def correctness(log, export_only=False) -> list[dict]:
  results = []
  for i, check in enumerate(checks()):
    if check.a_dtype != check.b_dtype:
      from pallas_gemm import _compat

      if not _compat.SUPPORTS_MIXED_FP8:
        log(f"SKIP {check.name}: mixed fp8 needs jax >= 0.11")
        continue
    try:
      r = run_check(check, seed=2000 + i, export_only=export_only)
    except Exception as e:  # reported, not fatal
      r = dict(name=check.name, ok=False, error=f"{type(e).__name__}: {e}"[:2000])
      traceback.print_exc()
    results.append(r)
    log(("PASS " if r["ok"] else "FAIL ") + json.dumps(r))
  return results


# -- timing --------------------------------------------------------------------------------
def timing_cases(shape=(8192, 8192, 8192)) -> list[harness.Case]:
  return [
      harness.Case(*shape, E4M3, "NT", epilogue=e)
      for e in ("scale", "bias_gelu_amax", "fp8out_amax")
  ]


SCALES = (jnp.float32(0.75), jnp.float32(1.25), jnp.float32(64.0))
"""a_scale, b_scale, out_scale of the timed cases (jit arguments, as in training)."""


def _epilogue_xla(case: harness.Case, acc, sa, sb, bias, so):
  """The epilogue as a user writes it in jnp, on an f32 or bf16 accumulator."""
  y = acc.astype(jnp.float32) * (sa * sb)
  if case.epilogue == "scale":
    return y.astype(jnp.bfloat16)
  y = jax.nn.gelu(y + bias, approximate=True)
  amax = jnp.max(jnp.abs(y))
  if case.epilogue == "fp8out_amax":
    return jnp.clip(y * so, -448.0, 448.0).astype(E4M3), amax
  return y.astype(jnp.bfloat16), amax


def xla_fns(case: harness.Case) -> dict:
  dims = (((1,), (1,)), ((), ()))

  def dot_then(preferred):
    return lambda a, b, bias, sa, sb, so: _epilogue_xla(
        case, jax.lax.dot_general(a, b, dims, preferred_element_type=preferred), sa, sb, bias, so
    )

  def dequantize_then_dot(a, b, bias, sa, sb, so):
    # The scaled-fp8 pattern of XLA's GEMM rewriter: convert, scale, dot.
    acc = jax.lax.dot_general(
        a.astype(jnp.bfloat16) * sa.astype(jnp.bfloat16),
        b.astype(jnp.bfloat16) * sb.astype(jnp.bfloat16),
        dims,
        preferred_element_type=jnp.float32,
    )
    return _epilogue_xla(case, acc, jnp.float32(1), jnp.float32(1), bias, so)

  fns = {
      "xla[dot-f32]": dot_then(jnp.float32),
      "xla[dot-bf16]": dot_then(jnp.bfloat16),
      "xla[dequant-dot]": dequantize_then_dot,
  }
  return {name: _bind(jax.jit(f)) for name, f in fns.items()}


def pallas_fns(case: harness.Case, implementation="pallas") -> dict:
  def make(config):
    def f(a, b, bias, sa, sb, so):
      fp8_out = case.epilogue == "fp8out_amax"
      return scaled_matmul(
          a,
          b,
          sa,
          sb,
          out_dtype=E4M3 if fp8_out else jnp.bfloat16,
          bias=None if case.epilogue == "scale" else bias,
          activation=None if case.epilogue == "scale" else "gelu_tanh",
          out_scale=so if fp8_out else None,
          return_amax=case.epilogue != "scale",
          config=config,
          implementation=implementation,
      )

    return _bind(jax.jit(f))

  fns = {"pallas_gemm": make(None)}
  if case.epilogue == "bias_gelu_amax":
    # bf16 out + bias + amax buffers leave 3 stages by default; 4 with narrower epilogue tiles:
    fns["pallas_best[s4-epi64x32]"] = make(
        GemmConfig(tile_k=128, stages=4, cluster=(2, 1), epilogue_tile=(64, 32))
    )
    fns["pallas_best[s3]"] = make(GemmConfig(tile_k=128, stages=3, cluster=(2, 1)))
  return fns


def _bind(fn):
  """fn(a, b, bias, sa, sb, so) -> the harness's fn(a, b, bias), the scales as jit arguments."""
  return lambda a, b, bias: fn(a, b, bias, *SCALES)


def timing(log) -> list[dict]:
  return harness.run_cases(
      timing_cases(),
      lambda case: {**pallas_fns(case), **xla_fns(case)},
      rounds=3,
      iterations=10,
      log=log,
  )


def target_lines(rows) -> list[str]:
  lines = []
  for case in timing_cases():
    got = {r["contender"]: r for r in rows if r["case"] == case.label and "error" not in r}
    if "pallas_gemm" not in got or "xla" not in got:
      continue
    ratio = got["xla"]["median_ms"] / got["pallas_gemm"]["median_ms"]
    best = min((r["median_ms"] for c, r in got.items() if c.startswith("pallas")))
    target = TARGETS.get(case.epilogue)
    verdict = (
        "" if target is None else (f"target >= {target}: {'met' if ratio >= target else 'NOT met'}")
    )
    lines.append(
        f"{case.epilogue:16s} default {ratio:.3f}x XLA (best config "
        f"{got['xla']['median_ms'] / best:.3f}x) {verdict}"
    )
  return lines


def dry_run(log) -> int:
  """No GPU: export every kernel for CUDA; run the XLA contenders small on the CPU."""
  log(
      "no GPU: lowering every case for CUDA (jax.export) and running the XLA contenders at "
      "256x512x256 on the CPU; no timings"
  )
  results = correctness(log, export_only=True)
  for case in timing_cases():
    a = jax.ShapeDtypeStruct((case.m, case.k), E4M3)
    b = jax.ShapeDtypeStruct((case.n, case.k), E4M3)
    bias = jax.ShapeDtypeStruct((case.n,), jnp.float32)
    for name, fn in pallas_fns(case).items():
      jax.export.export(jax.jit(fn), platforms=["cuda"])(a, b, bias)
      log(f"exported {case.label} {name}")
  for case in timing_cases((256, 512, 256)):
    a, b, bias = harness.make_inputs(case, seed=0)
    for name, fn in xla_fns(case).items():
      jax.block_until_ready(fn(a, b, bias))
      log(f"ran {case.label} {name} (XLA, CPU)")
  return 0 if all(r["ok"] for r in results) else 1


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--skip-correctness", action="store_true")
  parser.add_argument("--skip-timing", action="store_true")
  args = parser.parse_args(argv)
  out_dir = os.environ.get("OUT", "out")
  log = harness.file_logger("scaled_matmul.log")

  env = harness.environment()
  log(json.dumps(env))
  if env["platform"] != "gpu":
    return dry_run(log)
  results = dict(environment=env)
  if not args.skip_correctness:
    results["correctness"] = correctness(log)
  if not args.skip_timing:
    results["timing"] = timing(log)
  with open(os.path.join(out_dir, "scaled_matmul.json"), "w") as f:
    json.dump(results, f, indent=1)
  if "correctness" in results:
    bad = [r["name"] for r in results["correctness"] if not r["ok"]]
    log(
        f"correctness: {len(results['correctness']) - len(bad)}/{len(results['correctness'])} "
        "passed" + (f"; FAILED: {bad}" if bad else "")
    )
  if "timing" in results:
    log(f"{env['device']}, jax {env['jax']}, {env['method']}")
    log(harness.format_table(results["timing"], others=("xla",)))
    for line in target_lines(results["timing"]):
      log(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
