"""WGMMA shared-memory layouts and descriptors against PTX §9.7.15.5.1.2
(``shared/reference/ptx_wgmma_smem_layout.txt``, quoted below as "the document")."""

import doctest
import itertools

import numpy as np
import pytest

import layouts.dtypes
import layouts.gmma
from layouts import Layout, Swizzle, composition, local_tile, recast, size
from layouts.dtypes import dtype_bits
from layouts.gmma import (
    encode_gmma_desc,
    gmma_canonical_layout,
    gmma_smem_layout,
    gmma_smem_spec,
    gmma_swizzle,
    gmma_swizzle_atom,
    make_gmma_desc,
    make_gmma_descs,
)

SWIZZLES = (0, 32, 64, 128)
BITS = (8, 16, 32)


def offsets(layout):
  """All offsets of a rank-2 layout (or Tensor of one) as an (MN, K) table."""
  origin = getattr(layout, "offset", 0) if not hasattr(layout, "outer") else 0
  layout = getattr(layout, "layout", layout)
  mn, k = size(layout[0]), size(layout[1])
  i, j = np.meshgrid(np.arange(mn), np.arange(k), indexing="ij")
  return origin + np.asarray(layout((i, j)))


def is_injective(layout) -> bool:
  table = offsets(layout)
  return np.unique(table).size == table.size


def doc_layout(swizzle_bytes, text, dtype):
  """The document's ``Swizzle<B,4,3> o layout``: the swizzle acts on bytes,
  the layout is in elements; in our algebra both must be in elements."""
  return composition(gmma_swizzle(dtype, swizzle_bytes), Layout.parse(text))


def test_docstring_examples():
  for module in (layouts.gmma, layouts.dtypes):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize(
    "name,bits",
    [
        ("bf16", 16),
        ("bfloat16", 16),
        ("f16", 16),
        ("float16", 16),
        ("tf32", 32),
        ("float32", 32),
        ("float8_e4m3fn", 8),
        ("float8_e5m2", 8),
        ("e4m3", 8),
        ("int8", 8),
        ("s8", 8),
        ("u8", 8),
        ("int4", 4),
    ],
)
def test_dtype_bits_names(name, bits):
  assert dtype_bits(name) == bits


def test_dtype_bits_numpy_and_jax():
  jnp = pytest.importorskip("jax.numpy")
  import jax

  assert [
      dtype_bits(d) for d in (np.float32, np.int8, jnp.bfloat16, jnp.float8_e4m3fn, jnp.float16)
  ] == [32, 8, 16, 8, 16]
  assert dtype_bits(jax.ShapeDtypeStruct((4,), jnp.bfloat16)) == 16
  assert dtype_bits(np.zeros(2, np.float16)) == 16
  with pytest.raises(ValueError, match="not a dtype"):
    dtype_bits("no-such-type")


