"""The layout-algebra examples of ../shared/reference/, checked by the algebra.

The documents are not infallible. Each example is checked against the
algebra's own post-conditions (injectivity, the function it claims, brute
force over every coordinate). Where a document is wrong, the test asserts that
its claim does NOT hold, quoting it, and asserts the correct value beside it.

Documents: cutlass_gemm_hierarchy_notes_ko.md (Korean notes), ptx_wgmma_smem_layout.txt
(PTX ISA, wgmma shared-memory layouts), cute_tma_tensors.txt (CuTe TMA tensors).
"""

import itertools

import numpy as np
import pytest

from layouts import (
    E,
    Layout,
    LayoutLeft,
    LayoutRight,
    Swizzle,
    coalesce,
    complement,
    composition,
    cosize,
    depth,
    layout_table,
    local_partition,
    local_tile,
    logical_divide,
    make_identity_layout,
    make_identity_tensor,
    make_tensor,
    parse_layout,
    rank,
    recast,
    right_inverse,
    size,
    zipped_divide,
)

from layout_reference import injective, offsets


def bijective_onto_range(L):
  return sorted(offsets(L).tolist()) == list(range(size(L)))


def ref_swizzle(x, B, M, S):
  """CuTe's Swizzle<B,M,S>: bits [M+S, M+S+B) XOR-ed onto [M, M+B), bit by bit."""
  out = x
  for k in range(B):
    out ^= ((x >> (M + S + k)) & 1) << (M + k)
  return out


# == cutlass_gemm_hierarchy_notes_ko.md =====================================================


def test_ko_hierarchical_shape_example():
  # "shape = (4, (2, 3)) → 4×(2·3) = 24 elem
  #  stride = (6, (3, 1)) → col-major outer, row-major inner ... 4 그룹 × (2×3 tile)"
  L = Layout((4, (2, 3)), (6, (3, 1)))
  assert size(L) == 24
  assert L[1] == Layout((2, 3), LayoutRight)  # row-major 2x3 inner tile
  for i, j, k in itertools.product(range(4), range(2), range(3)):
    assert L(i, (j, k)) == 6 * i + (3 * j + k)  # group i, then the tile
  assert bijective_onto_range(L)


def test_ko_basic_layouts():
  # "Layout<(M,N), (1,M)> → col-major M×N, Layout<(M,N), (N,1)> → row-major,
  #  Layout<(M,N), (1,0)> → N축 broadcast, Layout<(M,N), (0,1)> → M축 broadcast"
  M, N = 4, 3
  assert Layout((M, N)) == Layout((M, N), (1, M)) == Layout((M, N), LayoutLeft)
  assert Layout((M, N), LayoutRight) == Layout((M, N), (N, 1))
  for i, j in itertools.product(range(M), range(N)):
    assert Layout((M, N), (1, M))(i, j) == np.ravel_multi_index((i, j), (M, N), order="F")
    assert Layout((M, N), (N, 1))(i, j) == np.ravel_multi_index((i, j), (M, N), order="C")
    assert Layout((M, N), (1, 0))(i, j) == i  # same along N
    assert Layout((M, N), (0, 1))(i, j) == j  # same along M
  # "make_layout(make_shape(_8{}, _16{}), make_stride(_16{}, _1{})) // row-major 8×16"
  assert Layout((8, 16), (16, 1)) == Layout((8, 16), LayoutRight)
  # "| 3D col-major | (M,N,K) | (1, M, M·N) |", "| 3D row-major | (M,N,K) | (N·K, K, 1) |"
  M, N, K = 2, 3, 4
  assert Layout((M, N, K)).stride == (1, M, M * N)
  assert Layout((M, N, K), LayoutRight).stride == (N * K, K, 1)
  # "| batched (MNK, B) | ((M,N,K), B) | ((...),M·N·K) |"
  assert Layout(((M, N, K), 5)).stride == ((1, M, M * N), M * N * K)


def test_ko_size_cosize_rank_depth():
  # "Layout<(4,3),(1,4)>: size=12, cosize=12, rank=2, depth=1"
  L = Layout((4, 3), (1, 4))
  assert (size(L), cosize(L), rank(L), depth(L)) == (12, 12, 2, 1)
  # "cosize(L) | max(L(c)) + 1 (필요 memory)"
  assert cosize(L) == offsets(L).max() + 1


