"""Quantized GEMMs against bf16 and XLA's own paths: weight-only int4/int8 and W8A8 int8.

    python -m benchmarks.quantized                   # GPU: decode and prefill shapes
    python -m benchmarks.quantized --cpu-smoke       # no GPU: tiny shapes, interpret/XLA, wall clock
    python -m benchmarks.quantized --part w8a8       # one part: weight_only, grouped or w8a8

Weight-only (`pallas_gemm.quantized_matmul`): x (M, K) bf16 times a (K, N) weight:
  bf16_dot       jnp.dot(x, w) on the bf16 weight
  int4_ours      int4, group 128 scales, `quantize_weights`' default layout (packed in WGMMA's
                 register order, `pack_fragments`) and route (the kernel, whatever M)
  int4_nk        the same on weights stored (N, K) (`block_weights(qw, 0)`)
  int4_smem      the same kernel with `dequant="smem"` (weights converted into SMEM)
  int4_warp      the same kernel with warp-level MMA (`mma="warp"`, experimental)
  int4_scalew    decode with the scales on the converted weights (`scale_on="weights"`:
                 one accumulator, the next step converted while this one's WGMMA runs)
  int4_4wg       decode with 4 consumer warpgroups of 64 weight rows (more warps to hide
                 the convert's latency; where its registers fit)
  int4_tile      decode as int4_scalew with 64 rows per warpgroup, no split-K and the kernel's
                 own (M, N) store: no XLA kernel after it (wide weights fill the SMs without
                 split-K)
  int4_r128      decode as before NOTES exp. 92: 128 weight rows per warpgroup, scales on
                 the product, split-K by the time model, f32 partials summed by XLA
  int4_tilep     decode with 64 rows per warpgroup, no split-K, the kernel's own store, the
                 group scales on each step's product (fewer multiplies than on the weights)
  int4_skw       decode by stream-K (experimental) with the scales on the weights, 64 rows
                 per warpgroup
  int4_skp       decode by stream-K (experimental) with the scales on the product, 128 rows
                 per warpgroup
  int4_kblock    the same on weights stored in K blocks (`block_weights`), the layout
                 before `pack_fragments` became quantize_weights' default
  int4_xla       int4 unpacked and dequantized by XLA, then XLA's GEMM (`implementation="xla"`)
  int4_kernel    the kernel whatever M (`implementation="pallas"`)
  int8_ours      int8, per-channel scales, the default route
  int8_r128      int8 decode as before NOTES exp. 92 (as int4_r128)
  int8_tilep     int8 decode as int4_tilep: per-channel scales applied as the kernel stores
  int8_skw       int8 decode by stream-K (experimental), as int4_skw
  int8_skp       int8 decode by stream-K (experimental), as int4_skp
  int8_kblock    int8 stored in K blocks (`block_weights`), the layout before
                 quantize_weights packed int8 too (NOTES exp. 94)
Grouped (`pallas_gemm.quantized_ragged_dot`): M routed rows over E experts' (K, N) weights:
  bf16_ragged    jax.lax.ragged_dot on the bf16 experts
  int4_xla       every expert dequantized by XLA, then jax.lax.ragged_dot
  int4_kernel    the weight-only kernel over one-expert token tiles (WGMMA), on the stack
                 as quantize_weights stores it (packed in WGMMA's register order on Hopper)
  int4_kblock    the same kernel on the stack in K blocks (the layout before NOTES exp. 97)
  int4_warp      the kernel with warp-level MMA (K blocks)
W8A8 (`pallas_gemm.int8_matmul`): per-token and per-channel scales, bf16 out:
  bf16_dot       jnp.dot on bf16 operands
  int8_ours      the dense kernel, s8 x s8 -> s32, scales in the epilogue
  int8_xla       XLA's integer dot (s8 x s8 -> s32) and the same scaling in XLA
Checks first: every contender against float64 of the dequantized operands (relative error).
Timing: CUPTI, contenders interleaved in rounds; each call cycles over copies of the
weights that total at least 4 L2s, so the weights come from HBM as in a model.
"HBM %" is the weight bytes (+ x and out) over the time, against the board's HBM bandwidth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.matmul import cupti_times_ms, environment
from pallas_gemm import _compat
from pallas_gemm import int8 as int8_lib
from pallas_gemm import weight_only as wo
from pallas_gemm import weight_only_grouped as wo_grouped

WEIGHTS = ((4096, 14336), (14336, 4096), (8192, 28672), (4096, 128256))
"""(K, N) weights of Llama-3 8B/70B projections and a 128k-vocabulary head."""
TOKENS = (1, 16, 64, 128, 256, 512, 2048, 4096)
W8A8_SHAPES = ((8192, 8192, 8192), (8192, 6144, 4096), (8192, 14336, 4096), (8192, 4096, 14336))
"""MxNxK: 8192^3 and Llama-3-8B's qkv, gate/up and down projections at 8k tokens."""
EXPERTS = ((8, 4096, 14336), (8, 14336, 4096))
"""(E, K, N): Mixtral-8x7B's expert up (gate) and down projections."""
ROUTED = (16, 64, 256, 1024)
"""Routed rows (tokens x top-k) of the grouped part."""
SMOKE = dict(
    weights=((256, 384),),
    tokens=(20,),
    w8a8=((72, 136, 256),),
    experts=((3, 256, 136),),
    routed=(40,),
)
L2_BYTES = 50 * 2**20


