"""The dense GEMM's epilogue operands, each described once, by kind.

An operand's kind says how it lines up with the (..., M, N) output, and from that
alone follows everything the library does with it: the shape rule and its error, the
broadcast in the XLA path, folding a batch into M, the kernel's zero padding, its
shared-memory staging and the slice each epilogue chunk reads, its per-example
(vmapped) form, its partition spec on a mesh, and its cotangent. An operand's role says
where the formula (`pallas_gemm.epilogue`) uses it.

| kind           | shape       | staged in the kernel            | cotangent from dY (..., M, N) |
|----------------|-------------|---------------------------------|-------------------------------|
| column vector  | (N,)        | (2, wg_n) f32, per tile          | sum over all but the last axis |
| row vector     | (M,)        | (2, wg_m) f32, per tile          | sum over all but the row axis  |
| tile           | (..., M, N) | chunk by chunk beside the result | itself (batch dims it lacks summed) |
| runtime scalar | ()          | read from device memory          | sum of everything              |

Adding an operand is one entry of `OPERANDS` (and its keyword where users pass it);
adding a kind is one `Kind`.

>>> OPERANDS["row_bias"].kind.name, OPERANDS["row_bias"].role
('row vector', 'addend')
>>> OPERANDS["row_bias"].check(jnp.ones(3), m=4, n=5)
Traceback (most recent call last):
...
ValueError: row_bias must have shape (M,) = (4,), got (3,)
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

ADDEND_DTYPES = ("bfloat16", "float16", "float32")
"""dtypes of a residual tile the epilogue reads (it keeps its own dtype in SMEM)."""


@dataclasses.dataclass(frozen=True)
class Kind:
  """How an operand lines up with the output: `axes` of (M, N) it spans ("n": a column
  vector, (N,); "m": a row vector, (M,); "mn": a tile, (..., M, N); "": a scalar)."""

  name: str
  axes: str

  @property
  def vector(self) -> bool:
    """A vector staged per tile in shared memory (the kernel's column or row vector)."""
    return len(self.axes) == 1

  def along(self, m, n):
    """Of two values for the M and the N direction, the one a vector of this kind runs
    along (its extent, start, broadcast dim, ...).

    >>> COLUMN.along("rows", "cols"), ROW.along("rows", "cols")
    ('cols', 'rows')
    """
    if not self.vector:
      raise ValueError(f"a {self.name} runs along no single direction")
    return n if self.axes == "n" else m

  def shape_rule(self, m: int, n: int, batch_shape=()) -> str:
    """The allowed shapes, as an error message states them."""
    if self.axes == "n":
      return f"(N,) = ({n},)"
    if self.axes == "m":
      return f"(M,) = ({m},)"
    if self.axes == "mn":
      return f"{(*batch_shape, m, n)} or {(m, n)}" if batch_shape else f"{(m, n)}"
    return "()"

  def fits(self, shape, m: int, n: int, batch_shape=()) -> bool:
    """Whether `shape` is one this kind allows for an (M, N) output (batch dims
    `batch_shape`)."""
    shape = tuple(shape)
    if self.axes == "mn":
      return shape in ((*batch_shape, m, n), (m, n))
    return shape == {"n": (n,), "m": (m,), "": ()}[self.axes]

  def broadcastable(self, x):
    """`x` (of an allowed shape) so that it broadcasts against (..., M, N): a row
    vector becomes a column of M rows; the others already do.

    >>> ROW.broadcastable(jnp.arange(2.0)).shape, COLUMN.broadcastable(jnp.arange(2.0)).shape
    ((2, 1), (2,))
    """
    return x[..., None] if self.axes == "m" else x

  def per_example(self, x, size: int, out_ndim: int):
    """A vmapped operand (the mapped dim first, size `size`) shaped to broadcast against
    a (size, ..., M, N) result of `out_ndim` dims.

    >>> COLUMN.per_example(jnp.ones((3, 5)), 3, 4).shape, ROW.per_example(jnp.ones((3, 4)), 3, 4).shape
    ((3, 1, 1, 5), (3, 1, 4, 1))
    """
    lead = (size, *(1,) * (out_ndim - 3))
    if self.axes == "mn":
      return x
    return x.reshape(*lead, *{"n": (1, -1), "m": (-1, 1), "": (1, 1)}[self.axes])

  def folded(self, x, batch_shape, m: int, n: int):
    """`x` for a GEMM whose batch dims `batch_shape` are folded into M (rows repeat
    per batch entry): a row vector repeats, a tile broadcasts and flattens.

    >>> ROW.folded(jnp.arange(2.0), (3,), 2, 5).tolist()
    [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    """
    if self.axes == "m":
      return jnp.tile(x, math.prod(batch_shape))
    if self.axes == "mn":
      return jnp.broadcast_to(x, (*batch_shape, m, n)).reshape(-1, n)
    return x

  def partition(self, out_spec: tuple, ndim: int) -> tuple:
    """The partition spec of an operand of this kind with `ndim` dims, given the
    output's (..., M, N) spec `out_spec`.

    >>> out = ("data", None, "model")
    >>> TILE.partition(out, 2), ROW.partition(out, 1), COLUMN.partition(out, 1)
    ((None, 'model'), (None,), ('model',))
    """
    return {
        "n": (out_spec[-1],),
        "m": (out_spec[-2],),
        "mn": tuple(out_spec[-ndim:]),
        "": (),
    }[self.axes]

  def cotangent(self, d, shape):
    """The f32 cotangent of an operand of `shape`, broadcast into the (..., M, N)
    array whose cotangent is `d`: `d` summed over what the operand was broadcast
    over.

    >>> d = jnp.ones((2, 3, 4))
    >>> [k.cotangent(d, s).shape for k, s in ((COLUMN, (4,)), (ROW, (3,)), (TILE, (3, 4)), (SCALAR, ()))]
    [(4,), (3,), (3, 4), ()]
    >>> float(ROW.cotangent(d, (3,))[0])
    8.0
    """
    leading = tuple(range(d.ndim - 2))
    axes = {
        "n": (*leading, d.ndim - 2),
        "m": (*leading, d.ndim - 1),
        "mn": tuple(range(d.ndim - len(shape))),
        "": tuple(range(d.ndim)),
    }[self.axes]
    return jnp.sum(d, axis=axes, dtype=jnp.float32)


COLUMN = Kind("column vector", "n")
ROW = Kind("row vector", "m")
TILE = Kind("tile", "mn")
SCALAR = Kind("runtime scalar", "")


@dataclasses.dataclass(frozen=True)
class Operand:
  """One epilogue operand: its argument name, kind and role.

  role: "addend" (added into `pre`: y = act(... + operand)), "scaled addend" (`beta *
  c`, in the output's dtype), "residual" (added after the activation), "multiplier" (a
  runtime factor of the accumulator) or "user" (read only by a user's epilogue,
  `with_operands`). `flag` is the `GemmProblem` field recording the operand (the
  kernel's shared memory depends on it; None: the scalar, which travels in the kernel's
  runtime scalars, `has_scales`); `routable`: a user's epilogue may take it
  (`epilogue.with_operands`), and an addend it takes leaves `pre`; `public`: an argument
  of `pallas_gemm.matmul` (differentiable there).
  """

  name: str
  kind: Kind
  role: str
  flag: str | None
  routable: bool = False
  public: bool = True

  def check(self, x, m: int, n: int, batch_shape=(), argument: str | None = None):
    """Raises ValueError naming `argument` (default: the operand's name) and the rule
    unless `x` (None: absent) has a shape this operand allows, and for a residual
    tile one of `ADDEND_DTYPES`."""
    if x is None:
      return
    argument = argument or self.name
    shape = jnp.shape(x)
    if not self.kind.fits(shape, m, n, batch_shape):
      if self.kind is SCALAR:
        raise ValueError(f"{argument} must be a scalar (shape ()), got shape {shape}")
      rule = self.kind.shape_rule(m, n, batch_shape)
      raise ValueError(f"{argument} must have shape {rule}, got {shape}")
    if self.role == "residual" and jnp.result_type(x).name not in ADDEND_DTYPES:
      raise TypeError(f"{argument} must be one of {ADDEND_DTYPES}, got {jnp.result_type(x).name}")


OPERANDS = {
    op.name: op
    for op in (
        Operand("bias", COLUMN, "addend", "has_bias", routable=True),
        Operand("row_bias", ROW, "addend", "has_row_bias", routable=True),
        Operand("c", TILE, "scaled addend", "has_c"),
        Operand("residual", TILE, "residual", "residual_dtype", routable=True),
        Operand("scalar", SCALAR, "user", None, routable=True),
        Operand("row_scale", ROW, "multiplier", "has_row_scale", public=False),
        Operand("col_scale", COLUMN, "multiplier", "has_col_scale", public=False),
    )
}
"""Every epilogue operand of the dense GEMM, by name, in the kernel's order (its inputs
after A and B; the scalar rides in the kernel's runtime scalars)."""

PUBLIC = tuple(name for name, op in OPERANDS.items() if op.public)
"""`pallas_gemm.matmul`'s epilogue operands: ('bias', 'row_bias', 'c', 'residual',
'scalar')."""

VECTORS = tuple(name for name, op in OPERANDS.items() if op.kind.vector)
"""The operands the kernel stages per tile in shared memory, in staging order."""

ADDENDS = tuple(name for name, op in OPERANDS.items() if op.role == "addend")
"""The vectors added into `pre` (unless a user's epilogue takes them)."""

MULTIPLIERS = tuple(name for name, op in OPERANDS.items() if op.role == "multiplier")
"""The vectors that scale the accumulator."""


def present(problem) -> tuple[str, ...]:
  """The operands a `GemmProblem` records (by their flags), in `OPERANDS` order.

  >>> from pallas_gemm.config import GemmProblem
  >>> present(GemmProblem(8, 8, 8, has_bias=True, residual_dtype="float32"))
  ('bias', 'residual')
  """
  return tuple(name for name, op in OPERANDS.items() if op.flag and getattr(problem, op.flag))