def test_ko_nested_tile_example_is_not_injective():
  # "shape=((4,2),(8,4)) stride=((1,16),(4,32)) 좌표 ((i,j),(k,l)):
  #  L = i·1 + j·16 + k·4 + l·32 → col-major 8×8 tile in row-major 4×8 super-grid"
  L = Layout(((4, 2), (8, 4)), ((1, 16), (4, 32)))
  # The formula is what the layout computes ...
  for i, j, k, l in itertools.product(range(4), range(2), range(8), range(4)):
    assert L((i, j), (k, l)) == i + 16 * j + 4 * k + 32 * l
  # ... but it is no tiling: 256 coordinates land on only 144 offsets
  # (the k*4 run 0..28 crosses j*16), e.g. ((0,1),(0,0)) and ((0,0),(4,0)).
  assert not injective(L)
  assert len(set(offsets(L).tolist())) == 144
  assert L((0, 1), (0, 0)) == L((0, 0), (4, 0)) == 16
  assert cosize(L) == 144 < size(L)
  # Correct: keeping i·1 + k·4 (a col-major 4×8 tile of 32 elements) and l·32,
  # j must step over whole rows of tiles: j·128, a col-major 4×8 tile in a
  # row-major 2×4 super-grid, a bijection onto [0, 256).
  fixed = Layout(((4, 2), (8, 4)), ((1, 128), (4, 32)))
  assert bijective_onto_range(fixed)
  for i, j, k, l in itertools.product(range(4), range(2), range(8), range(4)):
    tile = i + 4 * k  # col-major 4x8 tile
    grid = 4 * j + l  # row-major 2x4 grid of tiles
    assert fixed((i, j), (k, l)) == tile + 32 * grid
  # An "8×8 col-major tile" of this shape (rows (4,2), 8 columns) repeated
  # 4 times along N is just the compact column-major layout.
  assert bijective_onto_range(Layout(((4, 2), (8, 4)), ((1, 4), (8, 64))))
  assert Layout(((4, 2), (8, 4)), ((1, 4), (8, 64))) == Layout(((4, 2), (8, 4)))