def _copies(nbytes: int) -> int:
  """Weight copies a timed call cycles through: at least 4 L2s in all."""
  return max(1, math.ceil(4 * L2_BYTES / nbytes))


def weight_only_contenders(implementation):
  kernel = "interpret" if implementation == "interpret" else None

  def variant(**fields):
    def run(x, qw):
      problem = wo.problem_of(x, qw)
      config = wo.default_config(problem, _compat.device_sm_count() or 132, dequant="smem")
      config = wo.deepest_ring(dataclasses.replace(config, **fields), problem)
      return wo.quantized_matmul(x, qw, config=config, implementation="pallas")

    return run

  def rows_128(x, qw):
    """Decode as the default was before exp. 92: 128 weight rows per warpgroup, scales
    on the product, split-K by the time model, f32 partials summed by XLA."""
    problem = wo.problem_of(x, qw)
    sms = _compat.device_sm_count() or 132
    config = wo.default_config(problem, sms)
    _, splits = wo.decode_split(problem, 128, config.tile_m, config.tile_k, sms)
    fields = dict(rows_per_wg=128, scale_on="product", output="partials", split_k=splits)
    config = wo.deepest_ring(dataclasses.replace(config, **fields), problem)
    return wo.quantized_matmul(x, qw, config=config, implementation="pallas")

  gpu_kernel = kernel is None
  tile_kernel = gpu_kernel and _compat.STORES_THROUGH_TRANSPOSED_SMEM  # the "tile" output
  streamed = dict(dequant="registers", output="tile", split_k=1, stream_k=True)
  tile_product = dict(
      dequant="registers", output="tile", split_k=1, rows_per_wg=64, scale_on="product"
  )
  warp = dict(
      dequant="registers", mma="warp", scale_on="weights", output="partials", stream_k=False
  )

  return {
      "bf16_dot": lambda x, w: jnp.dot(x, w),
      "int4_ours": lambda x, qw: wo.quantized_matmul(x, qw, implementation=kernel),
      "int4_nk": lambda x, qw: wo.quantized_matmul(x, qw, implementation=kernel),
      "int4_smem": variant() if gpu_kernel else None,
      "int4_warp": variant(**warp) if gpu_kernel and _compat.HAS_WARP_MMA else None,
      "int4_scalew": variant(dequant="registers", scale_on="weights") if gpu_kernel else None,
      "int4_4wg": variant(dequant="registers", consumers=4, rows_per_wg=64) if gpu_kernel else None,
      "int4_tile": (
          variant(
              dequant="registers",
              scale_on="weights",
              output="tile",
              split_k=1,
              rows_per_wg=64,
              stream_k=False,
          )
          if tile_kernel
          else None
      ),
      "int4_r128": rows_128 if gpu_kernel else None,
      "int4_tilep": variant(**tile_product) if tile_kernel else None,
      "int4_skw": variant(**streamed, scale_on="weights", rows_per_wg=64) if tile_kernel else None,
      "int4_skp": variant(**streamed, scale_on="product", rows_per_wg=128) if tile_kernel else None,
      "int4_kblock": lambda x, qw: wo.quantized_matmul(x, qw, implementation=kernel),
      "int4_xla": lambda x, qw: wo.quantized_matmul(x, qw, implementation="xla"),
      "int4_kernel": (
          (lambda x, qw: wo.quantized_matmul(x, qw, implementation="pallas"))
          if kernel is None
          else None
      ),
      "int8_ours": lambda x, qw: wo.quantized_matmul(x, qw, implementation=kernel),
      "int8_r128": rows_128 if gpu_kernel else None,
      "int8_tilep": variant(**tile_product) if tile_kernel else None,
      "int8_skw": variant(**streamed, scale_on="weights", rows_per_wg=64) if tile_kernel else None,
      "int8_skp": variant(**streamed, scale_on="product", rows_per_wg=128) if tile_kernel else None,
      "int8_kblock": lambda x, qw: wo.quantized_matmul(x, qw, implementation=kernel),
  }


