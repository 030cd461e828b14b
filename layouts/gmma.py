"""WGMMA operands in shared memory: swizzle atoms, canonical layouts, descriptors.

Follows PTX ISA §9.7.15.5.1.2 "Shared Memory Matrix Layout"
(``shared/reference/ptx_wgmma_smem_layout.txt``) and §9.7.15.5.1.2.2 "Matrix
Descriptor Format".

Coordinates are ``(mn, k)``: row ``mn`` of the M×K (A) or N×K (B) operand
tile, column ``k``. ``major`` names the dimension whose 16-byte rows are
contiguous: ``"K"`` or ``"MN"``. ``swizzle`` is always a width in bytes:
128, 64, 32, or 0 for none (PTX's "interleave").

Units. Every layout returned here is in units of *elements* of the operand's
dtype, and so is its swizzle. PTX writes its swizzles as ``Swizzle<B,4,3>``
acting on *byte* addresses (B = 1, 2, 3 for 32B, 64B, 128B); on 16-bit
elements that is ``Sw<B,3,3>``, on 32-bit ``Sw<B,2,3>``, on 8-bit
``Sw<B,4,3>`` (:func:`gmma_swizzle`). Bytes and elements are converted only
through the core's ``recast``.

>>> gmma_swizzle("bf16", 128)
Sw<3,3,3>
>>> gmma_smem_layout("bf16", (128, 128), "K")
Sw<3,3,3> o _0 o ((8,16),(64,2)):((64,1024),(1,512))
>>> d = make_gmma_desc(gmma_smem_layout("bf16", (128, 64), "K"), "bf16")
>>> d.swizzle, d.stride_byte_offset, d.m, d.k
(128, 1024, 16, 4)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import dtype_bits
from .int_tuple import is_int
from .layout import Layout, LayoutRight, blocked_product, composition, cosize, local_tile, rank, recast, size
from .swizzle import ComposedLayout, Swizzle
from .tensor import Tensor

__all__ = [
    "GmmaDescriptor",
    "GmmaSmemSpec",
    "gmma_swizzle",
    "gmma_swizzle_atom",
    "gmma_canonical_layout",
    "make_gmma_desc",
    "make_gmma_descs",
    "encode_gmma_desc",
    "gmma_smem_layout",
    "gmma_smem_spec",
]

_SWIZZLES = (128, 64, 32)
"""Swizzle widths in bytes, widest first (0 means none)."""
_LAYOUT_TYPE = {0: 0, 128: 1, 64: 2, 32: 3}
"""Descriptor bits 62-63 for each swizzle width (PTX matrix-descriptor format)."""
_CORE_ROW_BYTES = 16
"""One row of a core matrix: one 128-bit element (PTX's "T" elements)."""
_K_STEP_BYTES = 32
"""The K extent of one WGMMA instruction: 8 tf32, 16 bf16/f16, 32 8-bit."""
_MN_MAJOR_RULE = (
    "WGMMA reads 8-bit and tf32 operands K-major only "
    "(PTX: imm-trans-a/b, the MN-major transpose, exists for .f16/.bf16 alone)"
)


def _operand_bits(dtype) -> int:
  bits = dtype_bits(dtype)
  if bits not in (8, 16, 32):
    raise ValueError(f"WGMMA operands are 8-bit, 16-bit or tf32 elements, got {bits}-bit {dtype!r}")
  return bits


def _check_major(major) -> str:
  if major not in ("K", "MN"):
    raise ValueError(f'major must be "K" or "MN", got {major!r}')
  return major


def _check_swizzle(swizzle) -> int:
  if swizzle not in (0, *_SWIZZLES):
    raise ValueError(f"swizzle must be 128, 64, 32 (bytes) or 0 (none), got {swizzle!r}")
  return swizzle


def _span(swizzle: int) -> int:
  """Bytes of one row of a swizzle atom: the swizzle width, 16 without one."""
  return swizzle or _CORE_ROW_BYTES


def _byte_swizzle(swizzle: int) -> Swizzle:
  """PTX's ``Swizzle<B,4,3>`` on byte addresses (``Sw<0,4,3>`` for none)."""
  return Swizzle((swizzle // _CORE_ROW_BYTES).bit_length() - 1 if swizzle else 0, 4, 3)


def _mode_name(swizzle: int) -> str:
  return f"{swizzle}B-swizzled" if swizzle else "no-swizzle"


def gmma_swizzle(dtype, swizzle: int) -> Swizzle:
  """PTX's swizzle of ``swizzle`` bytes as a swizzle on ``dtype`` elements.

  PTX's ``Swizzle<B,4,3>`` acts on byte addresses; this is the same
  permutation on element offsets (``recast`` of it).

  >>> gmma_swizzle("bf16", 128), gmma_swizzle("tf32", 64), gmma_swizzle("e4m3", 32)
  (Sw<3,3,3>, Sw<2,2,3>, Sw<1,4,3>)
  """
  return recast(_byte_swizzle(_check_swizzle(swizzle)), 8, _operand_bits(dtype))


def gmma_swizzle_atom(dtype, major, swizzle: int) -> ComposedLayout:
  """The swizzle atom of PTX's Table 38, ``(mn, k) -> element offset``.

  In 128-bit elements a K-major atom is 8 rows × (swizzle/16) and an
  MN-major one (swizzle/16) × 8 (8×1 and 1×8 without swizzle); in
  ``dtype`` elements the contiguous side is ``128/bits`` times longer.

  >>> gmma_swizzle_atom("bf16", "K", 128)
  Sw<3,3,3> o _0 o (8,64):(64,1)
  >>> gmma_swizzle_atom("tf32", "MN", 128)
  Sw<3,2,3> o _0 o (32,8):(1,32)
  """
  span = _span(_check_swizzle(swizzle))
  rows = (
      Layout((8, span), (span, 1)) if _check_major(major) == "K" else Layout((span, 8), (1, span))
  )
  return recast(composition(_byte_swizzle(swizzle), rows), 8, _operand_bits(dtype))


def _strides_used(major: str, swizzle: int, m: int, k: int) -> tuple[bool, bool]:
  """Whether the canonical form with these repeat counts has an LBO and an SBO stride."""
  if major == "K":
    return swizzle == 0, m > 1
  if swizzle == 0:
    return k > 1, m > 1
  return m > 1, k > 1


def _canonical_bytes(major: str, swizzle: int, m: int, k: int, lbo, sbo) -> Layout:
  """The "Canonical Layouts" table in bytes (T = 16 bytes); unused strides are 0.

  K-major:  ((8,m),(16,2k)):((span,SBO),(1,LBO)), LBO -> 16 when swizzled;
  MN-major: ((16,w,m),(8,k)):((1,16,X),(span,Y)), X,Y = SBO,LBO without
  swizzle and LBO,SBO with one (w = span/16).
  """
  span = _span(swizzle)
  lbo, sbo = lbo or 0, sbo or 0
  if major == "K":
    return Layout(
        ((8, m), (_CORE_ROW_BYTES, 2 * k)),
        ((span, sbo), (1, lbo if swizzle == 0 else _CORE_ROW_BYTES)),
    )
  mn_stride, k_stride = (sbo, lbo) if swizzle == 0 else (lbo, sbo)
  return Layout(
      ((_CORE_ROW_BYTES, span // _CORE_ROW_BYTES, m), (8, k)),
      ((1, _CORE_ROW_BYTES, mn_stride), (span, k_stride)),
  )


def gmma_canonical_layout(
    major, swizzle: int, dtype, m: int, k: int, lbo=None, sbo=None
) -> ComposedLayout:
  """PTX's canonical layout for ``(major, swizzle)``, in ``dtype`` elements.

  ``m``/``k`` are the table's repeat counts, ``lbo``/``sbo`` the leading and
  stride byte offsets in **bytes** (multiples of 16). A stride the form does
  not have (K-major swizzled LBO; the stride of a repeat count of 1) may be
  left ``None`` and is ignored. T = 128/bits:

  ======== ========= =====================================
  major    swizzle   layout (before ``Sw<B,4,3>`` on bytes)
  ======== ========= =====================================
  MN       none      ((T,1,m),(8,k)):((1,T,SBO),(T,LBO))
  MN       32/64/128 ((T,w,m),(8,k)):((1,T,LBO),(wT,SBO))
  K        none      ((8,m),(T,2k)):((T,SBO),(1,LBO))
  K        32/64/128 ((8,m),(T,2k)):((wT,SBO),(1,T))
  ======== ========= =====================================

  with w = swizzle/16. A swizzled K-major form needs ``2k*16 <= swizzle``:
  its K mode is contiguous and has no stride past one swizzle row, so a
  larger ``k`` would overlap the next row.

  >>> gmma_canonical_layout("K", 0, "tf32", m=2, k=2, lbo=64 * 4, sbo=32 * 4)
  Sw<0,2,3> o _0 o ((8,2),(4,4)):((4,32),(1,64))
  """
  major, swizzle, bits = _check_major(major), _check_swizzle(swizzle), _operand_bits(dtype)
  for name, v in (("m", m), ("k", k)):
    if not is_int(v) or v < 1:
      raise ValueError(f"gmma_canonical_layout: {name} must be a positive int, got {v!r}")
  if major == "K" and swizzle and 2 * k * _CORE_ROW_BYTES > swizzle:
    raise ValueError(
        f"K-major {swizzle}B swizzle: the K extent 2k*16 = {2 * k * _CORE_ROW_BYTES} bytes must fit in "
        f"one {swizzle}-byte swizzle row (the form ((8,m),(T,2k)):((wT,SBO),(1,T)) has no stride for K "
        "beyond it, so it would overlap the next row)"
    )
  lbo_used, sbo_used = _strides_used(major, swizzle, m, k)
  strides = {}
  for name, value, used in (("LBO", lbo, lbo_used), ("SBO", sbo, sbo_used)):
    if not used:
      strides[name] = None
      continue
    if not is_int(value) or value <= 0 or value % _CORE_ROW_BYTES:
      raise ValueError(
          f"gmma_canonical_layout: {name} must be a positive multiple of 16 bytes "
          f"(the descriptor stores {name} >> 4), got {value!r}"
      )
    strides[name] = value
  byte_layout = _canonical_bytes(major, swizzle, m, k, strides["LBO"], strides["SBO"])
  return recast(composition(_byte_swizzle(swizzle), byte_layout), 8, bits)


@dataclass(frozen=True)
class GmmaDescriptor:
  """The fields of a WGMMA shared-memory matrix descriptor.

  Offsets are in bytes. ``leading_byte_offset``/``stride_byte_offset`` are
  ``None`` where the canonical form has no such stride (they encode as 1, the
  value PTX says is "assumed"). ``m``/``k`` are the canonical form's repeat
  counts; ``base_offset`` is PTX's 3-bit pattern offset.
  """

  major: str
  swizzle: int
  start_address: int
  leading_byte_offset: int | None
  stride_byte_offset: int | None
  base_offset: int
  m: int
  k: int


def _descriptor_field(name: str, value: int) -> int:
  """PTX's ``matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4``, checked."""
  if value < 0 or value % _CORE_ROW_BYTES or value >= 1 << 18:
    raise ValueError(
        f"{name} = {value} bytes cannot be encoded: a descriptor stores "
        "(x & 0x3FFFF) >> 4, so x must be a non-negative multiple of 16 below 256 KiB"
    )
  return value >> 4


def encode_gmma_desc(desc: GmmaDescriptor) -> int:
  """The 64-bit descriptor: bits 0-13 start address >> 4, 16-29 LBO >> 4,
  32-45 SBO >> 4, 49-51 base offset, 62-63 swizzle (0 none, 1 128B, 2 64B,
  3 32B). Unused LBO/SBO encode as 1.

  >>> d = make_gmma_desc(gmma_canonical_layout("K", 0, "tf32", 2, 2, lbo=256, sbo=128), "tf32")
  >>> hex(encode_gmma_desc(d))
  '0x800100000'
  """
  unused = _CORE_ROW_BYTES
  lbo = desc.leading_byte_offset if desc.leading_byte_offset is not None else unused
  sbo = desc.stride_byte_offset if desc.stride_byte_offset is not None else unused
  if not 0 <= desc.base_offset < 8:
    raise ValueError(f"base offset {desc.base_offset} does not fit the 3-bit field")
  return (
      _descriptor_field("start address", desc.start_address)
      | _descriptor_field("LBO", lbo) << 16
      | _descriptor_field("SBO", sbo) << 32
      | desc.base_offset << 49
      | _LAYOUT_TYPE[_check_swizzle(desc.swizzle)] << 62
  )


def _parts(smem_layout):
  """(swizzle or None, origin offset, inner Layout), all in elements."""
  origin = 0
  if isinstance(smem_layout, Tensor):
    origin, smem_layout = smem_layout.offset, smem_layout.layout
  if isinstance(smem_layout, ComposedLayout):
    if not isinstance(smem_layout.outer, Swizzle):
      raise ValueError(
          f"a shared-memory layout is a Layout or Swizzle o offset o Layout, got {smem_layout}"
      )
    return smem_layout.outer, origin + smem_layout.offset, smem_layout.inner
  if isinstance(smem_layout, Layout):
    return None, origin, smem_layout
  raise ValueError(f"expected a Layout, ComposedLayout or Tensor, got {smem_layout!r}")


def _swizzle_of(byte_swizzle: Swizzle, element_swizzle, bits: int) -> int:
  if byte_swizzle.bits == 0:
    return 0
  width = _CORE_ROW_BYTES << byte_swizzle.bits
  if (byte_swizzle.base, byte_swizzle.shift) != (4, 3) or width not in _SWIZZLES:
    expected = ", ".join(f"{s}B = {gmma_swizzle(bits, s)}" for s in _SWIZZLES)
    raise ValueError(
        f"the swizzle {element_swizzle} on {bits}-bit elements is {byte_swizzle} on bytes; WGMMA "
        f"swizzles are Sw<B,4,3> on byte addresses, on {bits}-bit elements: {expected}"
    )
  return width


def _major_of(inner: Layout) -> str:
  k_unit = size(inner[1]) > 1 and inner((0, 1)) == 1
  mn_unit = size(inner[0]) > 1 and inner((1, 0)) == 1
  if k_unit and mn_unit:
    raise ValueError(f"{inner}: elements (0,1) and (1,0) share offset 1: the tile overlaps itself")
  if not (k_unit or mn_unit):
    raise ValueError(
        f"{inner}: neither K nor MN steps by one element; WGMMA reads 16-byte rows "
        "contiguous along K (K-major) or along MN (MN-major)"
    )
  return "K" if k_unit else "MN"


def _offset_table(inner: Layout) -> np.ndarray:
  """``table[mn, k] = inner(mn, k)`` for a rank-2 layout."""
  mn, k = size(inner[0]), size(inner[1])
  return np.asarray(inner(np.arange(mn * k))).reshape(k, mn).T


def _require(ok, rule: str):
  if not ok:
    raise ValueError(rule)


def _uniform_stride(offsets: np.ndarray, rule: str):
  """The common step of ``offsets`` (None for one value), else ``ValueError(rule)``."""
  if len(offsets) < 2:
    return None
  step = int(offsets[1] - offsets[0])
  _require(
      np.array_equal(offsets, np.arange(len(offsets)) * step),
      f"{rule}; found offsets {offsets[:8].tolist()}",
  )
  return step


def _match_k_major(table: np.ndarray, swizzle: int):
  rows, k_bytes = table.shape
  span, name = _span(swizzle), _mode_name(swizzle)
  _require(
      rows % 8 == 0,
      f"K-major: the MN extent {rows} must be a multiple of 8 (a core matrix has 8 rows)",
  )
  _require(
      k_bytes % _K_STEP_BYTES == 0,
      f"K-major: the K extent ({k_bytes} bytes) must be a multiple of 32 bytes (the canonical "
      "form's (T,2k): pairs of 16-byte core-matrix columns, one WGMMA K step)",
  )
  _require(
      k_bytes <= span or not swizzle,
      f"K-major {name}: the K extent ({k_bytes} bytes) must fit in one {span}-byte swizzle row: "
      "the canonical form ((8,m),(T,2k)):((wT,SBO),(1,T)) has no stride for K beyond it "
      "(LBO is unused); give each K block its own descriptor (make_gmma_descs)",
  )
  contiguous = k_bytes if swizzle else _CORE_ROW_BYTES
  _require(
      np.array_equal(table[0, :contiguous], np.arange(contiguous)),
      f"K-major {name}: the first {contiguous} bytes along K must be contiguous; "
      f"found offsets {table[0, :contiguous:max(1, contiguous // 8)].tolist()}...",
  )
  _require(
      np.array_equal(table[:8, 0], np.arange(8) * span),
      f"K-major {name}: the 8 rows of a {'swizzle atom' if swizzle else 'core matrix'} must be "
      f"{span} bytes apart; found row offsets {table[:8, 0].tolist()}",
  )
  lbo = (
      None
      if swizzle
      else _uniform_stride(
          table[0, ::_CORE_ROW_BYTES],
          "K-major no-swizzle: the 16-byte K columns must repeat at one stride (LBO)",
      )
  )
  sbo = _uniform_stride(table[::8, 0], "K-major: the 8-row groups must repeat at one stride (SBO)")
  return rows // 8, k_bytes // _K_STEP_BYTES, lbo, sbo


def _match_mn_major(table: np.ndarray, swizzle: int):
  mn_bytes, k_rows = table.shape
  span, name = _span(swizzle), _mode_name(swizzle)
  _require(
      mn_bytes % span == 0,
      f"MN-major {name}: the MN extent ({mn_bytes} bytes) must be a multiple of the {span}-byte atom width",
  )
  _require(
      k_rows % 8 == 0,
      f"MN-major: the K extent {k_rows} must be a multiple of 8 (an atom has 8 K rows)",
  )
  _require(
      np.array_equal(table[:span, 0], np.arange(span)),
      f"MN-major {name}: MN must be contiguous across the {span}-byte atom width",
  )
  _require(
      np.array_equal(table[0, :8], np.arange(8) * span),
      f"MN-major {name}: the 8 K rows of an atom must be {span} bytes apart; "
      f"found {table[0, :8].tolist()}",
  )
  mn_name, k_name = ("SBO", "LBO") if swizzle == 0 else ("LBO", "SBO")
  mn_stride = _uniform_stride(
      table[::span, 0], f"MN-major {name}: atoms along MN must repeat at one stride ({mn_name})"
  )
  k_stride = _uniform_stride(
      table[0, ::8], f"MN-major {name}: 8-row groups along K must repeat at one stride ({k_name})"
  )
  lbo, sbo = (k_stride, mn_stride) if swizzle == 0 else (mn_stride, k_stride)
  return mn_bytes // span, k_rows // 8, lbo, sbo


def _pattern_bytes(swizzle: int) -> int:
  """Where a swizzle's repeating pattern starts: 8 rows of ``swizzle`` bytes."""
  return 8 * swizzle


def make_gmma_desc(smem_layout, dtype, *, smem_address: int = 0) -> GmmaDescriptor:
  """Match ``smem_layout`` to a canonical form and return its descriptor.

  ``smem_layout`` maps ``(mn, k)`` of an M×K or N×K tile to element offsets
  from the start of a shared-memory buffer at byte address
  ``smem_address``: a ``Layout``, a ``Swizzle o offset o Layout`` (swizzle
  in element units, see :func:`gmma_swizzle`), or a ``Tensor`` of one (a
  ``local_tile``). Raises ``ValueError`` naming the violated rule when no
  descriptor describes it. ``base_offset`` follows PTX: 0 when the swizzle
  pattern starts on a multiple of 8 swizzle rows (1024 B for 128B), else
  ``(smem_address >> 7) & 7``.

  >>> d = make_gmma_desc(gmma_canonical_layout("MN", 64, "bf16", 2, 2, lbo=512, sbo=1024), "bf16")
  >>> d.major, d.leading_byte_offset, d.stride_byte_offset
  ('MN', 512, 1024)
  """
  bits = _operand_bits(dtype)
  element_swizzle, origin, inner = _parts(smem_layout)
  if rank(inner) != 2:
    raise ValueError(f"a WGMMA operand is a rank-2 (MN, K) tile, got {inner}")
  major = _major_of(inner)
  if major == "MN" and bits != 16:
    raise ValueError(_MN_MAJOR_RULE)
  view = recast(ComposedLayout(element_swizzle or Swizzle(0, 0, 0), origin, inner), bits, 8)
  swizzle = _swizzle_of(view.outer, element_swizzle, bits)
  table = _offset_table(view.inner)
  m, k, lbo, sbo = (_match_k_major if major == "K" else _match_mn_major)(table, swizzle)
  canonical = _offset_table(_canonical_bytes(major, swizzle, m, k, lbo, sbo))
  wrong = np.argwhere(canonical != table)
  if len(wrong):
    i, j = wrong[0]
    raise ValueError(
        f"not a canonical {major}-major {_mode_name(swizzle)} layout: byte ({i},{j}) of the tile is at "
        f"offset {table[i, j]}, the canonical form with m={m}, k={k}, LBO={lbo}, SBO={sbo} puts it at "
        f"{canonical[i, j]}"
    )
  _require(
      np.unique(table).size == table.size,
      f"the tile overlaps itself (LBO={lbo}, SBO={sbo} bytes make two elements share an address)",
  )
  _require(
      smem_address % _CORE_ROW_BYTES == 0,
      f"smem_address {smem_address} must be a multiple of 16 bytes",
  )
  aligned = swizzle == 0 or smem_address % _pattern_bytes(swizzle) == 0
  desc = GmmaDescriptor(
      major=major,
      swizzle=swizzle,
      start_address=smem_address + int(view.offset),
      leading_byte_offset=lbo,
      stride_byte_offset=sbo,
      base_offset=0 if aligned else (smem_address >> 7) & 7,
      m=m,
      k=k,
  )
  encode_gmma_desc(desc)
  return desc


def make_gmma_descs(smem_layout, dtype, *, smem_address: int = 0) -> tuple[GmmaDescriptor, ...]:
  """One descriptor per WGMMA K step (32 bytes of K) of a tile, in K order.

  A K-major tile wider than one swizzle row is no single canonical layout
  (the K-major swizzled forms have no K stride past the row); a kernel
  issues one instruction per K step anyway, each with its own start address.

  >>> [d.start_address for d in make_gmma_descs(gmma_smem_layout("bf16", (64, 128), "K"), "bf16")]
  [0, 32, 64, 96, 1024, 1056, 1088, 1120]
  """
  bits = _operand_bits(dtype)
  inner = _parts(smem_layout)[2]
  if rank(inner) != 2:
    raise ValueError(f"a WGMMA operand is a rank-2 (MN, K) tile, got {inner}")
  mn, k = size(inner[0]), size(inner[1])
  step = _K_STEP_BYTES * 8 // bits
  if k % step:
    raise ValueError(
        f"the K extent {k} must be a multiple of one WGMMA K step (32 bytes = {step} elements)"
    )
  return tuple(
      make_gmma_desc(local_tile(smem_layout, (mn, step), (0, s)), dtype, smem_address=smem_address)
      for s in range(k // step)
  )


@dataclass(frozen=True)
class GmmaSmemSpec:
  """What a Pallas Mosaic GPU kernel needs for one WGMMA operand buffer.

  - ``layout``: ``(mn, k) -> element offset``, swizzle in element units.
  - ``smem_shape``: the shape of the SMEM ref, ``(mn, k)`` K-major or
    ``(k, mn)`` MN-major (the contiguous dimension last).
  - ``swizzle``: bytes, for ``plgpu.SwizzleTransform`` (0: none, which
    Mosaic GPU's WGMMA does not accept).
  - ``tiling``: ``(8, swizzle*8//bits)`` elements, for ``plgpu.TilingTransform``.
  - ``smem_bytes``: the footprint, for shared-memory budget checks.
  """

  layout: ComposedLayout
  smem_shape: tuple[int, int]
  major: str
  swizzle: int
  tiling: tuple[int, int]
  smem_bytes: int


def gmma_smem_spec(dtype, tile_shape, major, swizzle=None) -> GmmaSmemSpec:
  """The shared-memory layout of a WGMMA operand tile, and its Mosaic transforms.

  ``tile_shape = (mn, k)`` (M×K for A, N×K for B); ``major`` is "K" (K
  contiguous: A as (M, K), B stored (N, K)) or "MN" (16-bit types only: A
  stored (K, M), B as (K, N)). ``swizzle=None`` picks the widest of 128/64/32
  bytes dividing the contiguous dimension in bytes (else none). The layout is
  the one Mosaic's ``TilingTransform((8, S)) + SwizzleTransform(swizzle)``
  gives ``smem_shape``: 8×S tiles in row-major order, each a swizzle atom.

  >>> spec = gmma_smem_spec("bf16", (128, 64), "K")
  >>> spec.swizzle, spec.tiling, spec.smem_shape, spec.smem_bytes
  (128, (8, 64), (128, 64), 16384)
  >>> # transforms=(plgpu.TilingTransform(spec.tiling), plgpu.SwizzleTransform(spec.swizzle))
  >>> gmma_smem_spec("bf16", (128, 32), "MN").layout
  Sw<3,3,3> o _0 o ((64,2),(8,4)):((1,512),(64,1024))
  """
  bits, major = _operand_bits(dtype), _check_major(major)
  if major == "MN" and bits != 16:
    raise ValueError(_MN_MAJOR_RULE)
  if (
      not isinstance(tile_shape, tuple)
      or len(tile_shape) != 2
      or not all(is_int(n) and n > 0 for n in tile_shape)
  ):
    raise ValueError(f"tile_shape must be (mn, k) positive ints, got {tile_shape!r}")
  mn, k = tile_shape
  k_step = _K_STEP_BYTES * 8 // bits
  if k % k_step:
    raise ValueError(
        f"the K extent {k} must be a multiple of one WGMMA K step (32 bytes = {k_step} elements)"
    )
  contiguous_bytes = (k if major == "K" else mn) * bits // 8
  if swizzle is None:
    swizzle = next((s for s in _SWIZZLES if contiguous_bytes % s == 0), 0)
  span = _span(_check_swizzle(swizzle))
  if contiguous_bytes % span:
    raise ValueError(
        f"the contiguous dimension ({contiguous_bytes} bytes) must be a multiple of the "
        f"{span}-byte swizzle span"
    )
  if major == "K" and mn % 8:
    raise ValueError(
        f"K-major: the MN extent {mn} must be a multiple of 8 (a core matrix has 8 rows)"
    )
  atom = gmma_swizzle_atom(bits, major, swizzle)
  atom_mn, atom_k = size(atom.inner[0]), size(atom.inner[1])
  grid = (
      Layout((mn // atom_mn, k // atom_k), LayoutRight)
      if major == "K"
      else Layout((mn // atom_mn, k // atom_k))
  )
  layout = composition(atom.outer, blocked_product(atom.inner, grid))
  tiling = (8, span * 8 // bits)
  return GmmaSmemSpec(
      layout=layout,
      smem_shape=(mn, k) if major == "K" else (k, mn),
      major=major,
      swizzle=swizzle,
      tiling=tiling,
      smem_bytes=cosize(recast(layout, bits, 8)),
  )


def gmma_smem_layout(dtype, tile_shape, major, swizzle=None) -> ComposedLayout:
  """The layout a kernel should give a WGMMA operand tile: ``gmma_smem_spec(...).layout``.

  >>> gmma_smem_layout("bf16", (128, 64), "K")  # 128 rows of one 128-byte swizzle row each
  Sw<3,3,3> o _0 o (128,64):(64,1)
  """
  return gmma_smem_spec(dtype, tile_shape, major, swizzle).layout
