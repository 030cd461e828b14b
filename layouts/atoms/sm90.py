"""Hopper's warpgroup MMA, ``wgmma.mma_async.sync.aligned.m64nNkK``.

128 threads (4 warps) compute a ``64 x N x K`` product. B always comes from
shared memory through a descriptor; A too (``_SS``) or from registers
(``_RS``). In shared memory there is no per-thread split: every thread sees
the whole tile, ``(T128, (M, K)) -> m + M*k`` with thread stride 0. Register
fragments (A of ``_RS``, and C) follow
:func:`~layouts.atoms.fragments.mma_fragment` with warp ``w`` on rows
``16w .. 16w+15``. Only 16-bit inputs may be MN-major; the others are K-major
only, which CuTe marks with a ``_TN`` suffix.

>>> atom = next(a for a in sm90_atoms() if a.name == "SM90_64x128x16_F32BF16BF16_SS")
>>> atom.c_layout
((4,8,4),(2,2,16)):((128,1,16),(64,8,512))
>>> atom.a_layout
(128,(64,16)):(0,(1,64))
"""

from __future__ import annotations

from ..dtypes import dtype_bits
from ..layout import Layout, size
from .fragments import mma_fragment
from .mma_atom import MMAAtom, MMAOperation, MMATraits, Registers, registers_for

__all__ = ["sm90_atoms", "GMMA_N_DENSE", "GMMA_N_INTEGER"]

GMMA_N_DENSE = tuple(range(8, 257, 8))
"""N of ``wgmma`` for f16, bf16, tf32 and FP8 inputs: 8, 16, ..., 256."""
GMMA_N_INTEGER = (8, 16, 24) + tuple(range(32, 257, 16))
"""N of ``wgmma`` for s8/u8 inputs: 8, 16, 24, then 32, 48, ..., 256."""

_FP8 = ("e4m3", "e5m2")
_FAMILIES = [  # (K, [(accumulator, a, b), ...], N values, inputs may be MN-major)
    (
        16,
        [("f16", "f16", "f16"), ("f32", "f16", "f16"), ("f32", "bf16", "bf16")],
        GMMA_N_DENSE,
        True,
    ),
    (8, [("f32", "tf32", "tf32")], GMMA_N_DENSE, False),
    (32, [(acc, a, b) for acc in ("f16", "f32") for a in _FP8 for b in _FP8], GMMA_N_DENSE, False),
    (32, [("s32", a, b) for a in ("s8", "u8") for b in ("s8", "u8")], GMMA_N_INTEGER, False),
]

_DESCRIPTOR = Registers("uint64_t", 1)
"""A shared-memory matrix descriptor."""


def smem_layout(rows: int, k: int) -> Layout:
  """``(T128, (rows, K)) -> row + rows*k``: every thread sees the whole tile.

  >>> smem_layout(64, 16)
  (128,(64,16)):(0,(1,64))
  """
  return Layout((128, (rows, k)), (0, (1, rows)))


def _atom(
    n: int, k: int, acc: str, a: str, b: str, a_in_registers: bool, transposable: bool
) -> MMAAtom:
  source = "RS" if a_in_registers else "SS"
  name = f"SM90_64x{n}x{k}_{acc.upper()}{a.upper()}{b.upper()}_{source}" + (
      "" if transposable else "_TN"
  )
  majors = ("K", "MN") if transposable else ("K",)
  if a_in_registers:
    a_layout = mma_fragment(64, k, pack=32 // dtype_bits(a), warps=4)
    a_registers = registers_for(a, size(a_layout[1]))
  else:
    a_layout, a_registers = smem_layout(64, k), _DESCRIPTOR
  c_layout = mma_fragment(64, n, pack=2, warps=4)
  operation = MMAOperation(
      name=name,
      ptx=f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{acc}.{a}.{b}",
      d_registers=None,
      a_registers=a_registers,
      b_registers=_DESCRIPTOR,
      c_registers=registers_for(acc, size(c_layout[1])),
      a_major=("K",) if a_in_registers else majors,
      b_major=majors,
      a_source="rmem" if a_in_registers else "smem",
      b_source="smem",
  )
  traits = MMATraits(
      d_type=acc,
      a_type=a,
      b_type=b,
      c_type=acc,
      shape_mnk=(64, n, k),
      thr_id=Layout(128),
      a_layout=a_layout,
      b_layout=smem_layout(n, k),
      c_layout=c_layout,
  )
  return MMAAtom(operation, traits)


def sm90_atoms():
  """Every dense ``wgmma``: each type combination and N, with A in shared
  memory (``_SS``) and in registers (``_RS``)."""
  return [
      _atom(n, k, *types, a_in_registers, transposable)
      for k, family, ns, transposable in _FAMILIES
      for types in family
      for a_in_registers in (False, True)
      for n in ns
  ]
