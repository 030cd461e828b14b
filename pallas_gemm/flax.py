"""Flax dense layers whose bias and activation run in the GEMM kernel's epilogue.

`Linear` is an `nnx.Linear` and `Dense` a `linen.Dense`, with the same
constructor plus `activation=` ("relu", "gelu_tanh", "gelu_exact", "silu",
"sigmoid") and `implementation=`, and the same parameters (`kernel` of shape
(in, out), `bias` (out,)), so checkpoints interchange with Flax's layers.

For the GEMM alone, Flax's own layers take the kernel by injection:
`nnx.Linear(..., dot_general=pallas_gemm.dot_general)` or
`linen.Dense(..., dot_general=pallas_gemm.dot_general)`; Flax then adds the
bias itself, unfused.

Either way, set `dtype=jnp.bfloat16` (or float16). Flax promotes the inputs
and parameters to `dtype` before the GEMM; with the default `dtype=None` and
f32 parameters the operands are f32, which the kernel does not take: these
layers then run the XLA implementation, and `pallas_gemm.dot_general` falls
back to `lax.dot_general`.

>>> import jax, jax.numpy as jnp
>>> from flax import nnx
>>> layer = Linear(8, 4, activation="relu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
>>> layer(jnp.ones((2, 8))).shape
(2, 4)
"""

from __future__ import annotations

try:
  from flax import linen, nnx
except ImportError as e:  # flax is an optional dependency
  raise ImportError("pallas_gemm.flax needs flax: pip install 'pallas-gemm[flax]'") from e
import jax

from pallas_gemm import autodiff
from pallas_gemm.config import INPUT_DTYPES


class Linear(nnx.Linear):
  """`nnx.Linear` with the bias and an activation fused into the kernel's epilogue.

  Args:
    in_features, out_features, **kwargs: as `nnx.Linear` (`dot_general` is unused).
    activation: None or an activation name of `pallas_gemm.epilogue.ACTIVATIONS`.
    implementation: as `pallas_gemm.matmul`; None picks the kernel on a GPU, and
      XLA elsewhere or for operand dtypes the kernel does not take.
  """

  def __init__(self, in_features: int, out_features: int, *, activation: str | None = None,
               implementation: str | None = None, **kwargs):
    super().__init__(in_features, out_features, **kwargs)
    self.activation = activation
    self.implementation = implementation

  def __call__(self, inputs, out_sharding=None):
    bias = self.bias[...] if self.bias is not None else None
    inputs, kernel, bias = self.promote_dtype((inputs, self.kernel[...], bias), dtype=self.dtype)
    y = dense(inputs, kernel, bias, activation=self.activation,
              out_dtype=self.preferred_element_type, implementation=self.implementation)
    if out_sharding is not None:
      y = jax.sharding.reshard(y, out_sharding)
    return y


class Dense(linen.Dense):
  """`linen.Dense` with the bias and an activation fused into the kernel's epilogue.

  Attributes:
    activation: None or an activation name of `pallas_gemm.epilogue.ACTIVATIONS`.
    implementation: as for `Linear`.

  >>> import jax, jax.numpy as jnp
  >>> layer = Dense(4, activation="silu", dtype=jnp.bfloat16)
  >>> params = layer.init(jax.random.key(0), jnp.ones((2, 8)))
  >>> jax.tree.map(jnp.shape, params)
  {'params': {'bias': (4,), 'kernel': (8, 4)}}
  """

  activation: str | None = None
  implementation: str | None = None

  @linen.compact
  def __call__(self, inputs):
    kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features),
                        self.param_dtype)
    bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    return dense(inputs, kernel, bias, activation=self.activation,
                 implementation=self.implementation)


def dense(inputs, kernel, bias=None, *, activation=None, out_dtype=None, implementation=None):
  """`act(inputs @ kernel + bias)` over the last dim of `inputs`, as one kernel call.

  >>> import jax.numpy as jnp
  >>> dense(jnp.ones((3, 2), jnp.bfloat16), jnp.ones((2, 5), jnp.bfloat16)).shape
  (3, 5)
  """
  if implementation is None and (inputs.dtype.name not in INPUT_DTYPES
                                 or kernel.dtype != inputs.dtype):
    implementation = "xla"
  y = autodiff.matmul(inputs.reshape(-1, inputs.shape[-1]), kernel, bias=bias,
                      activation=activation, out_dtype=out_dtype, implementation=implementation)
  return y.reshape(*inputs.shape[:-1], kernel.shape[-1])