# -- swizzles and Table 38 -----------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("swizzle", SWIZZLES)
def test_gmma_swizzle_is_ptx_byte_swizzle_in_elements(swizzle, bits):
  sw = gmma_swizzle(bits, swizzle)
  b = {0: 0, 32: 1, 64: 2, 128: 3}[swizzle]
  assert recast(sw, bits, 8) == Swizzle(b, 4, 3)
  assert sw == Swizzle(b, 4 - (bits // 8).bit_length() + 1, 3)  # 8: M=4, 16: M=3, 32: M=2


# Table 38, in 128-bit elements, as (MN extent, K extent).
TABLE_38 = {
    (128, "MN"): (8, 8),
    (128, "K"): (8, 8),
    (64, "MN"): (4, 8),
    (64, "K"): (8, 4),
    (32, "MN"): (2, 8),
    (32, "K"): (8, 2),
    (0, "MN"): (1, 8),
    (0, "K"): (8, 1),
}


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("swizzle,major", TABLE_38)
def test_swizzle_atoms_are_table_38(swizzle, major, bits):
  atom = gmma_swizzle_atom(bits, major, swizzle)
  shape_128b = tuple(size(m) for m in recast(atom, bits, 128).inner)
  assert shape_128b == TABLE_38[swizzle, major]
  # "multiplied along the leading dimension by a factor of 128/sizeof_bits(Element)"
  t = 128 // bits
  mn, k = TABLE_38[swizzle, major]
  assert (size(atom.inner[0]), size(atom.inner[1])) == (
      (mn, k * t) if major == "K" else (mn * t, k)
  )
  assert is_injective(atom) and atom.cosize == size(atom)


def test_table_38_tf32_example():
  # "128B MN major swizzle atom would have a shape of (8*(128/32))x8 = 32x8 for tf32"
  atom = gmma_swizzle_atom("tf32", "MN", 128)
  assert (size(atom.inner[0]), size(atom.inner[1])) == (32, 8)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("swizzle", (32, 64, 128))
def test_swizzle_permutes_16_byte_chunks_by_row(swizzle, bits):
  """Sw<B,4,3> on bytes: the 16-byte chunk c of row r lands at chunk c XOR
  (bits 7.. of the row's byte address): rows are ``swizzle`` bytes long."""
  atom = gmma_swizzle_atom(bits, "K", swizzle)
  table_bytes = offsets(atom) * bits // 8
  chunks = swizzle // 16
  r, c = np.meshgrid(np.arange(8), np.arange(table_bytes.shape[1]), indexing="ij")
  chunk_of_c = c * bits // 8 // 16
  assert np.array_equal(table_bytes // swizzle, r)
  assert np.array_equal(table_bytes % swizzle // 16, chunk_of_c ^ ((r * swizzle >> 7) % chunks))


# -- the "Canonical Layouts" table ------------------------------------------------


def table_formula(major, swizzle, t, m, k, lbo, sbo):
  """The document's table with T substituted, strides in elements."""
  if major == "MN" and swizzle == 0:
    return Layout(((t, 1, m), (8, k)), ((1, t, sbo), (t, lbo)))
  if major == "MN":
    w = swizzle // 16
    return Layout(((t, w, m), (8, k)), ((1, t, lbo), (w * t, sbo)))
  if swizzle == 0:
    return Layout(((8, m), (t, 2 * k)), ((t, sbo), (1, lbo)))
  w = swizzle // 16
  return Layout(((8, m), (t, 2 * k)), ((w * t, sbo), (1, t)))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("major,swizzle", list(itertools.product(("K", "MN"), SWIZZLES)))
def test_canonical_layouts_are_the_table(major, swizzle, bits):
  t, e = 128 // bits, bits // 8
  m, k = 3, 1 if (major == "K" and swizzle == 32) else 2
  lbo, sbo = 4096, 8192  # bytes: far apart, so every stride is visible
  expected = composition(
      gmma_swizzle(bits, swizzle), table_formula(major, swizzle, t, m, k, lbo // e, sbo // e)
  )
  # (K-major swizzled: LBO is "not used", the table's K stride is T)
  assert gmma_canonical_layout(major, swizzle, bits, m, k, lbo=lbo, sbo=sbo) == expected


def canonical_strides(major, swizzle, m, k, order):
  """Non-overlapping (LBO, SBO) in bytes: the MN repeats first ("mn") or the K repeats first ("k")."""
  atom = 8 * (swizzle or 16)
  k_count = 2 * k if major == "K" and swizzle == 0 else (1 if major == "K" else k)
  mn_first = {"mn": atom, "k": atom * k_count}[order]
  k_first = {"mn": atom * m, "k": atom}[order]
  pad = 16 * (m + k)  # padding between repeats is allowed
  mn_stride, k_stride = mn_first + (pad if order == "k" else 0), k_first + (
      pad if order == "mn" else 0
  )
  if major == "K":
    return (k_stride if swizzle == 0 else None), mn_stride
  return (k_stride, mn_stride) if swizzle == 0 else (mn_stride, k_stride)


def round_trip_cases():
  for major, swizzle, bits in itertools.product(("K", "MN"), SWIZZLES, BITS):
    k_range = range(1, (swizzle // 32 if major == "K" and swizzle else 3) + 1)
    for m, k, order in itertools.product((1, 2, 3), k_range, ("mn", "k")):
      yield major, swizzle, bits, m, k, order


@pytest.mark.parametrize("major,swizzle,bits,m,k,order", list(round_trip_cases()))
def test_canonical_layout_round_trips_through_descriptor(major, swizzle, bits, m, k, order):
  lbo, sbo = canonical_strides(major, swizzle, m, k, order)
  layout = gmma_canonical_layout(major, swizzle, bits, m, k, lbo=lbo, sbo=sbo)
  assert is_injective(layout)
  if major == "MN" and bits != 16:
    with pytest.raises(ValueError, match="WGMMA reads 8-bit and tf32 operands K-major only"):
      make_gmma_desc(layout, bits)
    return
  desc = make_gmma_desc(layout, bits)
  lbo_used, sbo_used = layouts.gmma._strides_used(major, swizzle, m, k)
  assert (desc.major, desc.swizzle, desc.m, desc.k) == (major, swizzle, m, k)
  assert desc.leading_byte_offset == (lbo if lbo_used else None)
  assert desc.stride_byte_offset == (sbo if sbo_used else None)
  assert (desc.start_address, desc.base_offset) == (0, 0)


# -- the document's worked examples --------------------------------------------------

DOC_EXAMPLES = [
    # (major, swizzle, dtype, exact layout, T, m, k, LBO bytes, SBO bytes, LBO enc, SBO enc)
    ("K", 0, "tf32", "((8,2),(4,4)):((4,32),(1,64))", 4, 2, 2, 64 * 4, 32 * 4, 16, 8),
    ("MN", 0, "bf16", "((8,1,2),(8,2)):((1,8,64),(8,128))", 8, 2, 2, 128 * 2, 64 * 2, 16, 8),
    ("MN", 32, "bf16", "((8,2,2),(8,2)):((1,8,128),(16,256))", 8, 2, 2, 128 * 2, 256 * 2, 16, 32),
    ("MN", 64, "bf16", "((8,4,2),(8,2)):((1,8,256),(32,512))", 8, 2, 2, 256 * 2, 512 * 2, 32, 64),
]


@pytest.mark.parametrize("major,swizzle,dtype,text,t,m,k,lbo,sbo,lbo_enc,sbo_enc", DOC_EXAMPLES)
def test_document_examples(major, swizzle, dtype, text, t, m, k, lbo, sbo, lbo_enc, sbo_enc):
  exact = doc_layout(swizzle, text, dtype)
  assert is_injective(exact)
  assert 128 // dtype_bits(dtype) == t
  assert gmma_canonical_layout(major, swizzle, dtype, m, k, lbo=lbo, sbo=sbo) == exact
  desc = make_gmma_desc(exact, dtype)
  assert (desc.major, desc.swizzle, desc.m, desc.k) == (major, swizzle, m, k)
  assert (desc.leading_byte_offset, desc.stride_byte_offset) == (lbo, sbo)
  bits = encode_gmma_desc(desc)
  assert ((bits >> 16) & 0x3FFF, (bits >> 32) & 0x3FFF) == (lbo_enc, sbo_enc)
  assert bits >> 62 == {0: 0, 128: 1, 64: 2, 32: 3}[swizzle]


def test_document_k_major_32b_tf32_example_is_wrong():
  # The document: "K-Major, 32B swizzling and tf32 type ...
  #   Exact layout : Swizzle<1,4,3> o ((8,2),(4,4)):((8,64),(1,4))
  #   T 4, m 2, k 2, LBO NA, SBO 64*sizeof(tf32), Encoding of SBO (SBO) >> 4 = 16".
  # Its K mode (4,4):(1,4) runs 16 tf32 = 64 bytes along a row, but the rows of
  # a 32B atom are 8 tf32 = 32 bytes apart: row 1 starts where K = 8 of row 0 is.
  exact = doc_layout(32, "((8,2),(4,4)):((8,64),(1,4))", "tf32")
  assert not is_injective(exact)
  assert exact((1, 0)) == exact((0, 8))
  # The table's formula ((8,m),(T,2k)):((2T,SBO),(1,T)) with k = 2 is that same overlap:
  with pytest.raises(ValueError, match="must fit in one 32-byte swizzle row"):
    gmma_canonical_layout("K", 32, "tf32", m=2, k=2, sbo=64 * 4)
  with pytest.raises(ValueError, match="must fit in one 32-byte swizzle row"):
    make_gmma_desc(exact, "tf32")
  # Correct: a 32B K-major form holds k = 1 (one 32-byte K step). With the
  # document's T, m and SBO it is ((8,2),(4,2)):((8,64),(1,4)), SBO encoded 16:
  one_step = doc_layout(32, "((8,2),(4,2)):((8,64),(1,4))", "tf32")
  assert one_step == gmma_canonical_layout("K", 32, "tf32", m=2, k=1, sbo=64 * 4)
  desc = make_gmma_desc(one_step, "tf32")
  assert (desc.stride_byte_offset, desc.leading_byte_offset, desc.k) == (256, None, 1)
  assert ((encode_gmma_desc(desc) >> 32) & 0x3FFF, (encode_gmma_desc(desc) >> 16) & 0x3FFF) == (
      16,
      1,
  )
  # And the 16x16 tf32 tile the example meant: two 32-byte K atoms, one descriptor each.
  tile = doc_layout(32, "((8,2),((4,2),2)):((8,64),((1,4),128))", "tf32")
  assert is_injective(tile)
  descs = make_gmma_descs(tile, "tf32")
  assert [(d.start_address, d.stride_byte_offset) for d in descs] == [(0, 256), (512, 256)]


def test_column_major_blas_a_is_mn_major():
  # The document: "In a column-major default BLAS library such as cuBLAS ...
  #   Non-Transposed: A K-major; Transposed: A M-major".
  # A non-transposed column-major M×K matrix has M contiguous: element (i, k)
  # is at i + k*lda. That is MN-major (and the transposed one is K-major).
  a_col_major = composition(gmma_swizzle("bf16", 128), Layout((64, 16), (1, 64)))
  assert make_gmma_desc(a_col_major, "bf16").major == "MN"
  a_transposed = composition(gmma_swizzle("bf16", 128), Layout((16, 64), (64, 1)))
  assert make_gmma_desc(a_transposed, "bf16").major == "K"


# -- descriptor fields and rules -----------------------------------------------------


def test_encoding_bit_positions():
  desc = layouts.gmma.GmmaDescriptor(
      major="K",
      swizzle=64,
      start_address=0x1230,
      leading_byte_offset=0x40,
      stride_byte_offset=0x400,
      base_offset=5,
      m=1,
      k=1,
  )
  bits = encode_gmma_desc(desc)
  assert bits & 0x3FFF == 0x123
  assert (bits >> 16) & 0x3FFF == 0x4
  assert (bits >> 32) & 0x3FFF == 0x40
  assert (bits >> 49) & 0x7 == 5
  assert bits >> 62 == 2
  assert bits & ~(0x3FFF | 0x3FFF << 16 | 0x3FFF << 32 | 0x7 << 49 | 0x3 << 62) == 0


def test_start_address_and_base_offset():
  layout = gmma_smem_layout("bf16", (64, 64), "K")
  assert make_gmma_desc(layout, "bf16", smem_address=2048).start_address == 2048
  assert make_gmma_desc(layout, "bf16", smem_address=2048).base_offset == 0
  # PTX: base offset = (pattern start addr >> 7) & 7 when not on a 1024-byte boundary (128B)
  assert make_gmma_desc(layout, "bf16", smem_address=2048 + 384).base_offset == 3
  with pytest.raises(ValueError, match="multiple of 16 bytes"):
    make_gmma_desc(layout, "bf16", smem_address=8)
  with pytest.raises(ValueError, match="start address .* cannot be encoded"):
    make_gmma_desc(layout, "bf16", smem_address=1 << 18)


@pytest.mark.parametrize(
    "layout,dtype,rule",
    [
        # the byte swizzle used on elements: Sw<3,4,3> on bf16 is Sw<3,5,3> on bytes
        (
            composition(Swizzle(3, 4, 3), Layout((64, 64), (64, 1))),
            "bf16",
            r"Sw<3,5,3> on bytes.*128B = Sw<3,3,3>",
        ),
        # plain row-major tile without swizzle: rows 128 bytes apart, not 16
        (Layout((64, 64), (64, 1)), "bf16", "8 rows of a core matrix must be 16 bytes apart"),
        (
            composition(gmma_swizzle("bf16", 128), Layout((64, 8), (64, 1))),
            "bf16",
            "multiple of 32 bytes",
        ),
        (
            composition(gmma_swizzle("bf16", 128), Layout((12, 64), (64, 1))),
            "bf16",
            "multiple of 8",
        ),
        (
            composition(gmma_swizzle("bf16", 128), Layout((64, 64), (128, 1))),
            "bf16",
            "must be 128 bytes apart",
        ),
        (
            composition(gmma_swizzle("bf16", 64), Layout((32, 64), (1, 64))),
            "bf16",
            "must be 64 bytes apart",
        ),
        (
            composition(gmma_swizzle("bf16", 64), Layout((64, 16), (1, 64))),
            "bf16",
            "must be 64 bytes apart",
        ),
        (Layout((16, 16), (16, 2)), "bf16", "neither K nor MN"),
        (Layout((16, 16, 2), (16, 1, 256)), "bf16", "rank-2"),
        (
            composition(gmma_swizzle("e4m3", 128), Layout((128, 64), (1, 128))),
            "e4m3",
            "K-major only",
        ),
        (gmma_canonical_layout("K", 0, "bf16", 2, 1, lbo=16, sbo=128), "bf16", "overlaps itself"),
        (
            Layout(((8, 2), (8, 2)), ((8, 132), (1, 64))),
            "bf16",
            "SBO = 264 bytes cannot be encoded",
        ),
        (
            Layout(((8, (2, 2)), (8, 2)), ((8, (64, 256)), (1, 128))),
            "bf16",
            r"repeat at one stride \(SBO\)",
        ),
    ],
)
def test_rules_are_named(layout, dtype, rule):
  with pytest.raises(ValueError, match=rule):
    make_gmma_desc(layout, dtype)


# -- gmma_smem_layout / gmma_smem_spec ----------------------------------------------


def mosaic_offsets(bits, smem_shape, swizzle):
  """Element offset of ``ref[r, c]`` under Mosaic's TilingTransform((8, S)) then
  SwizzleTransform(swizzle): row-major 8×S tiles, each swizzled on byte addresses."""
  rows, cols = smem_shape
  s = (swizzle or 16) * 8 // bits
  r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
  linear = ((r // 8) * (cols // s) + c // s) * 8 * s + (r % 8) * s + c % s
  byte = linear * bits // 8
  if swizzle:
    mask = (swizzle // 16 - 1) << 4
    byte = byte ^ ((byte >> 3) & mask)
  return byte // (bits // 8)


SMEM_CASES = [
    ("bf16", (128, 64), "K", 128),
    ("bf16", (64, 128), "K", 128),
    ("bf16", (128, 32), "K", 64),
    ("bf16", (64, 16), "K", 32),
    ("bf16", (64, 48), "K", 32),
    ("f16", (256, 64), "K", 128),
    ("e4m3", (128, 128), "K", 128),
    ("int8", (64, 96), "K", 32),
    ("tf32", (64, 32), "K", 128),
    ("tf32", (128, 8), "K", 32),
    ("bf16", (128, 64), "MN", 128),
    ("bf16", (256, 16), "MN", 128),
    ("bf16", (32, 64), "MN", 64),
    ("bf16", (16, 32), "MN", 32),
    ("bf16", (8, 16), "MN", 0),
    ("bf16", (24, 16), "MN", 0),
]


@pytest.mark.parametrize("dtype,tile,major,swizzle", SMEM_CASES)
def test_gmma_smem_spec_is_mosaics_tiled_swizzled_layout(dtype, tile, major, swizzle):
  bits = dtype_bits(dtype)
  spec = gmma_smem_spec(dtype, tile, major)
  assert spec.swizzle == swizzle
  assert spec.tiling == (8, (swizzle or 16) * 8 // bits)
  assert spec.smem_shape == (tile if major == "K" else tile[::-1])
  assert spec.smem_bytes == tile[0] * tile[1] * bits // 8
  table = offsets(spec.layout)  # [mn, k]
  ref = table if major == "K" else table.T
  assert np.array_equal(ref, mosaic_offsets(bits, spec.smem_shape, swizzle))
  assert gmma_smem_layout(dtype, tile, major) == spec.layout


@pytest.mark.parametrize("dtype,tile,major,swizzle", SMEM_CASES)
def test_gmma_smem_layout_is_accepted_by_make_gmma_desc(dtype, tile, major, swizzle):
  bits = dtype_bits(dtype)
  layout = gmma_smem_layout(dtype, tile, major)
  descs = make_gmma_descs(layout, dtype)
  k_step = 256 // bits
  assert len(descs) == tile[1] // k_step
  for s, d in enumerate(descs):
    assert (d.major, d.swizzle, d.k) == (major, swizzle, 1 if major == "K" else 2)
    # the descriptor's start address is where K step s begins (before the swizzle)
    assert (
        d.start_address == local_tile(layout, (tile[0], k_step), (0, s)).layout.offset * bits // 8
    )
  whole_fits = major == "MN" or tile[1] * bits // 8 <= (swizzle or 16) or swizzle == 0
  if whole_fits:
    desc = make_gmma_desc(layout, dtype)
    assert (desc.major, desc.swizzle) == (major, swizzle)
  else:
    with pytest.raises(ValueError, match="make_gmma_descs"):
      make_gmma_desc(layout, dtype)


def test_kernel_tile_descriptors_match_mosaic_strides():
  # bf16 128x128 K-major, 128B: 8-row groups 2 atoms (2048 bytes) apart; K steps of 32 bytes
  descs = make_gmma_descs(gmma_smem_layout("bf16", (128, 128), "K"), "bf16")
  assert {d.stride_byte_offset for d in descs} == {2048}
  assert [d.start_address for d in descs] == [0, 32, 64, 96, 1024, 1056, 1088, 1120]
  # bf16 B tile (N, K) = (128, 64) MN-major: atoms along N 1024 bytes apart (LBO),
  # 8-row K groups 128*8*2 = 2048 bytes apart (SBO); K steps of 16 rows
  descs = make_gmma_descs(gmma_smem_layout("bf16", (128, 64), "MN"), "bf16")
  assert {(d.leading_byte_offset, d.stride_byte_offset, d.m) for d in descs} == {(1024, 2048, 2)}
  assert [d.start_address for d in descs] == [0, 4096, 8192, 12288]


@pytest.mark.parametrize("dtype", ["e4m3", "int8", "tf32", "float32"])
def test_mn_major_needs_16_bit(dtype):
  with pytest.raises(ValueError, match="WGMMA reads 8-bit and tf32 operands K-major only"):
    gmma_smem_layout(dtype, (128, 64), "MN")
  assert gmma_smem_layout(dtype, (128, 64), "K") is not None


@pytest.mark.parametrize(
    "args,rule",
    [
        (("bf16", (128, 64), "K", 256), "swizzle must be"),
        (("bf16", (128, 16), "K", 64), "multiple of the 64-byte swizzle span"),
        (("bf16", (128, 24), "K"), "multiple of one WGMMA K step"),
        (("bf16", (100, 64), "K"), "multiple of 8"),
        (("bf16", (128, 64), "M"), 'major must be "K" or "MN"'),
        (("f64", (128, 64), "K"), "8-bit, 16-bit or tf32"),
        (("bf16", (128,), "K"), "tile_shape"),
    ],
)
def test_gmma_smem_spec_rules(args, rule):
  with pytest.raises(ValueError, match=rule):
    gmma_smem_spec(*args)


def test_explicit_narrower_swizzle():
  spec = gmma_smem_spec("bf16", (64, 64), "K", swizzle=32)
  assert (spec.swizzle, spec.tiling) == (32, (8, 16))
  assert np.array_equal(offsets(spec.layout), mosaic_offsets(16, (64, 64), 32))
  assert all(d.swizzle == 32 for d in make_gmma_descs(spec.layout, "bf16"))
