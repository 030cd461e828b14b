"""Flax dense layers whose bias and activation run in the GEMM kernel's epilogue.

`Linear` is an `nnx.Linear` and `Dense` a `linen.Dense`, with the same
constructor plus `activation=` ("relu", "gelu_tanh", "gelu_exact", "silu",
"sigmoid", or any elementwise function) and `implementation=`, and the same parameters (`kernel` of shape
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

`MLP` is two `Linear` layers (`up` with the activation, `down`) run as one
`pallas_gemm.mlp`, whose backward fuses the activation's derivative into a GEMM.
`GatedMLP` is a Llama MLP (`gate_proj`, `up_proj`, `down_proj`), its gate and up
projections one `pallas_gemm.gated_linear_unit`.

`ColumnParallelLinear` and `RowParallelLinear` are `Linear` layers for tensor parallelism
over one mesh axis (Megatron's pair, with sequence-parallel activations): the first gathers
its input rows inside the GEMM (`pallas_gemm.all_gather_matmul`), the second
reduce-scatters its output rows (`pallas_gemm.matmul_reduce_scatter`).

`Fp8Linear` is the fp8 counterpart of `Linear` (same parameters), with
delayed scaling state as non-parameter variables (`Fp8Meta`). `QuantizedLinear`
is an inference layer with int4/int8 weights quantized at load time
(`QuantizedLinear.from_linear`); W8A8 int8 plugs into Flax's layers as
`dot_general=pallas_gemm.make_int8_dot_general()`.
"""

from __future__ import annotations

try:
  from flax import linen, nnx
except ImportError as e:  # flax is an optional dependency
  raise ImportError("pallas_gemm.flax needs flax: pip install 'pallas-gemm[flax]'") from e

import jax
import jax.numpy as jnp

from pallas_gemm import autodiff
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import fp8
from pallas_gemm import lowering_pool
from pallas_gemm import weight_only
from pallas_gemm.config import INPUT_DTYPES
from pallas_gemm.blockwise import blockwise_fp8_linear
from pallas_gemm.cross_entropy import head_cross_entropy
from pallas_gemm.split_outputs import matmul_split
from pallas_gemm.collective_matmul import all_gather_matmul, matmul_reduce_scatter
from pallas_gemm.glu import gated_mlp
from pallas_gemm.perceptron import mlp
from pallas_gemm.scaled import BACKWARDS, fp8_linear


def _linear_operands(layer: nnx.Linear, inputs):
  """(inputs, kernel, bias or None) of an `nnx.Linear` promoted to its dtype, as its own
  call does."""
  bias = layer.bias[...] if layer.bias is not None else None
  return layer.promote_dtype((inputs, layer.kernel[...], bias), dtype=layer.dtype)


class Linear(nnx.Linear):
  """`nnx.Linear` with the bias and an activation fused into the kernel's epilogue.

  Args:
    in_features, out_features, **kwargs: as `nnx.Linear` (`dot_general` is unused).
    activation: as `pallas_gemm.matmul` (a name, a jax.nn / flax.nnx function, or any
      other elementwise function, traced into the kernel; checked here, not at the
      first call).
    implementation: as `pallas_gemm.matmul`; None picks the kernel on a GPU, and
      XLA elsewhere or for operand dtypes the kernel does not take.
  """

  def __init__(
      self,
      in_features: int,
      out_features: int,
      *,
      activation: str | None = None,
      implementation: str | None = None,
      **kwargs,
  ):
    activation = epilogue_lib.activation_name(activation, custom=True)
    super().__init__(in_features, out_features, **kwargs)
    self.activation = activation
    self.implementation = implementation
    lowering_pool.start(implementation)  # workers ready when the model is traced

  def __call__(self, inputs, out_sharding=None, *, residual=None, scalar=None):
    """`act(inputs @ kernel + bias) + residual`; `residual` (inputs' leading dims,
    out_features), added in the kernel's epilogue (e.g. a transformer block's skip);
    `scalar`, for an activation `with_operands(fn, ..., "scalar")` (a learned
    temperature, say: pass an `nnx.Param`'s value)."""
    inputs, kernel, bias = _linear_operands(self, inputs)
    y = dense(
        inputs,
        kernel,
        bias,
        activation=self.activation,
        residual=residual,
        out_dtype=self.preferred_element_type,
        implementation=self.implementation,
        scalar=scalar,
    )
    if out_sharding is not None:
      y = jax.sharding.reshard(y, out_sharding)
    return y

  def split(self, inputs, sizes):
    """This layer's output `inputs @ kernel + bias` as arrays of widths `sizes` (summing to
    out_features), each stored apart by the kernel (`pallas_gemm.matmul_split`: an
    attention's q, k and v without the copies `jnp.split` makes; no activation)."""
    if self.activation is not None:
      raise ValueError(f"split: activation must be None, not {self.activation}")
    inputs, kernel, bias = _linear_operands(self, inputs)
    return matmul_split(inputs, kernel, sizes, bias=bias, implementation=self.implementation)

  def cross_entropy(self, inputs, labels):
    """Per-token cross-entropy (f32, `labels`' shape) of this layer's logits
    `inputs @ kernel + bias` against integer `labels`: a language model's head and its
    loss in one kernel (`pallas_gemm.head_cross_entropy`; no activation)."""
    if self.activation is not None:
      raise ValueError(
          f"cross_entropy reads logits: activation must be None, not {self.activation}"
      )
    inputs, kernel, bias = _linear_operands(self, inputs)
    return head_cross_entropy(inputs, kernel, labels, bias=bias, implementation=self.implementation)


