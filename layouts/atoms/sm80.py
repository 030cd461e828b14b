"""Ampere's warp-wide ``mma.sync.aligned.m16n8kK`` (and Ada's FP8 variants).

All 32 lanes of a warp compute a ``16 x 8 x K`` product; A is row-major and B
column-major (both K-major, ``_TN``). Every fragment follows the PTX rule of
:func:`~layouts.atoms.fragments.mma_fragment`. FP8 (``e4m3``/``e5m2``) needs
SM89, so those atoms are named ``SM89_...`` as in CuTe.

>>> atom = next(a for a in sm80_atoms() if a.name == "SM80_16x8x16_F32BF16BF16F32_TN")
>>> atom.a_layout, atom.c_layout
(((4,8),(2,2,2)):((32,1),(16,8,128)), ((4,8),(2,2)):((32,1),(16,8)))
"""

from __future__ import annotations

from ..dtypes import dtype_bits
from ..layout import Layout, size
from .fragments import mma_fragment
from .mma_atom import MMAAtom, MMAOperation, MMATraits, registers_for

__all__ = ["sm80_atoms"]

_16BIT = [
    ("f16", "f16", "f16"),
    ("f32", "f16", "f16"),
    ("f32", "bf16", "bf16"),
]  # (accumulator, a, b)
_INT8 = [("s32", a, b) for a in ("s8", "u8") for b in ("s8", "u8")]
_FP8 = [(acc, a, b) for acc in ("f32", "f16") for a in ("e4m3", "e5m2") for b in ("e4m3", "e5m2")]

_FAMILIES = [  # (K, [(accumulator, a, b), ...])
    (8, _16BIT + [("f32", "tf32", "tf32")]),
    (16, _16BIT + _INT8),
    (32, _INT8 + _FP8),
]


def _atom(k: int, acc: str, a: str, b: str) -> MMAAtom:
  arch = "SM89" if a.startswith("e") else "SM80"
  name = f"{arch}_16x8x{k}_{acc.upper()}{a.upper()}{b.upper()}{acc.upper()}_TN"
  a_layout = mma_fragment(16, k, pack=32 // dtype_bits(a))
  b_layout = mma_fragment(8, k, pack=32 // dtype_bits(b))
  c_layout = mma_fragment(16, 8, pack=2)
  c_registers = registers_for(acc, size(c_layout[1]))
  operation = MMAOperation(
      name=name,
      ptx=f"mma.sync.aligned.m16n8k{k}.row.col.{acc}.{a}.{b}.{acc}",
      d_registers=c_registers,
      a_registers=registers_for(a, size(a_layout[1])),
      b_registers=registers_for(b, size(b_layout[1])),
      c_registers=c_registers,
      a_major=("K",),
      b_major=("K",),
  )
  traits = MMATraits(
      d_type=acc,
      a_type=a,
      b_type=b,
      c_type=acc,
      shape_mnk=(16, 8, k),
      thr_id=Layout(32),
      a_layout=a_layout,
      b_layout=b_layout,
      c_layout=c_layout,
  )
  return MMAAtom(operation, traits)


def sm80_atoms():
  """m16n8k8 (f16, bf16, tf32), m16n8k16 (f16, bf16, s8/u8), m16n8k32 (s8/u8, e4m3/e5m2)."""
  return [_atom(k, *types) for k, family in _FAMILIES for types in family]
