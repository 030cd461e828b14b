"""Decoder models in Flax nnx for the end-to-end benchmark (`benchmarks.model`).

Two architectures, each buildable in three variants that differ only in how
their projections run:

  "xla"       `nnx.Linear`: XLA's GEMMs (cuBLAS); bias, activation and
              residual adds are XLA ops.
  "injected"  `nnx.Linear(dot_general=pallas_gemm.dot_general)`: the kernel
              for the GEMM alone, as a user gets by injection.
  "fused"     `pallas_gemm.flax.Linear`: bias and activation in the kernel's
              epilogue, and the residual add of the attention output and of
              the MLP down-projection in the epilogue too; the GPT MLP as one
              `pallas_gemm.mlp` (`flax.mlp_of`), whose backward applies the
              GELU derivative in a GEMM's epilogue; the Llama MLP's gate and
              up projections as one `pallas_gemm.gated_linear_unit`
              (`flax.gated_mlp_of`); the head and the training loss as one
              `pallas_gemm.head_cross_entropy` (`flax.Linear.cross_entropy`:
              the log-sum-exp in the head GEMM's epilogue); q, k and v stored
              apart by the qkv GEMM (`flax.Linear.split`).

For serving, `quantize` turns an "xla" model's projections (the head included) into
`pallas_gemm.flax.QuantizedLinear`s: int4 or int8 weights with group scales,
multiplied by `pallas_gemm.quantized_matmul` (inference only).

"gpt": LayerNorm, multi-head attention (`jax.nn.dot_product_attention`), GELU
MLP with biases, untied head. "llama": RMSNorm, grouped-query attention with
rotary embeddings, SwiGLU MLP without biases, untied head. Every variant of
one spec has the same parameters (same names, same initial values), so loss
curves compare step by step.

>>> import jax, jax.numpy as jnp
>>> from flax import nnx
>>> spec = SIZES["small"]
>>> model = Decoder(spec, "xla", nnx.Rngs(0))
>>> model(jnp.zeros((2, spec.seq), jnp.int32)).shape
(2, 32, 512)
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import optax  # flax's own dependency
import jax.numpy as jnp
import numpy as np

import pallas_gemm
import pallas_gemm.flax

ARCHS = ("gpt", "llama")
VARIANTS = ("xla", "injected", "fused")
COMPUTE_DTYPE = jnp.bfloat16
PARAM_DTYPE = jnp.float32
_List = getattr(nnx, "List", list)  # flax >= 0.12 wants module lists wrapped


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One decoder's sizes. `kv_heads` < `heads` is grouped-query attention."""

  arch: str = "gpt"
  layers: int = 8
  d_model: int = 2048
  heads: int = 16
  kv_heads: int = 16
  mlp: int = 8192
  vocab: int = 32000
  batch: int = 8
  seq: int = 2048
  attention: str | None = None
  """`jax.nn.dot_product_attention`'s implementation: "cudnn" (flash attention, the
  harness's choice on a GPU), "xla", or None (jax's pick)."""

  def __post_init__(self):
    if self.arch not in ARCHS:
      raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
    if self.d_model % self.heads or self.heads % self.kv_heads:
      raise ValueError(
          f"d_model ({self.d_model}) must be a multiple of heads ({self.heads}), "
          f"and heads of kv_heads ({self.kv_heads})"
      )
    if self.arch == "llama" and self.head_dim % 2:
      raise ValueError(
          f"llama's rotary embedding rotates half of each head: head_dim (d_model / heads = "
          f"{self.head_dim}) must be even"
      )

  @property
  def head_dim(self) -> int:
    return self.d_model // self.heads

  @property
  def tokens(self) -> int:
    """Tokens per training step."""
    return self.batch * self.seq

  @property
  def train_flops(self) -> int:
    """Matmul FLOPs of one training step (forward + backward = 3x forward), attention included."""
    d, hd, t = self.d_model, self.head_dim, self.tokens
    proj = d * (self.heads + 2 * self.kv_heads) * hd + d * d
    proj += (2 if self.arch == "gpt" else 3) * d * self.mlp
    attn = 2 * self.seq * self.heads * hd  # QK^T and PV, causal: half of 2 * S
    forward = 2 * t * (self.layers * proj + self.vocab * d) + 2 * t * self.layers * attn // 2
    return 3 * forward