def _rel_err(y, ref) -> float:
  y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
  return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def _cycled(fn):
  """fn over every input set in turn, as one jitted call (built once per contender, so
  that its check and every round run the same compiled program)."""
  return jax.jit(lambda *sets: [fn(*args) for args in sets])


def _timed(cycled, sets, rounds_samples, name, iterations, timer):
  """Appends one round's times of one call of fn (`_cycled(fn)` over `sets`)."""
  times = timer(cycled, sets, iterations)
  rounds_samples.setdefault(name, []).extend(t / len(sets) for t in times)


def run_weight_only(
    weights, tokens, *, implementation, rounds, iterations, timer, log=print, only=None
):
  rows = []
  contenders = {
      k: v
      for k, v in weight_only_contenders(implementation).items()
      if v is not None and (only is None or k in only or k == "bf16_dot")
  }
  rng = np.random.default_rng(0)
  for k, n in weights:
    w = jnp.asarray(rng.standard_normal((k, n), np.float32) / math.sqrt(k), jnp.bfloat16)
    q4 = wo.quantize_weights(w, bits=4, group_size=128)
    q8 = wo.quantize_weights(w, bits=8, group_size=-1)
    operands = {"bf16_dot": w}
    operands.update(
        {name: q8 for name in ("int8_ours", "int8_r128", "int8_tilep", "int8_skw", "int8_skp")}
    )
    operands["int8_kblock"] = wo.block_weights(q8) if q8.fragments else q8
    int4 = (
        "int4_ours",
        "int4_smem",
        "int4_warp",
        "int4_scalew",
        "int4_4wg",
        "int4_tile",
        "int4_r128",
        "int4_tilep",
        "int4_skw",
        "int4_skp",
        "int4_xla",
        "int4_kernel",
    )
    operands.update({name: q4 for name in int4}, int4_nk=wo.block_weights(q4, 0))
    # XLA's own route reads K blocks (from the packed layout it would gather every nibble)
    q4_blocks = wo.block_weights(q4)
    operands.update(int4_kblock=q4_blocks, int4_xla=q4_blocks)
    weight_bytes = {
        "bf16_dot": 2 * k * n,
        **{name: k * n for name in operands if name.startswith("int8")},
    }
    deq = {
        name: np.asarray(wo.dequantize_weights(q), np.float64)
        for name, q in (("int4", q4), ("int8", q8))
    }
    for m in tokens:
      x = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
      x64 = np.asarray(x.astype(jnp.float32), np.float64)
      case = f"{m}x{n}x{k}"
      samples = {}
      sets = {}
      refs = {}
      running = {}
      for name, fn in contenders.items():
        operand = operands[name]
        kind = "bf16" if name == "bf16_dot" else name[:4]
        if kind not in refs:
          refs[kind] = x64 @ (
              np.asarray(w.astype(jnp.float32), np.float64) if kind == "bf16" else deq[kind]
          )
        nbytes = weight_bytes.get(name, k * n // 2)
        copies = _copies(nbytes) if timer is cupti_times_ms else 1
        fresh = lambda: jax.tree.map(lambda a: jnp.array(a, copy=True), operand)
        sets[name] = [(x, operand)] + [(x, fresh()) for _ in range(copies - 1)]
        cycled = _cycled(fn)  # checked and timed as one compiled program
        try:
          y = cycled(*sets[name])[0]
        except ValueError as e:  # a variant whose config does not fit this case
          log(f"weight-only {case:20s} {name:10s} skipped: {str(e)[:100]}")
          continue
        running[name] = cycled
        err = _rel_err(y, refs[kind])
        log(f"weight-only {case:20s} {name:10s} rel. error vs float64 {err:.1e}")
        if err > 1e-2:
          raise SystemExit(f"{case} {name}: relative error {err:.1e}")
      for _ in range(rounds):
        for name in running:
          _timed(running[name], sets[name], samples, name, iterations, timer)
      for name, times in samples.items():
        med = statistics.median(times)
        moved = weight_bytes.get(name, k * n // 2) + 2 * m * (k + n)
        rows.append(
            dict(
                part="weight_only",
                case=case,
                m=m,
                n=n,
                k=k,
                contender=name,
                median_ms=med,
                gbps=moved / (med * 1e-3) / 1e9,
            )
        )
        log(f"weight-only {case:20s} {name:10s} {med * 1e3:9.1f} us {rows[-1]['gbps']:8.0f} GB/s")
  return rows


def _group_sizes(rng, m: int, experts: int):
  """m rows routed over the experts at random (some experts may get none)."""
  return jnp.asarray(rng.multinomial(m, np.full(experts, 1 / experts)), jnp.int32)


def run_grouped(experts_shapes, routed, *, implementation, rounds, iterations, timer, log=print):
  rows = []
  rng = np.random.default_rng(2)
  gpu = implementation is None

  def kernel(mma):
    def run(x, qw, sizes):
      problem = wo.problem_of(x, qw, experts=qw.shape[0])
      config = dataclasses.replace(
          wo_grouped.grouped_config(problem, _compat.device_sm_count() or 132), mma=mma
      )
      return wo_grouped.quantized_ragged_dot(x, qw, sizes, config=config, implementation="pallas")

    return run

  contenders = {
      "bf16_ragged": lambda x, w, sizes: jax.lax.ragged_dot(x, w, sizes),
      "int4_xla": lambda x, qw, sizes: wo_grouped.quantized_ragged_dot(
          x, qw, sizes, implementation="xla"
      ),
      "int4_kernel": (
          kernel("wgmma")
          if gpu
          else (
              lambda x, qw, sizes: wo_grouped.quantized_ragged_dot(
                  x, qw, sizes, implementation="interpret"
              )
          )
      ),
      "int4_kblock": kernel("wgmma") if gpu else None,
      "int4_warp": kernel("warp") if gpu and _compat.HAS_WARP_MMA else None,
  }
  contenders = {k: v for k, v in contenders.items() if v is not None}
  for e, k, n in experts_shapes:
    w = jnp.asarray(rng.standard_normal((e, k, n), np.float32) / math.sqrt(k), jnp.bfloat16)
    q4 = wo.quantize_weights(w, bits=4, group_size=128)
    q4_blocks = wo.block_weights(q4) if q4.fragments else q4
    operands = dict(bf16_ragged=w, int4_kernel=q4, int4_xla=q4_blocks)
    operands.update(int4_kblock=q4_blocks, int4_warp=q4_blocks)
    w64 = np.asarray(w.astype(jnp.float32), np.float64)
    d64 = np.asarray(wo.dequantize_weights(q4), np.float64)
    for m in routed:
      x = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
      sizes = _group_sizes(rng, m, e)
      x64 = np.asarray(x.astype(jnp.float32), np.float64)
      bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
      reference = lambda ws: np.concatenate(
          [x64[bounds[i] : bounds[i + 1]] @ ws[i] for i in range(e)]
      )
      refs = {True: reference(w64), False: reference(d64)}  # by "the operand is bf16"
      case = f"{m}x{e}x{n}x{k}"
      samples = {}
      cycled = {name: _cycled(fn) for name, fn in contenders.items()}
      args = {name: [(x, operands[name], sizes)] for name in contenders}
      for name in contenders:
        err = _rel_err(cycled[name](*args[name])[0], refs[operands[name] is w])
        log(f"grouped {case:20s} {name:11s} rel. error vs float64 {err:.1e}")
        if err > 1e-2:
          raise SystemExit(f"{case} {name}: relative error {err:.1e}")
      for _ in range(rounds):
        for name in contenders:
          _timed(cycled[name], args[name], samples, name, iterations, timer)
      for name, times in samples.items():
        med = statistics.median(times)
        rows.append(
            dict(part="grouped", case=case, m=m, n=n, k=k, experts=e, contender=name, median_ms=med)
        )
        log(f"grouped {case:20s} {name:11s} {med * 1e3:9.1f} us")
  return rows


def run_w8a8(shapes, *, implementation, rounds, iterations, timer, log=print):
  rows = []
  rng = np.random.default_rng(1)
  kernel = "interpret" if implementation == "interpret" else None
  contenders = {
      "bf16_dot": lambda x, w, xq, xs, wq, ws: jnp.dot(x, w),
      "int8_ours": lambda x, w, xq, xs, wq, ws: int8_lib.int8_matmul(
          xq, wq, xs, ws, implementation=kernel
      ),
      "int8_xla": lambda x, w, xq, xs, wq, ws: int8_lib.int8_matmul(
          xq, wq, xs, ws, implementation="xla"
      ),
  }
  for m, n, k in shapes:
    x = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, n), np.float32) / math.sqrt(k), jnp.bfloat16)
    xq, xs = int8_lib.quantize_per_token(x)
    wq, ws = int8_lib.quantize_per_channel(w)
    args = (x, w, xq, xs, wq, ws)
    ref_q = (np.asarray(xq, np.float64) * np.asarray(xs, np.float64)[:, None]) @ (
        np.asarray(wq, np.float64) * np.asarray(ws, np.float64)[:, None]
    ).T
    ref_bf16 = np.asarray(x.astype(jnp.float32), np.float64) @ np.asarray(
        w.astype(jnp.float32), np.float64
    )
    case = f"{m}x{n}x{k}"
    samples = {}
    cycled = {name: _cycled(fn) for name, fn in contenders.items()}
    for name in contenders:
      err = _rel_err(cycled[name](args)[0], ref_bf16 if name == "bf16_dot" else ref_q)
      log(f"w8a8 {case:20s} {name:10s} rel. error vs float64 {err:.1e}")
      if err > 1e-2:
        raise SystemExit(f"{case} {name}: relative error {err:.1e}")
    for _ in range(rounds):
      for name in contenders:
        _timed(cycled[name], [args], samples, name, iterations, timer)
    for name, times in samples.items():
      med = statistics.median(times)
      rows.append(
          dict(
              part="w8a8",
              case=case,
              m=m,
              n=n,
              k=k,
              contender=name,
              median_ms=med,
              tops=2 * m * n * k / (med * 1e-3) / 1e12,
          )
      )
      log(f"w8a8 {case:20s} {name:10s} {med:9.3f} ms {rows[-1]['tops']:7.1f} TOP/s")
  return rows


