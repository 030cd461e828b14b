"""An MMA atom: a hardware instruction (Operation) plus what it means (Traits).

CuTe splits every MMA atom in two (``cute_mma_atoms.md``). The *Operation*
names the PTX instruction and the register arrays each thread passes to it.
The *Traits* say what those registers hold: the element types of D, A, B and
C, the ``M x N x K`` shape, ``thr_id`` (logical thread -> thread index in the
warp or warpgroup) and three thread-value layouts mapping ``(thread, value)``
to a coordinate of a tile, encoded column-major:

* ``a_layout``: ``(T, V) -> m + M*k`` in the ``M x K`` tile of A;
* ``b_layout``: ``(T, V) -> n + N*k`` in the ``N x K`` tile of B;
* ``c_layout``: ``(T, V) -> m + M*n`` in the ``M x N`` tile of C and D.

>>> from layouts.atoms import mma_atom
>>> atom = mma_atom("SM70_8x8x4_F32F16F16F32_NT")
>>> atom.shape_mnk, atom.c_layout
((8, 8, 4), ((2,2,2),(2,2,2)):((1,16,4),(8,2,32)))
>>> atom.c_layout(4, 0), atom.thr_id(4)  # logical thread 4 is lane 16; its V0 is (m, n) = (4, 0)
(4, 16)
>>> str(atom.operation.a_registers)
'uint32_t[2]'
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import dtype_bits
from ..layout import Layout, size

__all__ = ["Registers", "MMAOperation", "MMATraits", "MMAAtom", "registers_for"]


@dataclass(frozen=True)
class Registers:
  """A per-thread register array of one operand, written as CuTe does.

  >>> str(Registers("float", 8))
  'float[8]'
  """

  ctype: str
  count: int

  def __str__(self) -> str:
    return f"{self.ctype}[{self.count}]"


def registers_for(dtype: str, values: int) -> Registers:
  """The registers holding ``values`` elements of ``dtype`` in one thread:
  ``float`` for f32, otherwise packed into 32-bit ``uint32_t`` words.

  >>> str(registers_for("f16", 8)), str(registers_for("f32", 4))
  ('uint32_t[4]', 'float[4]')
  """
  if dtype == "f32":
    return Registers("float", values)
  bits = dtype_bits(dtype) * values
  if bits % 32:
    raise ValueError(f"registers_for: {values} x {dtype} do not fill whole 32-bit registers")
  return Registers("uint32_t", bits // 32)


@dataclass(frozen=True)
class MMAOperation:
  """The instruction: its CuTe name, PTX opcode and per-thread registers.

  ``a_source``/``b_source`` is ``"rmem"`` (registers) or ``"smem"`` (a
  shared-memory descriptor, as for Hopper's ``wgmma``); ``a_major`` and
  ``b_major`` list the majornesses (``"K"``, ``"MN"``) the instruction
  accepts. ``d_registers`` is ``None`` when D is C, updated in place.
  """

  name: str
  ptx: str
  d_registers: Registers | None
  a_registers: Registers
  b_registers: Registers
  c_registers: Registers
  a_major: tuple[str, ...]
  b_major: tuple[str, ...]
  a_source: str = "rmem"
  b_source: str = "rmem"


@dataclass(frozen=True)
class MMATraits:
  """What the registers mean: element types, shape and TV layouts."""

  d_type: str
  a_type: str
  b_type: str
  c_type: str
  shape_mnk: tuple[int, int, int]
  thr_id: Layout
  a_layout: Layout
  b_layout: Layout
  c_layout: Layout


@dataclass(frozen=True)
class MMAAtom:
  """An Operation with its Traits; the traits' fields read through."""

  operation: MMAOperation
  traits: MMATraits

  @property
  def name(self) -> str:
    return self.operation.name

  @property
  def shape_mnk(self) -> tuple[int, int, int]:
    return self.traits.shape_mnk

  @property
  def thr_id(self) -> Layout:
    return self.traits.thr_id

  @property
  def a_layout(self) -> Layout:
    return self.traits.a_layout

  @property
  def b_layout(self) -> Layout:
    return self.traits.b_layout

  @property
  def c_layout(self) -> Layout:
    return self.traits.c_layout

  @property
  def num_threads(self) -> int:
    """Threads taking part: 8 (quadpair), 32 (warp) or 128 (warpgroup)."""
    return size(self.thr_id)

  def operand(self, which: str) -> tuple[Layout, tuple[int, int]]:
    """``(tv_layout, tile_shape)`` of operand ``"a"`` (M x K), ``"b"``
    (N x K) or ``"c"`` (M x N).

    >>> from layouts.atoms import mma_atom
    >>> mma_atom("SM80_16x8x8_F32TF32TF32F32_TN").operand("b")
    (((4,8),2):((8,1),32), (8, 8))
    """
    m, n, k = self.shape_mnk
    tiles = {
        "a": (self.a_layout, (m, k)),
        "b": (self.b_layout, (n, k)),
        "c": (self.c_layout, (m, n)),
    }
    if which not in tiles:
      raise ValueError(f"operand must be 'a', 'b' or 'c', got {which!r}")
    return tiles[which]

  def __repr__(self) -> str:
    return f"MMAAtom({self.name})"