SIZES = {
    # 0.54B parameters (gpt), 16k tokens per step, the model of issue 15: three
    # variants' weights, AdamW states and activations fill an H100 80GB (16 layers
    # need 45 GB of temporaries per step and do not fit beside each other).
    "default": ModelSpec(),
    # A few seconds on a CPU: the CI size.
    "small": ModelSpec(
        layers=2, d_model=256, heads=4, kv_heads=4, mlp=512, vocab=512, batch=2, seq=32
    ),
}
HELDOUT = {
    # Models the project was never tuned or measured on (chosen 2026-11-29, before their first
    # run): public architectures' widths, truncated in depth where one H200 step would take
    # long, each with its own arch.
    "gpt2-small": ModelSpec(
        layers=12, d_model=768, heads=12, kv_heads=12, mlp=3072, vocab=50304, batch=32, seq=512
    ),
    "gpt2-medium": ModelSpec(
        layers=12, d_model=1024, heads=16, kv_heads=16, mlp=4096, vocab=50257, batch=16, seq=1024
    ),
    "llama3-3b-4l": ModelSpec(
        arch="llama",
        layers=4,
        d_model=3072,
        heads=24,
        kv_heads=8,
        mlp=8192,
        vocab=128256,
        batch=4,
        seq=2048,
    ),
    "mistral-7b-2l": ModelSpec(
        arch="llama",
        layers=2,
        d_model=4096,
        heads=32,
        kv_heads=8,
        mlp=14336,
        vocab=32768,
        batch=2,
        seq=4096,
    ),
}
"""The held-out models (`python -m benchmarks.model --size gpt2-medium`): sizes the default
config, the routes and the fusions were never fitted on. Each preset carries its arch."""


def projection_gemms(spec: ModelSpec) -> list[dict]:
  """The distinct GEMMs of one training step's projections through an injected `dot_general`,
  as sweep shapes (`pallas_gemm/shapes/NAME.json` rows): each projection forward (NN), its dX
  (NT) and its dW (TN); llama's gate and up are two GEMMs here, as `nnx.Linear` runs them.

  >>> [(g["name"], g["m"], g["n"], g["k"], g["layout"]) for g in projection_gemms(
  ...     SIZES["small"])][:3]
  [('qkv', 64, 768, 256, 'NN'), ('qkv dX', 64, 256, 768, 'NT'), ('qkv dW', 256, 768, 64, 'TN')]
  """
  d, t = spec.d_model, spec.tokens
  projections = [("qkv", d, (spec.heads + 2 * spec.kv_heads) * spec.head_dim), ("out", d, d)]
  projections += [("up", d, spec.mlp)] if spec.arch == "gpt" else [("gate, up", d, spec.mlp)]
  projections += [("down", spec.mlp, d), ("head", d, spec.vocab)]
  out, seen = [], set()
  for name, din, dout in projections:
    for suffix, m, n, k, layout in (
        ("", t, dout, din, "NN"),
        (" dX", t, din, dout, "NT"),
        (" dW", din, dout, t, "TN"),
    ):
      if (m, n, k, layout) not in seen:
        seen.add((m, n, k, layout))
        out.append(dict(name=name + suffix, m=m, n=n, k=k, layout=layout))
  return out


def heldout_gemms() -> list[dict]:
  """`pallas_gemm/shapes/heldout_models.json`'s shapes: `projection_gemms` of every
  `HELDOUT` model in order, each (M, N, K, layout) once, named by the first model that
  has it.

  >>> heldout_gemms()[0]["name"]
  'gpt2-small qkv'
  """
  out, seen = [], set()
  for model, spec in HELDOUT.items():
    for gemm in projection_gemms(spec):
      if (key := (gemm["m"], gemm["n"], gemm["k"], gemm["layout"])) not in seen:
        seen.add(key)
        out.append(dict(gemm, name=f"{model} {gemm['name']}"))
  return out


