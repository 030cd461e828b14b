"""Fingerprints of the dense kernel's variants, to show a refactor changed no kernel (CPU).

    python -m benchmarks.kernel_identity > before.txt   # on the old code
    python -m benchmarks.kernel_identity > after.txt    # on the new code
    diff before.txt after.txt                           # empty: the same kernels

Each line is a variant's name and a hash of `jax.make_jaxpr` of the call, which prints the
kernel body's jaxpr (WGMMA, barriers, copies) without source lines; Mosaic lowers that
deterministically. Object addresses and `kernel_cache`'s key (a hash of the package's
source) are masked. NOTES exp. 73.
"""

from __future__ import annotations

import hashlib
import re
import sys

import jax
import jax.numpy as jnp

import pallas_gemm
from pallas_gemm import GemmConfig, matmul
from pallas_gemm.epilogue import with_operands


def _bf16(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


def _f32(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


_USER_EPILOGUE = with_operands(
    lambda pre, r, bias, s: pre * s + r * bias, "residual", "bias", "scalar"
)


def _mx(x, w):
  """MXFP8 operands of x (M, K) and w (N, K) in `jax.nn.scaled_matmul`'s (1, rows, K) form."""
  quantize = lambda v: pallas_gemm.quantize_blockwise(v, (1, 32), power_of_two=True)
  (xq, xs), (wq, ws) = quantize(x), quantize(w)
  return xq[None], wq[None], xs[None], ws[None]


def _blockwise(config=None):
  def f(x, w):
    xq, xs = pallas_gemm.quantize_blockwise(x)
    wq, ws = pallas_gemm.quantize_blockwise(w, block=(128, 128))
    return pallas_gemm.blockwise_scaled_matmul(
        xq, wq, xs, ws, implementation="pallas", config=config
    )

  return f


def variants():
  """{name: (function, abstract arguments)} of the kernel's main code paths."""
  mm = lambda **kw: lambda a, b, *bias: matmul(
      a, b, bias=bias[0] if bias else None, implementation="pallas", **kw
  )
  pingpong = GemmConfig(tile_m=64, tile_n=128, schedule="pingpong")
  bias = jax.ShapeDtypeStruct((512,), jnp.float32)
  return {
      "NN bias gelu": (mm(activation="gelu_tanh"), [_bf16(512, 256), _bf16(256, 512), bias]),
      "NT": (mm(transpose_b=True), [_bf16(512, 256), _bf16(512, 256)]),
      "pingpong": (mm(config=pingpong), [_bf16(512, 256), _bf16(256, 512)]),
      "stream-K": (mm(config=GemmConfig(stream_k=True)), [_bf16(512, 256), _bf16(256, 512)]),
      "cluster 1x2 split n": (
          mm(config=GemmConfig(cluster=(1, 2), wg_split="n")),
          [_bf16(512, 256), _bf16(256, 512)],
      ),
      "TN split n": (
          mm(transpose_a=True, config=GemmConfig(wg_split="n")),
          [_bf16(256, 512), _bf16(256, 512)],
      ),
      "gated unit": (
          lambda x, g, u: pallas_gemm.gated_linear_unit(
              x, g, u, activation="silu", implementation="pallas"
          ),
          [_bf16(512, 256), _bf16(256, 512), _bf16(256, 512)],
      ),
      "row bias residual clamp": (
          lambda a, b, r, rb: matmul(
              a, b, residual=r, row_bias=rb, clamp=(-1.0, 1.0), implementation="pallas"
          ),
          [_bf16(512, 256), _bf16(256, 512), _bf16(512, 512), _f32(512)],
      ),
      "c beta, batch folded": (
          lambda a, b, c, rb: matmul(a, b, c=c, beta=0.5, row_bias=rb, implementation="pallas"),
          [_bf16(2, 256, 256), _bf16(256, 512), _bf16(2, 256, 512), _f32(256)],
      ),
      "user epilogue operands": (
          lambda a, b, r, bias, s: matmul(
              a,
              b,
              residual=r,
              bias=bias,
              scalar=s,
              activation=_USER_EPILOGUE,
              implementation="pallas",
          ),
          [_bf16(512, 256), _bf16(256, 512), _bf16(512, 512), bias, _f32()],
      ),
      "fp8 row/col scales amax": (
          lambda a, b, sa, sb: pallas_gemm.scaled_matmul(
              a.astype(jnp.float8_e4m3fn),
              b.astype(jnp.float8_e4m3fn),
              sa,
              sb,
              out_dtype=jnp.float8_e4m3fn,
              return_amax=True,
              implementation="pallas",
          ),
          [_bf16(512, 256), _bf16(512, 256), _f32(512), _f32(512)],
      ),
      "blockwise fp8": (_blockwise(), [_bf16(512, 512), _bf16(512, 512)]),
      "mxfp8 32-blocks": (
          lambda x, w: pallas_gemm.nn_scaled_matmul(
              *_mx(x, w), jnp.bfloat16, implementation="pallas"
          ),
          [_bf16(512, 512), _bf16(512, 512)],
      ),
      "blockwise fp8 pingpong": (
          _blockwise(GemmConfig(tile_m=64, tile_n=128, tile_k=128, schedule="pingpong")),
          [_bf16(512, 512), _bf16(512, 512)],
      ),
  }


def fingerprint(fn, args) -> str:
  """A hash of `fn`'s jaxpr on `args`, addresses and kernel-cache keys masked."""
  text = str(jax.make_jaxpr(fn)(*args))
  text = re.sub(r"0x[0-9a-f]+", "0x", re.sub(r"key=[0-9a-f]+", "key=", text))
  return f"{hashlib.sha256(text.encode()).hexdigest()[:16]} ({len(text)} chars)"


def main() -> int:
  for name, (fn, args) in variants().items():
    print(f"{name:24s} {fingerprint(fn, args)}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