class _TensorParallelLinear(Linear):
  """A `Linear` whose GEMM runs with its collective over mesh axis `axis_name`."""

  _collective: staticmethod  # all_gather_matmul or matmul_reduce_scatter
  _specs: staticmethod  # axis -> (kernel, bias) partitions, for kernel_/bias_metadata

  def __init__(self, in_features, out_features, *, axis_name: str, schedule="bulk", **kwargs):
    kernel_spec, bias_spec = self._specs(axis_name)
    kwargs.setdefault("kernel_metadata", {"out_sharding": kernel_spec})
    kwargs.setdefault("bias_metadata", {"out_sharding": bias_spec})
    super().__init__(in_features, out_features, **kwargs)
    self.axis_name, self.schedule = axis_name, schedule

  def __call__(self, inputs):
    """The layer on `inputs` (..., in_features); the leading dims are flattened into the
    GEMM's rows (they must flatten without a reshard: shard the leading one)."""
    inputs, kernel, bias = _linear_operands(self, inputs)
    lead = inputs.shape[:-1]
    y = self._collective(
        inputs.reshape(-1, inputs.shape[-1]),
        kernel,
        bias,
        axis_name=self.axis_name,
        activation=self.activation,
        out_dtype=self.preferred_element_type,
        implementation=self.implementation,
        schedule=self.schedule,
    )
    return y.reshape(*lead, y.shape[-1])


class ColumnParallelLinear(_TensorParallelLinear):
  """A column-parallel `Linear`: kernel columns and bias sharded over `axis_name`; the
  input's rows (tokens) arrive sharded over it and are gathered inside the GEMM
  (`pallas_gemm.all_gather_matmul`, `schedule` as there); the output's columns stay
  sharded. Construct it under `jax.set_mesh` of a mesh with that (Explicit) axis.

  >>> import jax, jax.numpy as jnp
  >>> from flax import nnx
  >>> mesh = jax.make_mesh((1,), ("tp",), axis_types=(jax.sharding.AxisType.Explicit,))
  >>> with jax.set_mesh(mesh):
  ...   layer = ColumnParallelLinear(8, 4, axis_name="tp", rngs=nnx.Rngs(0))
  ...   y = layer(jax.device_put(jnp.ones((2, 8)), jax.P("tp", None)))
  >>> y.shape, tuple(layer.kernel.get_metadata()["out_sharding"])
  ((2, 4), (None, 'tp'))
  """

  _specs = staticmethod(lambda axis: ((None, axis), (axis,)))
  _collective = staticmethod(all_gather_matmul)


class RowParallelLinear(_TensorParallelLinear):
  """A row-parallel `Linear`: kernel rows sharded over `axis_name`, bias replicated; the
  input's features arrive sharded over it (a `ColumnParallelLinear`'s output) and the
  partial products are reduce-scattered over the output's rows
  (`pallas_gemm.matmul_reduce_scatter`): the output's rows (tokens) end up sharded."""

  _specs = staticmethod(lambda axis: ((axis, None), (None,)))
  _collective = staticmethod(matmul_reduce_scatter)


