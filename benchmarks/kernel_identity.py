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


def _bf16(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


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
      "blockwise fp8": (_blockwise(), [_bf16(512, 512), _bf16(512, 512)]),
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