LLAMA_DEFAULTS = dict(kv_heads=4, mlp=5632)
"""What `for_arch` changes for "llama": 4 KV heads (GQA), SwiGLU width ~2.75 d_model."""


def for_arch(spec: ModelSpec, arch: str) -> ModelSpec:
  """`spec` as the other architecture; "llama" gets GQA and a SwiGLU width scaled from
  `LLAMA_DEFAULTS` (the default size's 5632 = 2.75 x 2048, in multiples of 128).

  >>> for_arch(SIZES["default"], "llama").mlp
  5632
  """
  if arch == "gpt" or spec.arch == arch:
    return dataclasses.replace(spec, arch=arch)
  kv = max(1, spec.heads * LLAMA_DEFAULTS["kv_heads"] // 16)
  while spec.heads % kv:
    kv -= 1
  mlp = max(128, round(spec.d_model * 2.75 / 128) * 128)
  return dataclasses.replace(spec, arch=arch, kv_heads=kv, mlp=mlp)


class Projection(nnx.Module):
  """`act(x @ kernel + bias) + residual` in the variant's way (see the module doc)."""

  def __init__(
      self,
      din: int,
      dout: int,
      *,
      variant: str,
      use_bias: bool,
      activation: str | None = None,
      implementation: str | None = None,
      rngs: nnx.Rngs,
  ):
    if variant not in VARIANTS:
      raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    kwargs = dict(
        use_bias=use_bias,
        dtype=COMPUTE_DTYPE,
        param_dtype=PARAM_DTYPE,
        kernel_init=nnx.initializers.normal(0.02),
        rngs=rngs,
    )
    self.variant, self.activation = variant, activation
    if variant == "fused":
      self.linear = pallas_gemm.flax.Linear(
          din, dout, activation=activation, implementation=implementation, **kwargs
      )
    elif variant == "injected":
      dot_general = pallas_gemm.make_dot_general(implementation=implementation)
      self.linear = nnx.Linear(din, dout, dot_general=dot_general, **kwargs)
    else:
      self.linear = nnx.Linear(din, dout, **kwargs)

  def __call__(self, x, residual=None):
    if self.variant == "fused":
      return self.linear(x, residual=residual)
    y = self.linear(x)
    if self.activation == "gelu_tanh":
      y = jax.nn.gelu(y, approximate=True)
    elif self.activation is not None:
      raise ValueError(f"unsupported activation {self.activation!r}")
    return y if residual is None else y + residual


def _rotary(x, positions):
  """Rotary position embedding of (B, S, H, D) `x` (half-split convention), in f32."""
  half = x.shape[-1] // 2
  freqs = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float32) / half))
  angles = positions[:, None].astype(np.float32) * freqs[None]
  cos, sin = jnp.asarray(np.cos(angles))[:, None], jnp.asarray(np.sin(angles))[:, None]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