class MLP(nnx.Module):
  """`down(act(up(x))) + residual` as one `pallas_gemm.mlp`: the activation's backward
  runs in the epilogue of the GEMM that makes the hidden cotangent.

  Parameters are two `Linear` layers named `up` (in -> hidden, with the activation)
  and `down` (hidden -> out), each with `kernel` and `bias` as `nnx.Linear`'s.

  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> block = MLP(8, 32, activation="gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  >>> block(jnp.ones((2, 8))).shape, block.up.kernel.shape, block.down.kernel.shape
  ((2, 8), (8, 32), (32, 8))
  """

  def __init__(
      self,
      in_features: int,
      hidden_features: int,
      out_features: int | None = None,
      *,
      activation="gelu",
      implementation: str | None = None,
      **kwargs,
  ):
    if epilogue_lib.activation_name(activation) is None:
      raise ValueError("activation must not be None (use one Linear for a linear map)")
    out_features = in_features if out_features is None else out_features
    self.up = Linear(
        in_features, hidden_features, activation=activation, implementation=implementation, **kwargs
    )
    self.down = Linear(hidden_features, out_features, implementation=implementation, **kwargs)

  def __call__(self, inputs, *, residual=None):
    return mlp_of(self.up, self.down, inputs, residual=residual)


def mlp_of(up: Linear, down: Linear, inputs, *, residual=None):
  """`down(up(inputs)) + residual` for two `Linear` layers (`up` with an activation),
  as one `pallas_gemm.mlp`: what `MLP` runs, for models that keep their own layers."""
  b_in = up.bias[...] if up.bias is not None else None
  b_out = down.bias[...] if down.bias is not None else None
  inputs, w_in, b_in = up.promote_dtype((inputs, up.kernel[...], b_in), dtype=up.dtype)
  _, w_out, b_out = down.promote_dtype((inputs, down.kernel[...], b_out), dtype=down.dtype)
  return mlp(
      inputs,
      w_in,
      w_out,
      b_in=b_in,
      b_out=b_out,
      activation=up.activation,
      residual=residual,
      implementation=up.implementation,
  )


class GatedMLP(nnx.Module):
  """`down_proj(act(gate_proj(x)) * up_proj(x)) + residual` (SwiGLU with "silu", GeGLU
  with "gelu") as one `pallas_gemm.glu.gated_mlp`: the gate and up projections in one
  GEMM (x read once, the two projections never written) and the residual in the down
  projection's epilogue.

  Parameters are three `Linear` layers named as in Hugging Face's Llama ports
  (`gate_proj`, `up_proj`: in -> hidden; `down_proj`: hidden -> out), each with a
  `kernel` of shape (in, out) and, with `use_bias=True`, a `bias`.

  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> block = GatedMLP(8, 32, use_bias=False, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  >>> block(jnp.ones((2, 8))).shape, block.gate_proj.kernel.shape, block.down_proj.kernel.shape
  ((2, 8), (8, 32), (32, 8))
  """

  def __init__(
      self,
      in_features: int,
      hidden_features: int,
      out_features: int | None = None,
      *,
      activation="silu",
      implementation: str | None = None,
      **kwargs,
  ):
    self.activation = epilogue_lib.activation_name(activation)
    out_features = in_features if out_features is None else out_features
    layer = lambda din, dout: Linear(din, dout, implementation=implementation, **kwargs)
    self.gate_proj = layer(in_features, hidden_features)
    self.up_proj = layer(in_features, hidden_features)
    self.down_proj = layer(hidden_features, out_features)

  def __call__(self, inputs, *, residual=None):
    return gated_mlp_of(
        self.gate_proj,
        self.up_proj,
        self.down_proj,
        inputs,
        residual=residual,
        activation=self.activation,
    )


def gated_mlp_of(
    gate: Linear, up: Linear, down: Linear, inputs, *, residual=None, activation="silu"
):
  """`down(act(gate(inputs)) * up(inputs)) + residual` for three `Linear` layers as one
  `pallas_gemm.glu.gated_mlp` (gate and up in one GEMM, the residual in the down
  projection's epilogue): what `GatedMLP` runs, for models that keep
  their own layers (their `activation`s are not used: pass the gate's here)."""
  bias = lambda layer: layer.bias[...] if layer.bias is not None else None
  inputs, w_gate, w_up, w_down = gate.promote_dtype(
      (inputs, gate.kernel[...], up.kernel[...], down.kernel[...]), dtype=gate.dtype
  )
  return gated_mlp(
      inputs,
      w_gate,
      w_up,
      w_down,
      activation=activation,
      bias_gate=bias(gate),
      bias_up=bias(up),
      bias_down=bias(down),
      residual=residual,
      implementation=gate.implementation,
  )


