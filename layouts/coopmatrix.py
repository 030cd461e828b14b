"""Cooperative-matrix layouts: which work-item holds which element.

Follows ``shared/reference/coopmatrix_layout.txt`` (tinytc's coopmatrix
layout). An M×N matrix is spread over a subgroup of S work-items as the
``I × K1 × J × K2`` tensor ``A*`` (I = min(M, S), J the smallest n >= N with
S | I·n, K = K1·K2 = M/I), linearized as ``L = i + k1·I + j·I·K1 +
k2·I·K1·J``; work-item ``p`` holds ``A*[L⁻¹(p + v·S)]`` as component ``v``.

:func:`coopmatrix_layout` is that map as a layout with basis strides,
``(work-item, component) -> (row, column)``; zero padding shows up as a column
``>= N`` (a basis layout drops trailing zero coordinates: a 16×1 matrix's
layout gives ``(row,)``). ``matrix_a`` of a type narrower than 4 bytes is VNNI-packed when ω
(4 / bytes) divides N: each component is an i32 of ω channels, columns
``c + ω·j``, and the component mode is ``(channel, entry)``.

>>> coopmatrix_layout(4, 15, 16, "matrix_acc", "f32")
((4,4),4):((1@0,1@1),4@1)
>>> coopmatrix_layout(4, 15, 16, "matrix_acc", "f32")(13, 3)  # p = 13, .w: padding
(1, 15)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .basis import ArithmeticTuple, E
from .dtypes import dtype_bits
from .int_tuple import ceil_div, is_int
from .layout import Layout, composition, make_layout
from .tensor import Tensor

__all__ = ["CoopMatrixParams", "coopmatrix_params", "coopmatrix_layout", "coopmatrix_load"]

_USES = {
    "matrix_a": "matrix_a",
    "a": "matrix_a",
    "matrix_b": "matrix_b",
    "b": "matrix_b",
    "matrix_acc": "matrix_acc",
    "acc": "matrix_acc",
}


@dataclass(frozen=True)
class CoopMatrixParams:
  """The document's sizes for one coopmatrix type, and its layout.

  ``components`` is V, the values per work-item (for a VNNI-packed
  ``matrix_a``, ``omega`` channels of ``components // omega`` i32 entries);
  ``layout`` maps ``(p, v)`` to ``(row, column)``.
  """

  M: int
  N: int
  subgroup_size: int
  use: str
  I: int  # noqa: E741 - the document's name
  J: int
  K1: int
  K2: int
  omega: int
  components: int
  layout: Layout


def _power_of_two(name: str, n) -> int:
  if not is_int(n) or n < 1 or n & (n - 1):
    raise ValueError(f"coopmatrix: {name} must be a power of two >= 1, got {n!r}")
  return n


def coopmatrix_params(M: int, N: int, subgroup_size: int, use: str, dtype) -> CoopMatrixParams:
  """I, J, K1, K2, ω and V of the document for an M×N ``use`` matrix of ``dtype``.

  ``matrix_acc`` and ``matrix_a`` have K1 = 1; ``matrix_b`` has
  K1 = ω_b = max(1, 2 / bytes) when M > S, else 1. ``matrix_a`` with
  ω = max(1, 4 / bytes) > 1 dividing N is VNNI-packed.

  >>> p = coopmatrix_params(1, 17, 16, "matrix_acc", "f32")
  >>> p.I, p.J, p.K1, p.K2, p.components
  (1, 32, 1, 1, 2)
  """
  M, S = _power_of_two("M", M), _power_of_two("subgroup_size", subgroup_size)
  if not is_int(N) or N < 1:
    raise ValueError(f"coopmatrix: N must be a positive int, got {N!r}")
  if use not in _USES:
    raise ValueError(f"coopmatrix: use must be matrix_a, matrix_b or matrix_acc, got {use!r}")
  use = _USES[use]
  bits = dtype_bits(dtype)
  if bits % 8:
    raise ValueError(f"coopmatrix: elements are whole bytes, got {bits}-bit {dtype!r}")
  size = bits // 8
  I = min(M, S)  # noqa: E741
  J = ceil_div(I * N, S) * S // I
  K = M // I
  K1 = max(1, 2 // size) if use == "matrix_b" and M > S else 1
  K2 = K // K1
  omega = max(1, 4 // size) if use == "matrix_a" else 1
  if N % omega:
    omega = 1
  if (I * K * (J // omega)) % S:
    raise ValueError(
        f"coopmatrix: the VNNI-packed matrix_a tensor A** has I*K*ceil(J/omega) = {I * K * (J // omega)} "
        f"entries, not a multiple of the subgroup size {S}: the document's layout does not spread it "
        "evenly over the work-items"
    )
  entries = I * K * (J // omega) // S
  star = Layout((I, K1, J // omega, K2), (E(0), I * E(0), omega * E(1), I * K1 * E(0)))
  per_entry = composition(star, Layout((S, entries), (1, S)))
  layout = (
      per_entry
      if omega == 1
      else make_layout(per_entry[0], make_layout(Layout(omega, E(1)), per_entry[1]))
  )
  return CoopMatrixParams(
      M=M,
      N=N,
      subgroup_size=S,
      use=use,
      I=I,
      J=J,
      K1=K1,
      K2=K2,
      omega=omega,
      components=omega * entries,
      layout=layout,
  )


def coopmatrix_layout(M: int, N: int, subgroup_size: int, use: str, dtype) -> Layout:
  """``(work-item p, component v) -> (row, column)``; columns ``>= N`` are padding.

  >>> coopmatrix_layout(1, 17, 16, "matrix_acc", "f32")(0, 1), coopmatrix_layout(1, 17, 16, "acc", "f32")(1, 1)
  ((0, 16), (0, 17))
  """
  return coopmatrix_params(M, N, subgroup_size, use, dtype).layout


def coopmatrix_load(
    memory,
    params: CoopMatrixParams,
    pos,
    shape,
    stride,
    *,
    transpose: bool = False,
    rows_checked: bool = True,
    cols_checked: bool = True,
):
  """The document's SIMT load: every work-item's components, as an (S, V) array.

  Component ``v`` of work-item ``p`` is ``memory[row*stride0 + col*stride1]``
  with ``(row, col) = pos + layout(p, v)``, or 0 where the column is padding
  (``>= N``), or (when checked) the row or column falls outside ``shape``.
  ``transpose`` swaps ``shape`` and ``stride``. ``pos`` may be traced: this is
  jax.numpy and works under ``jit``.

  >>> import jax.numpy as jnp
  >>> p = coopmatrix_params(1, 17, 16, "matrix_acc", "f32")
  >>> coopmatrix_load(jnp.arange(17.0), p, (0, 0), (1, 17), (17, 1))[:3].tolist()
  [[0.0, 16.0], [1.0, 0.0], [2.0, 0.0]]
  """
  import jax.numpy as jnp

  memory = jnp.asarray(memory).reshape(-1)
  shape0, shape1 = shape[::-1] if transpose else shape
  stride0, stride1 = stride[::-1] if transpose else stride
  work_item, component = np.meshgrid(
      np.arange(params.subgroup_size), np.arange(params.components), indexing="ij"
  )
  # through a coordinate tensor with origin (0, 0), so a column that is always 0 is still there
  rel_row, rel_col = np.broadcast_arrays(
      *Tensor(params.layout, None, ArithmeticTuple((0, 0)))(work_item, component)
  )
  row, col = pos[0] + rel_row, pos[1] + rel_col
  ok = jnp.asarray(rel_col < params.N)
  if rows_checked:
    ok = ok & (row >= 0) & (row < shape0)
  if cols_checked:
    ok = ok & (col >= 0) & (col < shape1)
  index = jnp.where(ok, row * stride0 + col * stride1, 0)
  return jnp.where(ok, memory[index], jnp.zeros((), memory.dtype))