class Block(nnx.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(
      self, spec: ModelSpec, variant: str, rngs: nnx.Rngs, implementation: str | None = None
  ):
    gpt = spec.arch == "gpt"
    norm = nnx.LayerNorm if gpt else nnx.RMSNorm
    self.spec = spec
    self.norm1 = norm(spec.d_model, dtype=COMPUTE_DTYPE, param_dtype=PARAM_DTYPE, rngs=rngs)
    self.norm2 = norm(spec.d_model, dtype=COMPUTE_DTYPE, param_dtype=PARAM_DTYPE, rngs=rngs)
    qkv_width = (spec.heads + 2 * spec.kv_heads) * spec.head_dim
    proj = dict(variant=variant, use_bias=gpt, implementation=implementation, rngs=rngs)
    self.qkv = Projection(spec.d_model, qkv_width, **proj)
    self.attn_out = Projection(spec.d_model, spec.d_model, **proj)
    if gpt:
      self.up = Projection(spec.d_model, spec.mlp, activation="gelu_tanh", **proj)
    else:
      self.gate = Projection(spec.d_model, spec.mlp, **proj)
      self.up = Projection(spec.d_model, spec.mlp, **proj)
    self.down = Projection(spec.mlp, spec.d_model, **proj)

  def __call__(self, x):
    s = self.spec
    b, t, _ = x.shape
    widths = (s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim)
    if self.qkv.variant == "fused":  # q, k and v stored apart by the kernel
      q, k, v = self.qkv.linear.split(self.norm1(x), widths)
    else:
      q, k, v = jnp.split(self.qkv(self.norm1(x)), [widths[0], widths[0] + widths[1]], -1)
    q = q.reshape(b, t, s.heads, s.head_dim)
    k = k.reshape(b, t, s.kv_heads, s.head_dim)
    v = v.reshape(b, t, s.kv_heads, s.head_dim)
    if s.arch == "llama":
      positions = np.arange(t)
      q, k = _rotary(q, positions), _rotary(k, positions)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=s.attention)
    x = self.attn_out(o.reshape(b, t, s.d_model), residual=x)
    h = self.norm2(x)
    if s.arch == "gpt" and self.up.variant == "fused":  # the MLP's backward fused too
      return pallas_gemm.flax.mlp_of(self.up.linear, self.down.linear, h, residual=x)
    if self.up.variant == "fused":  # llama: gate and up in one GEMM
      return pallas_gemm.flax.gated_mlp_of(
          self.gate.linear, self.up.linear, self.down.linear, h, residual=x, activation="silu"
      )
    if s.arch == "gpt":
      m = self.up(h)
    else:
      m = jax.nn.silu(self.gate(h)) * self.up(h)
    return self.down(m, residual=x)


class Decoder(nnx.Module):
  """Token ids (B, S) -> logits (B, S, vocab) in bf16.

  `implementation` goes to the library's layers ("pallas" lowers the kernels
  anywhere, e.g. for `jax.export(..., platforms=["cuda"])` on a CPU).
  """

  def __init__(
      self, spec: ModelSpec, variant: str, rngs: nnx.Rngs, implementation: str | None = None
  ):
    self.embed = nnx.Embed(
        spec.vocab, spec.d_model, dtype=COMPUTE_DTYPE, param_dtype=PARAM_DTYPE, rngs=rngs
    )
    self.blocks = _List([Block(spec, variant, rngs, implementation) for _ in range(spec.layers)])
    norm = nnx.LayerNorm if spec.arch == "gpt" else nnx.RMSNorm
    self.norm = norm(spec.d_model, dtype=COMPUTE_DTYPE, param_dtype=PARAM_DTYPE, rngs=rngs)
    self.head = Projection(
        spec.d_model,
        spec.vocab,
        variant=variant,
        use_bias=False,
        implementation=implementation,
        rngs=rngs,
    )

  def __call__(self, tokens):
    return self.head(self.hidden(tokens))

  def hidden(self, tokens):
    """The normalized hidden states the head reads, (B, S, d_model)."""
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x)
    return self.norm(x)

  def loss(self, tokens, labels):
    """Mean cross-entropy (f32) of the next-token logits against `labels` (B, S)."""
    h = self.hidden(tokens)
    if self.head.variant == "fused":
      return self.head.linear.cross_entropy(h, labels).mean()
    logits = self.head(h).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def quantize(model: Decoder, bits: int = 4, group_size: int = 128) -> Decoder:
  """`model` (the "xla" or "injected" variant, any trained weights) with every projection's
  weight quantized, in place, for inference: int`bits` with scales per `group_size` rows
  of K (-1: per channel), in `quantize_weights`' layout; biases and activations kept.

  >>> model = quantize(Decoder(SIZES["small"], "xla", nnx.Rngs(0)), bits=4)
  >>> type(model.head.linear).__name__
  'QuantizedLinear'
  """
  projections = [model.head]
  for block in model.blocks:
    names = ("qkv", "attn_out", "up", "down") + (("gate",) if hasattr(block, "gate") else ())
    projections += [getattr(block, name) for name in names]
  for projection in projections:
    if projection.variant == "fused":
      raise ValueError("quantize takes the 'xla' or 'injected' variant (nnx.Linear projections)")
    projection.linear = pallas_gemm.flax.QuantizedLinear.from_linear(
        projection.linear, bits=bits, group_size=group_size, dtype=COMPUTE_DTYPE
    )
  return model