class BlockwiseFp8Linear(nnx.Linear):
  """`nnx.Linear` whose forward and backward GEMMs run in blockwise-scaled fp8 (the
  DeepSeek-V3 recipe, `pallas_gemm.blockwise.blockwise_fp8_linear`): activations and
  gradients quantized per 1 x 128 block, the kernel per 128 x 128 block, inside the
  layer; no scaling state. Same parameters as `nnx.Linear`.

  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> layer = BlockwiseFp8Linear(256, 128, dtype=jnp.bfloat16, implementation="xla",
  ...                            rngs=nnx.Rngs(0))
  >>> layer(jnp.ones((2, 256))).shape, layer.kernel.shape
  ((2, 128), (256, 128))
  """

  def __init__(
      self,
      in_features: int,
      out_features: int,
      *,
      fp8_dtype=jnp.float8_e4m3fn,
      implementation: str | None = None,
      **kwargs,
  ):
    if jnp.dtype(fp8_dtype).name not in ("float8_e4m3fn", "float8_e5m2"):
      raise TypeError(f"fp8_dtype must be float8_e4m3fn or float8_e5m2, got {fp8_dtype}")
    super().__init__(in_features, out_features, **kwargs)
    self.fp8_dtype = jnp.dtype(fp8_dtype).name
    self.implementation = implementation
    lowering_pool.start(implementation)

  def __call__(self, inputs, out_sharding=None):
    inputs, kernel, bias = _linear_operands(self, inputs)
    y = blockwise_fp8_linear(
        inputs, kernel, bias, dtype=self.fp8_dtype, implementation=self.implementation
    )
    if out_sharding is not None:
      y = jax.sharding.reshard(y, out_sharding)
    return y


class QuantizedLinear(nnx.Module):
  """An inference `Linear` whose weight is stored quantized (int4 or int8 with group scales)
  and multiplied by `pallas_gemm.quantized_matmul`; made once, at load time, from a
  trained layer's kernel (`from_linear`) or a (K, N) array. Not trainable.

  The variables are `values` (in `quantize_weights`' layout: on a Hopper GPU int4
  packed in WGMMA's register order (K / 64, N / 64, 4, 128) int32 where 64 divides N
  and K, else K blocks (K / 128, N, 128) where 128 divides K, else (N, K)), `scales`
  (and `zeros` when asymmetric) as `nnx.Variable`s, and `bias` (N,) or None.

  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> dense = nnx.Linear(256, 128, rngs=nnx.Rngs(0))
  >>> layer = QuantizedLinear.from_linear(dense, bits=4, group_size=128, implementation="xla")
  >>> layer(jnp.ones((2, 256), jnp.bfloat16)).shape, layer.values.shape[-1]
  ((2, 128), 128)
  """

  def __init__(
      self,
      kernel,
      bias=None,
      *,
      bits: int = 4,
      group_size: int = 128,
      symmetric: bool = True,
      dtype=jnp.bfloat16,
      activation=None,
      implementation: str | None = None,
  ):
    if jnp.dtype(dtype).name not in INPUT_DTYPES:
      raise TypeError(f"dtype must be one of {INPUT_DTYPES}, got {jnp.dtype(dtype)}")
    self.activation = epilogue_lib.activation_name(activation)
    qw = weight_only.quantize_weights(kernel, bits, group_size, symmetric=symmetric, dtype=dtype)
    self.values = nnx.Variable(qw.values)
    self.scales = nnx.Variable(qw.scales)
    self.zeros = None if qw.zeros is None else nnx.Variable(qw.zeros)
    self.bias = None if bias is None else nnx.Variable(jnp.asarray(bias, jnp.float32))
    self.group_size = qw.group_size
    self.k_block = qw.k_block
    self.fragments = qw.fragments
    self.dtype = jnp.dtype(dtype)
    self.implementation = implementation
    lowering_pool.start(implementation)

  @classmethod
  def from_linear(cls, linear: nnx.Linear, **kwargs) -> "QuantizedLinear":
    """The quantized counterpart of a trained `nnx.Linear` (or `Linear`), bias included."""
    bias = linear.bias[...] if linear.bias is not None else None
    return cls(linear.kernel[...], bias, **kwargs)

  def __call__(self, inputs):
    weight = weight_only.QuantizedWeight(
        self.values[...],
        self.scales[...],
        None if self.zeros is None else self.zeros[...],
        self.group_size,
        self.k_block,
        self.fragments,
    )
    return weight_only.quantized_matmul(
        jnp.asarray(inputs, self.dtype),
        weight,
        bias=None if self.bias is None else self.bias[...],
        activation=self.activation,
        implementation=self.implementation,
    )


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

  def __post_init__(self):
    # Checked at construction, as `Linear` does (not at the first `init`).
    epilogue_lib.activation_name(self.activation, custom=True)
    super().__post_init__()

  @linen.compact
  def __call__(self, inputs):
    kernel = self.param(
        "kernel", self.kernel_init, (inputs.shape[-1], self.features), self.param_dtype
    )
    bias = (
        self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        if self.use_bias
        else None
    )
    inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    return dense(
        inputs, kernel, bias, activation=self.activation, implementation=self.implementation
    )