def _by_case(rows, names):
  """(case, {contender: row}, its "us" cells in `names`' order) per case, in row order."""
  by_case = {}
  for r in rows:
    by_case.setdefault(r["case"], {})[r["contender"]] = r
  for case, c in by_case.items():
    yield case, c, " | ".join(f"{c[n]['median_ms'] * 1e3:.1f}" if n in c else "-" for n in names)


def format_tables(rows, hbm_gbps) -> str:
  lines = []
  wo_rows = [r for r in rows if r["part"] == "weight_only"]
  if wo_rows:
    names = list(dict.fromkeys(r["contender"] for r in wo_rows))
    lines += [
        "| MxNxK | "
        + " | ".join(f"{n} us" for n in names)
        + " | bf16 / int4_ours | bf16 / int8_ours | int4_ours HBM % |",
        "|---" * (4 + len(names)) + "|",
    ]
    for case, c, cells in _by_case(wo_rows, names):
      ratio = lambda n: (f"{c['bf16_dot']['median_ms'] / c[n]['median_ms']:.2f}" if n in c else "-")
      roof = (
          f"{100 * c['int4_ours']['gbps'] / hbm_gbps:.0f}" if hbm_gbps and "int4_ours" in c else "-"
      )
      lines.append(f"| {case} | {cells} | {ratio('int4_ours')} | {ratio('int8_ours')} | {roof} |")
  grouped = [r for r in rows if r["part"] == "grouped"]
  if grouped:
    names = list(dict.fromkeys(r["contender"] for r in grouped))
    lines += [
        "",
        "| rows x E x N x K | " + " | ".join(f"{n} us" for n in names) + " | bf16 / best int4 |",
        "|---" * (2 + len(names)) + "|",
    ]
    for case, c, cells in _by_case(grouped, names):
      best = min(v["median_ms"] for n, v in c.items() if n.startswith("int4"))
      lines.append(f"| {case} | {cells} | {c['bf16_ragged']['median_ms'] / best:.2f} |")
  w8 = [r for r in rows if r["part"] == "w8a8"]
  if w8:
    lines += [
        "",
        "| MxNxK | bf16_dot ms | int8_ours ms (TOP/s) | int8_xla ms | bf16 / ours | xla / ours |",
        "|---|---|---|---|---|---|",
    ]
    for case, c, _ in _by_case(w8, ()):
      b, o, x = (c[n]["median_ms"] for n in ("bf16_dot", "int8_ours", "int8_xla"))
      lines.append(
          f"| {case} | {b:.3f} | {o:.3f} ({c['int8_ours']['tops']:.0f}) | {x:.3f} | {b / o:.2f} | {x / o:.2f} |"
      )
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--part", choices=("all", "weight_only", "grouped", "w8a8"), default="all")
  parser.add_argument("--tokens", default=None, help=f"M list for weight-only (default {TOKENS})")
  parser.add_argument("--weights", default=None, help="KxN list of weight-only weights")
  parser.add_argument("--experts", default=None, help="ExKxN list for the grouped part")
  parser.add_argument("--routed", default=None, help=f"routed rows list (default {ROUTED})")
  parser.add_argument("--w8a8-shapes", default=None, help="MxNxK list for W8A8")
  parser.add_argument(
      "--contenders", default=None, help="weight-only contenders to run (bf16_dot always runs)"
  )
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument(
      "--cpu-smoke",
      action="store_true",
      help="no GPU: tiny shapes, interpret mode and XLA, wall clock",
  )
  parser.add_argument("--out", default=None, help="folder for quantized.json")
  args = parser.parse_args(argv)
  gpu = jax.default_backend() == "gpu"
  if args.cpu_smoke or not gpu:
    print("no GPU (or --cpu-smoke): tiny shapes, kernels in interpret mode, wall clock")
    from benchmarks.train_step import wall_times_ms as timer

    implementation, weights, tokens, w8a8 = (
        "interpret",
        SMOKE["weights"],
        SMOKE["tokens"],
        SMOKE["w8a8"],
    )
    experts, routed = SMOKE["experts"], SMOKE["routed"]
  else:
    implementation, timer, weights, w8a8 = None, cupti_times_ms, WEIGHTS, W8A8_SHAPES
    tokens, experts, routed = TOKENS, EXPERTS, ROUTED
  shapes = lambda text: tuple(tuple(int(v) for v in item.split("x")) for item in text.split(","))
  numbers = lambda text: tuple(int(v) for v in text.split(","))
  weights = shapes(args.weights) if args.weights else weights
  w8a8 = shapes(args.w8a8_shapes) if args.w8a8_shapes else w8a8
  experts = shapes(args.experts) if args.experts else experts
  routed = numbers(args.routed) if args.routed else routed
  tokens = numbers(args.tokens) if args.tokens else tokens
  env = environment()
  print(json.dumps(env))
  timing = dict(
      implementation=implementation, rounds=args.rounds, iterations=args.iterations, timer=timer
  )
  rows = []
  if args.part in ("all", "weight_only"):
    only = None if args.contenders is None else set(args.contenders.split(","))
    rows += run_weight_only(weights, tokens, only=only, **timing)
  if args.part in ("all", "grouped"):
    rows += run_grouped(experts, routed, **timing)
  if args.part in ("all", "w8a8"):
    rows += run_w8a8(w8a8, **timing)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quantized.json"), "w") as f:
      json.dump(dict(environment=env, rows=rows), f, indent=1)
  hbm = _compat.hbm_scale() * 3.35e3 if gpu else None
  print(format_tables(rows, hbm))
  return 0


if __name__ == "__main__":
  sys.exit(main())
