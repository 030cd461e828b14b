"""Hopper GEMM for JAX, written with Pallas' Mosaic GPU backend.

>>> import jax.numpy as jnp
>>> from pallas_gemm import matmul, GemmConfig
>>> a = jnp.ones((128, 64), jnp.bfloat16); b = jnp.ones((64, 256), jnp.bfloat16)
>>> matmul(a, b, implementation="xla").shape
(128, 256)
"""

from importlib import metadata as _metadata

from pallas_gemm.autodiff import matmul
from pallas_gemm.tuner import autotune
from pallas_gemm.collective_matmul import all_gather_matmul, matmul_reduce_scatter
from pallas_gemm.blockwise import (
    blockwise_fp8_linear,
    blockwise_fp8_ragged_linear,
    blockwise_ragged_dot,
    blockwise_scaled_matmul,
    make_blockwise_fp8_dot_general,
    nn_scaled_matmul,
    quantize_blockwise,
)
from pallas_gemm.config import GemmConfig, GemmProblem
from pallas_gemm.cross_entropy import head_cross_entropy
from pallas_gemm.dot import dot_general, make_dot_general
from pallas_gemm.glu import gated_linear_unit, gated_mlp
from pallas_gemm.grouped import ragged_dot, ragged_weight_gradient
from pallas_gemm.int8 import int8_matmul, make_int8_dot_general, quantize_per_channel, quantize_per_token
from pallas_gemm.perceptron import mlp
from pallas_gemm.ragged_gemm import RaggedConfig
from pallas_gemm.scaled import fp8_linear, scaled_matmul
from pallas_gemm.split_outputs import matmul_split
from pallas_gemm.tuning_cache import lookup_config
from pallas_gemm.weight_only import (
    QuantizedWeight,
    block_weights,
    dequantize_weights,
    pack_fragments,
    quantize_weights,
    quantized_matmul,
)
from pallas_gemm.weight_only_grouped import quantized_ragged_dot

try:
  __version__ = _metadata.version("pallas-gemm")
except _metadata.PackageNotFoundError:  # run from a source tree that is not installed
  __version__ = "0+unknown"

__all__ = [
    "GemmConfig",
    "GemmProblem",
    "QuantizedWeight",
    "RaggedConfig",
    "all_gather_matmul",
    "autotune",
    "block_weights",
    "blockwise_fp8_linear",
    "blockwise_fp8_ragged_linear",
    "blockwise_ragged_dot",
    "blockwise_scaled_matmul",
    "dequantize_weights",
    "dot_general",
    "fp8_linear",
    "gated_linear_unit",
    "gated_mlp",
    "head_cross_entropy",
    "int8_matmul",
    "lookup_config",
    "make_blockwise_fp8_dot_general",
    "make_dot_general",
    "make_int8_dot_general",
    "matmul",
    "matmul_split",
    "matmul_reduce_scatter",
    "mlp",
    "nn_scaled_matmul",
    "pack_fragments",
    "quantize_blockwise",
    "quantize_per_channel",
    "quantize_per_token",
    "quantize_weights",
    "quantized_matmul",
    "quantized_ragged_dot",
    "ragged_dot",
    "ragged_weight_gradient",
    "scaled_matmul",
]


def __getattr__(name):
  """`pallas_gemm.flax` is imported on first use, so `import pallas_gemm` works without flax."""
  if name == "flax":
    import importlib

    return importlib.import_module("pallas_gemm.flax")
  raise AttributeError(f"module 'pallas_gemm' has no attribute {name!r}")