def dense(
    inputs,
    kernel,
    bias=None,
    *,
    activation=None,
    residual=None,
    out_dtype=None,
    implementation=None,
    scalar=None,
):
  """`act(inputs @ kernel + bias) + residual` over the last dim of `inputs`, as one kernel call
  (`scalar`: for a user's epilogue that takes one, `epilogue.with_operands`).

  >>> import jax.numpy as jnp
  >>> dense(jnp.ones((3, 2), jnp.bfloat16), jnp.ones((2, 5), jnp.bfloat16)).shape
  (3, 5)
  """
  if implementation is None and (
      inputs.dtype.name not in INPUT_DTYPES or kernel.dtype != inputs.dtype
  ):
    implementation = "xla"
  rows = (-1, kernel.shape[-1])
  if residual is not None:
    residual = residual.reshape(rows)
  y = autodiff.matmul(
      inputs.reshape(-1, inputs.shape[-1]),
      kernel,
      bias=bias,
      activation=activation,
      residual=residual,
      out_dtype=out_dtype,
      implementation=implementation,
      scalar=scalar,
  )
  return y.reshape(*inputs.shape[:-1], kernel.shape[-1])


class Fp8Meta(nnx.Variable):
  """fp8 scaling state (amax histories, scales): updated by the forward pass, not
  by the optimizer (`nnx.Optimizer(..., wrt=nnx.Param)` leaves it alone)."""