def test_ko_print_layout_col_major_4x3():
  # "// Layout<(4,3),(1,4)> col-major 4×3
  #      0 1 2
  #  0   0 4 8
  #  1   1 5 9
  #  2   2 6 10
  #  3   3 7 11   // cell 값 = L(i,j) offset"
  doc = [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
  L = Layout((4, 3), (1, 4))
  assert [[L(i, j) for j in range(3)] for i in range(4)] == doc
  table = layout_table(L)
  body = [line for line in table.splitlines()[2:] if "|" in line]
  assert [[int(c) for c in line.split("|")[1:-1]] for line in body] == doc


def test_ko_composition_example():
  # "A = (8):(1), B = (4):(2) → (4):(2) (0,2,4,6)"
  A, B = parse_layout("(8):(1)"), parse_layout("(4):(2)")
  R = composition(A, B)
  assert [R(i) for i in range(4)] == [0, 2, 4, 6]
  assert coalesce(R) == Layout(4, 2)


def test_ko_logical_divide_example():
  # "L = (24):(1), T = (4):(1) → ((4),(6)) : ((1),(4)) : tile-내·tile-외 분리"
  D = logical_divide(Layout(24), Layout(4))
  doc = parse_layout("((4),(6)):((1),(4))")
  # Same function and modes; CuTe (and this package) print (4,6):(1,4).
  assert D == Layout((4, 6), (1, 4))
  assert np.array_equal(offsets(D), offsets(doc))
  for i, j in itertools.product(range(4), range(6)):
    assert D(i, j) == doc((i,), (j,)) == i + 4 * j  # element i of tile j


def test_ko_coalesce_and_complement_examples():
  # "coalesce( ((2,4),(1,2)) ) = (8):(1)"
  assert coalesce(Layout((2, 4), (1, 2))) == Layout(8, 1)
  # "complement( (4):(4), 16 ) = (4):(1)"
  C = complement(Layout(4, 4), 16)
  assert C == Layout(4, 1)
  # Post-condition: together they cover [0, 16) once.
  assert sorted(offsets(Layout((4, 4), (4, 1))).tolist()) == list(range(16))


def test_ko_zipped_divide_comment_holds_only_for_a_by_mode_tiler():
  # "auto ztile = zipped_divide(cta_tile, thr_tile);
  #  // ((thr_M, thr_N), (rest_M, rest_N))"
  # with cta_tile = (128,64):(64,1) and thr_tile = (32,8):(8,1).
  cta = Layout((128, 64), (64, 1))
  thr = Layout((32, 8), (8, 1))
  # A Layout tiler divides the flat (1-D) index space: mode 0 is cta at flat
  # indices thr(i, j) = 8i + j, and the rest is a single mode of 32 --
  # not (rest_M, rest_N) = (4, 8), and not the 32x8 block of (M, N).
  Z = zipped_divide(cta, thr)
  assert rank(Z[1]) == 1 and size(Z[1]) == 32
  block = {cta(m, n) for m in range(32) for n in range(8)}
  assert {Z((i, j), 0) for i in range(32) for j in range(8)} != block
  for i, j in itertools.product(range(32), range(8)):
    k = 8 * i + j
    assert Z((i, j), 0) == cta(k % 128, k // 128)
  # With the by-mode shape tiler (32, 8) the comment holds:
  # ((32, 8), (4, 8)) and element (i, j) of tile (a, b) is cta(32a+i, 8b+j).
  Zs = zipped_divide(cta, (32, 8))
  assert [size(Zs[0][0]), size(Zs[0][1]), size(Zs[1][0]), size(Zs[1][1])] == [32, 8, 4, 8]
  for i, j, a, b in itertools.product(range(0, 32, 5), range(8), range(4), range(8)):
    assert Zs((i, j), (a, b)) == cta(32 * a + i, 8 * b + j)
  assert {Zs((m, n), 0) for m in range(32) for n in range(8)} == block


def test_ko_local_tile_and_local_partition_example():
  # "auto tA = local_tile(gA, make_shape(_128{}, _64{}), make_coord(m_blk, k_blk));"
  # "auto thr_layout = Layout<Shape<_32,_8>, Stride<_8,_1>>{}; // 256 thr/CTA
  #  auto tAgA = local_partition(tA, thr_layout, threadIdx.x);"
  M, K = 256, 128
  gA = make_tensor(np.arange(M * K), Layout((M, K), (K, 1)))  # row-major A
  m_blk, k_blk = 1, 1
  tA = local_tile(gA, (128, 64), (m_blk, k_blk))
  for i, j in [(0, 0), (5, 7), (127, 63)]:
    assert tA(i, j) == (128 * m_blk + i) * K + 64 * k_blk + j
  thr = Layout((32, 8), (8, 1))
  owned = []
  for tid in range(256):
    part = local_partition(tA, thr, tid)
    tm, tk = tid // 8, tid % 8  # thread (tm, tk) of the 32x8 grid
    assert [size(part.layout[0]), size(part.layout[1])] == [4, 8]
    for a, b in itertools.product(range(4), range(8)):
      assert part(a, b) == tA(tm + 32 * a, tk + 8 * b)
      owned.append(int(part(a, b)))
  assert sorted(owned) == sorted(int(tA(i, j)) for i in range(128) for j in range(64))


def test_ko_block_view_order():
  # "(M, K) 평면, ((M/bM, bM), (K/bK, bK)) block view": CuTe's divide puts
  # the tile first, ((bM, M/bM), (bK, K/bK)); column-major, the first mode
  # is the fast one, so element i of block b is row i + bM*b.
  M, K, bM, bK = 16, 8, 4, 2
  D = logical_divide(Layout((M, K)), (bM, bK))
  assert [size(D[0][0]), size(D[0][1]), size(D[1][0]), size(D[1][1])] == [bM, M // bM, bK, K // bK]
  for i, b in itertools.product(range(bM), range(M // bM)):
    assert D((i, b), (0, 0)) == i + bM * b


def test_ko_algebra_laws():
  # "| identity | id∘L = L∘id = L |", "| non-commut | A∘B ≠ B∘A (일반) |",
  # "| right_inverse(L) | 부분역 | L(Lr-1)=id |"
  L = Layout((4, 8), (8, 1))
  assert np.array_equal(offsets(composition(Layout(cosize(L)), L)), offsets(L))
  assert np.array_equal(offsets(composition(L, Layout(size(L)))), offsets(L))
  A, B = Layout(4, 2), Layout((2, 2), (4, 1))
  assert composition(A, B) == Layout((2, 2), (8, 2))  # A(B(i)) = 2 * B(i)
  assert composition(B, A) == Layout(4, 1)  # B(2i): 0, 1, 2, 3
  R = right_inverse(L)
  assert [L(R(i)) for i in range(size(R))] == list(range(32))


def test_ko_recast_uint32_as_two_halves():
  # "recast<T> (dtype 재해석, e.g. uint32 → 2×half)"
  words = Layout((4, 8), (8, 1))  # row-major 4x8 of uint32
  halves = recast(words, 32, 16)
  assert halves == Layout((4, 16), (16, 1))
  for r, c in itertools.product(range(4), range(8)):
    assert {halves(r, 2 * c), halves(r, 2 * c + 1)} == {2 * words(r, c), 2 * words(r, c) + 1}


def test_ko_swizzle_bit_table_is_wrong_in_places():
  # "S=2, B=2, M=0 → XOR region [3:2] with [1:0]" and the table
  #   offset  bin     swizzled
  #   0       000000  000000  (row 0, col 0)
  #   1       000001  000001  (row 0, col 1)
  #   4       000100  000100  (row 1, col 0)
  #   5       000101  000101  (row 1, col 1)
  #   8       001000  001010  (row 2, col 0 → 2)
  #   9       001001  001011  (row 2, col 1 → 3)
  #   12      001100  001110
  #   16      010000  010100
  #   20      010100  010000  (swapped!)
  doc = {
      0: 0b000000,
      1: 0b000001,
      4: 0b000100,
      5: 0b000101,
      8: 0b001010,
      9: 0b001011,
      12: 0b001110,
      16: 0b010100,
      20: 0b010000,
  }
  sw = Swizzle(2, 0, 2)
  # CuTe's definition, x ^ ((x & yyy_mask) >> S) with yyy bits [M+S, M+S+B) = [2, 4):
  correct = {0: 0, 1: 1, 4: 5, 5: 4, 8: 10, 9: 11, 12: 15, 16: 16, 20: 21}
  for x, want in correct.items():
    assert sw(x) == want == ref_swizzle(x, 2, 0, 2)
    assert sw(x) == x ^ ((x & 0b1100) >> 2)
  right_rows = {x for x in doc if doc[x] == correct[x]}
  wrong_rows = {x for x in doc if doc[x] != correct[x]}
  assert right_rows == {0, 1, 8, 9}
  assert wrong_rows == {4, 5, 12, 16, 20}
  # Row 1 (offsets 4, 5) must change: bit 2 is a yyy bit. 16 = bit 4 is
  # above the swizzle and stays. The document's column is Swizzle(2,1,2)
  # (yyy bits [3,5) onto [1,3)), not the Swizzle(2,0,2) it names.
  assert all(Swizzle(2, 1, 2)(x) == doc[x] for x in doc)
  assert Swizzle(2, 0, 2) != Swizzle(2, 1, 2)


def test_ko_swizzle_parameters():
  # "| M | 보존 lower bit (= atomic unit log₂) | 3 (8 elem 묶음) |" and
  # "Swizzle<3,3,3> = 128 B line 내 8×8 block 재배치" (16-bit elements).
  sw = Swizzle(3, 3, 3)
  for x in range(1024):
    assert sw(x) & 7 == x & 7  # 8-element units stay whole
  for r, c, e in itertools.product(range(8), range(8), range(8)):
    # Row r of 64 elements (128 B): 8-element chunk c moves to c ^ r.
    assert sw(64 * r + 8 * c + e) == 64 * r + 8 * (c ^ r) + e
  # "| NoSwizzle | <0,0,0> | identity |"
  assert [Swizzle(0, 0, 0)(x) for x in range(64)] == list(range(64))


def test_ko_swizzled_smem_layout():
  # "SmemLayoutA = composition(Swizzle<3, 3, 3>{}, Layout<Shape<_64,_64>, Stride<_64,_1>>{});
  #  // 좌표 (i,j) → swizzled offset  offset = SmemLayoutA(i, j);"
  S = composition(Swizzle(3, 3, 3), Layout((64, 64), (64, 1)))
  assert repr(S) == "Sw<3,3,3> o _0 o (64,64):(64,1)"
  values = [S(i, j) for i in range(64) for j in range(64)]
  assert sorted(values) == list(range(4096))  # still a bijection
  for i, j in itertools.product(range(64), range(0, 64, 7)):
    assert S(i, j) == ref_swizzle(64 * i + j, 3, 3, 3)


# == ptx_wgmma_smem_layout.txt ================================================================

# "Canonical Layout" rows of the table (T = 128 / element bits).
CANONICAL = {
    ("MN", "none"): lambda T, m, k, LBO, SBO: Layout(
        ((T, 1, m), (8, k)), ((1, T, SBO), (1 * T, LBO))
    ),
    ("MN", 32): lambda T, m, k, LBO, SBO: Layout(((T, 2, m), (8, k)), ((1, T, LBO), (2 * T, SBO))),
    ("MN", 64): lambda T, m, k, LBO, SBO: Layout(((T, 4, m), (8, k)), ((1, T, LBO), (4 * T, SBO))),
    ("MN", 128): lambda T, m, k, LBO, SBO: Layout(((T, 8, m), (8, k)), ((1, T, LBO), (8 * T, SBO))),
    ("K", "none"): lambda T, m, k, LBO, SBO: Layout(((8, m), (T, 2 * k)), ((1 * T, SBO), (1, LBO))),
    ("K", 32): lambda T, m, k, LBO, SBO: Layout(((8, m), (T, 2 * k)), ((2 * T, SBO), (1, T))),
    ("K", 64): lambda T, m, k, LBO, SBO: Layout(((8, m), (T, 2 * k)), ((4 * T, SBO), (1, T))),
    ("K", 128): lambda T, m, k, LBO, SBO: Layout(((8, m), (T, 2 * k)), ((8 * T, SBO), (1, T))),
}
SWIZZLE = {
    "none": Swizzle(0, 4, 3),
    32: Swizzle(1, 4, 3),
    64: Swizzle(2, 4, 3),
    128: Swizzle(3, 4, 3),
}

# The worked examples: (major, mode, bits, exact layout, T, m, k, LBO, SBO (elements),
# LBO and SBO descriptor encodings as printed).
EXAMPLES = [
    ("K", "none", 32, "Swizzle<0,4,3> o ((8,2),(4,4)):((4,32),(1,64))", 4, 2, 2, 64, 32, 16, 8),
    ("K", 32, 32, "Swizzle<1,4,3> o ((8,2),(4,4)):((8,64),(1,4))", 4, 2, 2, None, 64, None, 16),
    (
        "MN",
        "none",
        16,
        "Swizzle<0,4,3> o ((8,1,2),(8,2)):((1,8,64),(8,128))",
        8,
        2,
        2,
        128,
        64,
        16,
        8,
    ),
    (
        "MN",
        32,
        16,
        "Swizzle<1,4,3> o ((8,2,2),(8,2)):((1,8,128),(16,256))",
        8,
        2,
        2,
        128,
        256,
        16,
        32,
    ),
    (
        "MN",
        64,
        16,
        "Swizzle<2,4,3> o ((8,4,2),(8,2)):((1,8,256),(32,512))",
        8,
        2,
        2,
        256,
        512,
        32,
        64,
    ),
]


def _exact(text):
  sw, layout = text.split(" o ")
  B, M, S = (int(x) for x in sw[len("Swizzle<") : -1].split(","))
  return Swizzle(B, M, S), parse_layout(layout)


@pytest.mark.parametrize("major, mode, bits, exact, T, m, k, LBO, SBO, lbo_enc, sbo_enc", EXAMPLES)
def test_ptx_examples_match_their_canonical_layouts(
    major, mode, bits, exact, T, m, k, LBO, SBO, lbo_enc, sbo_enc
):
  # "T = 128 / sizeof-elements-in-bits"
  assert T == 128 // bits
  sw, layout = _exact(exact)
  assert sw == SWIZZLE[mode]
  assert layout == CANONICAL[(major, mode)](T, m, k, LBO, SBO)
  # "Encoding of LBO/SBO in descriptor: (LBO) >> 4", with LBO in bytes.
  elem_bytes = bits // 8
  if lbo_enc is not None:
    assert (LBO * elem_bytes) >> 4 == lbo_enc
  assert (SBO * elem_bytes) >> 4 == sbo_enc


@pytest.mark.parametrize(
    "major, mode, bits, exact, T, m, k, LBO, SBO, lbo_enc, sbo_enc",
    [e for e in EXAMPLES if e[3] != EXAMPLES[1][3]],
)
def test_ptx_examples_are_bijections(major, mode, bits, exact, T, m, k, LBO, SBO, lbo_enc, sbo_enc):
  sw, layout = _exact(exact)
  assert bijective_onto_range(layout)
  cl = composition(sw, layout)
  # The swizzle works on 16-byte units (M = 4) of byte addresses.
  byte_offsets = [sw(x * (bits // 8)) for x in offsets(layout).tolist()]
  assert len(set(byte_offsets)) == size(layout)
  assert size(cl) == size(layout)


def test_ptx_k_major_32b_example_overlaps_itself():
  # "K-Major, 32B swizzling and tf32 type ...
  #  Exact layout : Swizzle<1,4,3> o ((8,2),(4,4)):((8,64),(1,4))
  #  Canonical Layout :Swizzle<1,4,3> o ((8,m),(T,2k)):((2T,SBO),(1,T))  T 4, m 2, k 2"
  _, layout = _exact(EXAMPLES[1][3])
  # Rows are 2T = 8 elements (32 bytes) apart, but (T,2k) = (4,4):(1,4) runs
  # 16 elements along K: row r+1 starts inside row r's K run.
  assert not injective(layout)
  assert layout((1, 0), (0, 0)) == layout((0, 0), (0, 2)) == 8
  assert len(set(offsets(layout).tolist())) == 136 and size(layout) == 256
  # Correct: one 32-byte swizzle row holds 2T = 8 tf32, so K spans (T,2)
  # (k = 1); that layout is a bijection onto [0, 128).
  fixed = CANONICAL[("K", 32)](4, 2, 1, None, 64)
  assert fixed == Layout(((8, 2), (4, 2)), ((8, 64), (1, 4)))
  assert bijective_onto_range(fixed)


@pytest.mark.parametrize("B", [0, 1, 2, 3])
def test_ptx_swizzle_modes_permute_16_byte_units(B):
  # "Swizzle<0,4,3> ... Swizzle<3,4,3>" for none/32B/64B/128B: on byte
  # addresses, a permutation of 16-byte units within each 2**(7+B)-byte block.
  sw = Swizzle(B, 4, 3)
  block = 1 << (7 + B)
  for x in range(2 * block):
    assert sw(x) & 15 == x & 15
    assert sw(x) // block == x // block
  assert sorted(sw(x) for x in range(block)) == list(range(block))


def test_ptx_128b_atom_shape_for_smaller_elements():
  # "For smaller elements sizes, the same shapes would get multiplied along the
  #  leading dimension by a factor of 128/sizeof_bits(Element). For example, 128B
  #  MN major swizzle atom would have a shape of (8*(128/32))x8 = 32x8 for tf32"
  atom_128b = Layout((8, 8), (1, 8))  # MN-major, in 128-bit units
  atom_tf32 = recast(atom_128b, 128, 32)
  assert (size(atom_tf32[0]), size(atom_tf32[1])) == (32, 8)
  assert atom_tf32 == Layout((32, 8), (1, 32))
  assert bijective_onto_range(atom_tf32)


# == cute_tma_tensors.txt =================================================================


def test_tma_integer_strides():
  # "For "ordinary" integer strides, e.g., (1, 100), the inner product of the
  #  input coordinate (i, j) and the strides is i + 100j."
  L = Layout((4, 8), (1, 100))
  for i, j in itertools.product(range(4), range(8)):
    assert L(i, j) == i + 100 * j


def test_tma_basis_strides():
  # "if the strides are (_1@0, _1@1), then the inner product of the input
  #  coordinate (i, j) with the strides is i@0 + j@1 ... the (TMA) coordinate (i, j)."
  L = parse_layout("(_4,_8):(_1@0,_1@1)")
  assert L == make_identity_layout((4, 8))
  # "If we wanted to reverse the coordinates, then we could use (_1@1, _1@0)
  #  as the strides. Evaluating the layout would give i@1 + j@0, that is, (j, i)."
  R = parse_layout("(_4,_8):(_1@1,_1@0)")
  for i, j in itertools.product(range(4), range(8)):
    assert L(i, j) == (i, j)
    assert i * E(0) + j * E(1) == (i, j)
    assert R(i, j) == (j, i)
    assert i * E(1) + j * E(0) == (j, i)


def test_tma_base_coordinate_moves_when_sliced():
  # "For tiled TMA, the base coordinate of the whole tensor might start out as
  #  (0, 0, ..., 0). However, slicing the tensor might result in a different
  #  base coordinate."
  t = make_identity_tensor((64, 32, 4))
  assert t.offset == (0, 0, 0)
  tile = local_tile(t, (16, 8), (2, 3))  # keeps the third mode
  assert tile.offset == (32, 24, 0)
  assert tile(5, 6, 1) == (37, 30, 1)
  sliced = tile(None, None, 3)
  assert sliced.offset == (32, 24, 3)
  assert sliced(0, 0) == (32, 24, 3)