class Fp8Linear(nnx.Module):
  """A dense layer whose forward GEMM runs in fp8 (e4m3 x e4m3, f32 accumulation),
  with TransformerEngine-style delayed scaling.

  Parameters as `nnx.Linear` (`kernel` (in, out), `bias` (out,)), so they
  interchange with `Linear`'s. Scaling state, `Fp8Meta` variables:
  `input_amax_history`, `kernel_amax_history` (length `amax_history_len`,
  newest first) and `input_scale`, `kernel_scale` (quantization scales, f32
  scalars, initially 1).

  Forward: `pallas_gemm.fp8_linear`: x and the kernel are quantized to e4m3
  with the current scales (one XLA pass each, which also takes their amax; the
  kernel is quantized transposed, (out, in), the layout the fp8 kernel reads),
  then `scaled_matmul(x8, w8, 1 / input_scale, 1 / kernel_scale, bias=bias)`;
  then each history gets the new amax and each scale becomes
  `fp8_max / (max(history) * 2**margin)` (`pallas_gemm.fp8`). The scales
  reach the kernel as arrays, so a changed scale never recompiles.

  Backward (`jax.custom_vjp`), chosen by `backward`: "bf16" (default), GEMMs
  with the unquantized operands in `dtype` (dx = dy @ kernel^T, dkernel =
  x^T @ dy, straight through the quantization); or "e5m2", TransformerEngine's
  hybrid recipe: dy quantized to e5m2 with its own current scale
  (`fp8.current_scale`, so no gradient state is carried between steps), and
  both GEMMs run as `scaled_matmul` on fp8 operands (dy e5m2 against the e4m3
  kernel and input quantized with the forward's scales; x^T and dy^T are
  transposed in the quantizing XLA pass). Mixed e4m3 x e5m2 kernels need
  jax >= 0.11. The activation runs in XLA after the GEMM (its derivative
  needs the pre-activation).

  Inside a jitted train step, call the model inside `nnx.value_and_grad` (or
  `nnx.grad`) as usual: the forward's writes to the `Fp8Meta` variables are
  carried out of the transformations and applied to the model by `nnx.jit`,
  while the gradients cover `nnx.Param` only. Each call of the layer is one
  step of the delayed-scaling recipe, except in evaluation: `model.eval()` sets
  `use_running_average=True` (as for BatchNorm's statistics), and the layer then
  uses the stored scales and updates nothing; `model.train()` resumes the updates.

  Args:
    in_features, out_features: as `nnx.Linear`.
    use_bias, kernel_init, bias_init, param_dtype: as `nnx.Linear`.
    dtype: compute dtype of the backward GEMMs and of the output (bf16 default).
    activation: as `pallas_gemm.matmul` (a name or a jax.nn / flax.nnx function).
    amax_history_len: entries kept per history (default 1024, as Flax's fp8 ops and
      TransformerEngine keep).
    use_running_average: evaluation mode (see above; `model.eval()` sets it).
    margin: scales are divided by 2**margin (headroom).
    backward: "bf16" or "e5m2": the backward GEMMs' operands (see above).
    implementation: as `pallas_gemm.scaled_matmul` (None: the kernel on a GPU).

  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> layer = Fp8Linear(32, 16, rngs=nnx.Rngs(0))
  >>> layer(jnp.ones((4, 32))).shape, float(layer.kernel_scale[...]) > 1
  ((4, 16), True)
  """

  def __init__(
      self,
      in_features: int,
      out_features: int,
      *,
      use_bias: bool = True,
      dtype=jnp.bfloat16,
      param_dtype=jnp.float32,
      kernel_init=nnx.initializers.lecun_normal(),
      bias_init=nnx.initializers.zeros,
      activation: str | None = None,
      amax_history_len: int = 1024,
      margin: int = 0,
      use_running_average: bool = False,
      backward: str = "bf16",
      implementation: str | None = None,
      rngs: nnx.Rngs,
  ):
    activation = epilogue_lib.activation_name(activation)
    if backward not in BACKWARDS:
      raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if amax_history_len < 1:
      raise ValueError(f"amax_history_len must be >= 1, got {amax_history_len}")
    self.in_features, self.out_features = in_features, out_features
    self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
    self.bias = (
        nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None
    )
    self.input_amax_history = Fp8Meta(jnp.zeros((amax_history_len,), jnp.float32))
    self.kernel_amax_history = Fp8Meta(jnp.zeros((amax_history_len,), jnp.float32))
    self.input_scale = Fp8Meta(jnp.ones((), jnp.float32))
    self.kernel_scale = Fp8Meta(jnp.ones((), jnp.float32))
    self.dtype = dtype
    self.activation = activation
    self.margin = margin
    self.backward = backward
    self.implementation = implementation
    self.use_running_average = use_running_average
    lowering_pool.start(implementation)

  def __call__(self, inputs):
    x = inputs.reshape(-1, inputs.shape[-1]).astype(self.dtype)
    kernel = self.kernel[...].astype(self.dtype)
    bias = None if self.bias is None else self.bias[...].astype(jnp.float32)
    x_scale, kernel_scale = self.input_scale[...], self.kernel_scale[...]
    y = fp8_linear(
        x,
        kernel,
        bias,
        x_scale,
        kernel_scale,
        out_dtype=self.dtype,
        backward=self.backward,
        implementation=self.implementation,
    )
    if self.activation is not None:
      y = epilogue_lib.ACTIVATIONS[self.activation](y.astype(jnp.float32)).astype(self.dtype)
    if self.use_running_average:  # evaluation: the scales stay as training left them
      return y.reshape(*inputs.shape[:-1], self.out_features)
    for history, scale, value in (
        (self.input_amax_history, self.input_scale, x),
        (self.kernel_amax_history, self.kernel_scale, kernel),
    ):
      new_history = fp8.update_history(history[...], jax.lax.stop_gradient(fp8.amax(value)))
      history[...] = new_history
      scale[...] = fp8.scale_from_history(new_history, scale[...], margin=self.margin)
    return y.reshape(*inputs.shape[:-1], self.out_features)
