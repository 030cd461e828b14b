"""MMA atoms: the reference document's layouts, PTX's fragment tables and
post-conditions checked for every atom in the registry.

The reference is ``/work/shared/reference/cute_mma_atoms.md`` (CuTe's
``0t_mma_atom.md``). Where it is wrong, the test says so and asserts the
correct value beside it.
"""

import dataclasses
import re
from functools import lru_cache

import numpy as np
import pytest

from layouts import Layout, filter, size
from layouts.atoms import MMAAtom, UnknownAtomError, mma_atom, mma_atoms, mma_fragment
from layouts.dtypes import dtype_bits
from layouts.atoms.sm90 import GMMA_N_DENSE, GMMA_N_INTEGER

ALL = [mma_atom(name) for name in mma_atoms()]


def parse(text):
  return Layout.parse(text)


def values(layout):
  """All values of a layout, in index order, as a numpy array."""
  return np.asarray(layout(np.arange(size(layout)))) + np.zeros(size(layout), dtype=int)


@lru_cache(maxsize=None)
def is_bijection(layout, n):
  v = values(layout)
  return len(v) == n and np.array_equal(np.sort(v), np.arange(n))


# -- the reference document, Volta ----------------------------------------------

NT_F32 = "SM70_8x8x4_F32F16F16F32_NT"


def test_doc_volta_thread_id_is_the_quadpair():
  # "threads [0,1,2,3]U[16,17,18,19] ... ThrID = Layout<Shape <_4, _2>, Stride<_1,_16>>"
  atom = mma_atom(NT_F32)
  assert atom.thr_id == parse("(_4,_2):(_1,_16)")
  assert [atom.thr_id(t) for t in range(8)] == [0, 1, 2, 3, 16, 17, 18, 19]


def test_doc_volta_f32_accumulator():
  atom = mma_atom(NT_F32)
  assert atom.traits.c_type == atom.traits.d_type == "f32"
  assert atom.traits.a_type == atom.traits.b_type == "f16"
  assert atom.shape_mnk == (8, 8, 4)  # "Shape_MNK = Shape <_8,_8,_4>"
  assert atom.c_layout == parse("((2,2,2),(2,2,2)):((1,16,4),(8,2,32))")
  assert atom.c_layout[0] == parse("(2,2,2):(1,16,4)")  # "the position of the 8 threads"
  # The document's (T, V) -> (m, n) = m + 8n tables, verbatim.
  threads_v0 = {
      0: (0, 0),
      1: (1, 0),
      2: (0, 2),
      3: (1, 2),
      4: (4, 0),
      5: (5, 0),
      6: (4, 2),
      7: (5, 2),
  }
  t0_values = {
      0: (0, 0),
      1: (0, 1),
      2: (2, 0),
      3: (2, 1),
      4: (0, 4),
      5: (0, 5),
      6: (2, 4),
      7: (2, 5),
  }
  for t, (m, n) in threads_v0.items():
    assert atom.c_layout(t, 0) == m + 8 * n
  for v, (m, n) in t0_values.items():
    assert atom.c_layout(0, v) == m + 8 * n


def test_doc_volta_registers():
  # "DRegisters = float[8]; ARegisters = uint32_t[2]; BRegisters = uint32_t[2]; CRegisters = float[8]"
  op = mma_atom(NT_F32).operation
  assert [str(r) for r in (op.d_registers, op.a_registers, op.b_registers, op.c_registers)] == [
      "float[8]",
      "uint32_t[2]",
      "uint32_t[2]",
      "float[8]",
  ]


def test_doc_volta_f16_accumulator():
  # "Each row of accumulators (m, :) is held by a single thread": (8,8):(1,8)
  for t in ("TN", "NT", "NN", "TT"):
    atom = mma_atom(f"SM70_8x8x4_F16F16F16F16_{t}")
    assert atom.c_layout == parse("(_8,_8):(_1,_8)")
    assert all(atom.c_layout(t, v) % 8 == t for t in range(8) for v in range(8))


def test_doc_volta_a_and_b_layouts():
  row = parse("(_8,_4):(_1,_8)")  # TN: "(T0,V0) to (T1,V0) ... stride of 1"
  col = parse("((_4,_2),_4):((_8,_4),_1)")  # NT: "four values of T0 first and then ... T4"
  expected = {"TN": (row, row), "NT": (col, col), "NN": (col, row), "TT": (row, col)}
  for acc in ("F16F16F16F16", "F32F16F16F32"):
    for t, (a, b) in expected.items():
      atom = mma_atom(f"SM70_8x8x4_{acc}_{t}")
      assert (atom.a_layout, atom.b_layout) == (a, b), atom.name
  # NT: going down M, T0's four values, then T4's; across K, T0..T3.
  assert [col(0, v) for v in range(4)] == [0, 1, 2, 3] and col(4, 0) == 4
  assert [col(t, 0) // 8 for t in range(4)] == [0, 1, 2, 3]


def test_doc_volta_name_scheme():
  # "NT means that A is M-major (not transposed) and B is N-major (transposed)"
  op = mma_atom(NT_F32).operation
  assert (op.a_major, op.b_major) == (("MN",), ("MN",))
  assert op.ptx == "mma.sync.aligned.m8n8k4.col.row.f32.f16.f16.f32"
  tn = mma_atom("SM70_8x8x4_F32F16F16F32_TN").operation
  assert (tn.a_major, tn.b_major) == (("K",), ("K",))


# -- the reference document, Hopper ---------------------------------------------


def test_doc_hopper_thread_id():
  assert mma_atom("SM90_64x128x16_F32BF16BF16_SS").thr_id == parse("_128:_1")


def test_doc_hopper_accumulator_construction():
  # The document builds "SM90_64x128x16_F16F16F16F16_TN", which is not a CuTe
  # name: GMMA atoms name D, A, B only (C is D) and end in _SS/_RS, the
  # majorness being a template parameter. The atom is SM90_64x128x16_F16F16F16_SS.
  with pytest.raises(KeyError) as err:
    mma_atom("SM90_64x128x16_F16F16F16F16_TN")
  assert "SM90_64x128x16_F16F16F16_SS" in str(err.value)
  c8 = mma_atom("SM90_64x8x16_F16F16F16_SS").c_layout
  # Step by step: 4 threads by pairs of values along N; x8 down M; (T0,V2) at m = 8.
  assert c8[0][0] == parse("4:128") and c8[1][0] == parse("2:64")
  assert c8[0] == parse("(4,8,4):(128,1,16)") and c8[1] == parse("(2,2):(64,8)")
  assert c8(0, 2) == 8
  # The full 64x8 layout of the document:
  assert c8 == parse("((_4,_8,_4),(_2,_2)):((_128,_1,_16),(_64,_8))")
  # "this time we go to (T32, V0), which makes it a stride of 32": the step is
  # 32 *threads*, but the layout stride is 16 (m = 16), as the code block says.
  assert c8(32, 0) == 16 and c8[0].stride[2] == 16


def test_doc_hopper_64x128_accumulator():
  expected = parse("((_4,_8,_4),(_2,_2,_16)):((_128,_1,_16),(_64,_8,_512))")
  for name in (
      "SM90_64x128x16_F16F16F16_SS",
      "SM90_64x128x16_F32F16F16_SS",
      "SM90_64x128x16_F32BF16BF16_SS",
      "SM90_64x128x16_F32BF16BF16_RS",
      "SM90_64x128x8_F32TF32TF32_SS_TN",
      "SM90_64x128x32_F32E4M3E4M3_SS_TN",
      "SM90_64x128x32_S32S8S8_RS_TN",
  ):
    assert mma_atom(name).c_layout == expected, name
  assert (
      mma_atom("SM90_64x128x16_F32F16F16_SS").c_layout(0, 4) == 512
  )  # "starts at (m,n) = (0,8) = 512"


def test_doc_hopper_n_variants():
  # The document: "64xN variants with N = [16,32,64,128,256]". PTX has every
  # multiple of 8 from 8 to 256 for 16-bit (and tf32, FP8) inputs.
  ns = sorted(
      int(re.match(r"SM90_64x(\d+)x16_F16F16F16_SS$", n).group(1))
      for n in mma_atoms("F16F16F16_SS")
      if n.startswith("SM90")
  )
  assert {16, 32, 64, 128, 256} < set(ns)
  assert ns == list(range(8, 257, 8)) == list(GMMA_N_DENSE)
  for n in ns:
    assert mma_atom(f"SM90_64x{n}x16_F16F16F16_SS").c_layout == mma_fragment(64, n, 2, warps=4)


def test_doc_hopper_smem_a_layout():
  # The document's comment reads "(T128,V64x8) -> (M64,K16)", but the values
  # are the whole 64x16 tile, as its code says: Shape <_128, Shape <_64,_16>>.
  a = mma_atom("SM90_64x128x16_F16F16F16_SS").a_layout
  assert a == parse("(_128,(_64,_16)):(_0,(_1,_64))")
  assert size(a[1]) == 64 * 16 != 64 * 8
  assert all(a(t, 0) == 0 for t in range(128))  # "all threads are mapped to (m,k) = (0,0)"


def test_doc_warp_of_quadpairs_is_16x16x4():
  # "a warp ... would perform an MMA across 4 QPs for a tile size of 16x16x4"
  from layouts.tiled_mma import make_tiled_mma

  tiled = make_tiled_mma(NT_F32, (2, 2))
  assert tiled.tile_shape_mnk == (16, 16, 4) and tiled.num_threads == 32


# -- CuTe's own layouts for the other instructions --------------------------------

CUTE_SM80 = {  # from CuTe's mma_traits_sm80.hpp / sm89.hpp: (A, B, C) of each shape and input width
    "SM80_16x8x8_F16F16F16F16_TN": ("((4,8),(2,2)):((32,1),(16,8))", "((4,8),2):((16,1),8)"),
    "SM80_16x8x16_F32BF16BF16F32_TN": (
        "((4,8),(2,2,2)):((32,1),(16,8,128))",
        "((4,8),(2,2)):((16,1),(8,64))",
    ),
    "SM80_16x8x8_F32TF32TF32F32_TN": ("((4,8),(2,2)):((16,1),(8,64))", "((4,8),2):((8,1),32)"),
    "SM80_16x8x16_S32S8S8S32_TN": ("((4,8),(4,2)):((64,1),(16,8))", "((4,8),4):((32,1),8)"),
    "SM80_16x8x32_S32U8S8S32_TN": (
        "((4,8),(4,2,2)):((64,1),(16,8,256))",
        "((4,8),(4,2)):((32,1),(8,128))",
    ),
    "SM89_16x8x32_F32E4M3E4M3F32_TN": (
        "((4,8),(4,2,2)):((64,1),(16,8,256))",
        "((4,8),(4,2)):((32,1),(8,128))",
    ),
}


@pytest.mark.parametrize("name", sorted(CUTE_SM80))
def test_sm80_layouts_match_cute(name):
  atom = mma_atom(name)
  a, b = CUTE_SM80[name]
  assert (atom.a_layout, atom.b_layout) == (parse(a), parse(b))
  assert atom.c_layout == parse("((4,8),(2,2)):((32,1),(16,8))")
  assert atom.thr_id == parse("32:1")


def test_sm90_register_a_layouts_match_cute():
  assert mma_atom("SM90_64x64x16_F16F16F16_RS").a_layout == parse(
      "((4,8,4),(2,2,2)):((128,1,16),(64,8,512))"
  )
  assert mma_atom("SM90_64x64x8_F32TF32TF32_RS_TN").a_layout == parse(
      "((4,8,4),(2,2)):((64,1,16),(8,256))"
  )
  assert mma_atom("SM90_64x64x32_F16E5M2E4M3_RS_TN").a_layout == parse(
      "((4,8,4),(4,2,2)):((256,1,16),(64,8,1024))"
  )
  assert mma_atom("SM90_64x24x32_S32S8U8_SS_TN").b_layout == parse("(128,(24,32)):(0,(1,24))")


# -- PTX's fragment tables ---------------------------------------------------------
# Written from the PTX ISA's per-register tables ("Matrix Fragments for mma.m16n8k*"
# and "for wgmma"): lane = 4*groupID + threadID_in_group, register element i.
# Each gives (row, col) of element i for (groupID g, threadID_in_group t).

PTX_A = {  # (K, bits) -> A fragment: (m, k)
    (8, 16): lambda i, g, t: (g + 8 * (i >> 1), 2 * t + (i & 1)),
    (16, 16): lambda i, g, t: (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)),
    (8, 32): lambda i, g, t: (g + 8 * (i & 1), t + 4 * (i >> 1)),
    (16, 8): lambda i, g, t: (g + 8 * (i >> 2), 4 * t + (i & 3)),
    (32, 8): lambda i, g, t: (g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3)),
}
PTX_B = {  # (K, bits) -> B fragment: (n, k)
    (8, 16): lambda i, g, t: (g, 2 * t + i),
    (16, 16): lambda i, g, t: (g, 2 * t + (i & 1) + 8 * (i >> 1)),
    (8, 32): lambda i, g, t: (g, t + 4 * i),
    (16, 8): lambda i, g, t: (g, 4 * t + i),
    (32, 8): lambda i, g, t: (g, 4 * t + (i & 3) + 16 * (i >> 2)),
}


def ptx_c(i, g, t):  # accumulator of m16n8 and of each 8-column slice of wgmma: (m, n)
  return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)


def check_fragment(layout, rows, rule, values_per_thread, threads):
  for lane in range(threads):
    warp, g, t = lane // 32, (lane % 32) // 4, lane % 4
    for i in range(values_per_thread):
      r, c = rule(i, g, t)
      assert layout(lane, i) == (r + 16 * warp) + rows * c, (layout, lane, i)


def test_sm80_fragments_follow_ptx():
  for atom in ALL:
    if not atom.name.startswith(("SM80", "SM89")):
      continue
    m, n, k = atom.shape_mnk
    bits = dtype_bits(atom.traits.a_type)
    check_fragment(atom.a_layout, m, PTX_A[k, bits], size(atom.a_layout[1]), 32)
    check_fragment(atom.b_layout, n, PTX_B[k, bits], size(atom.b_layout[1]), 32)
    check_fragment(atom.c_layout, m, ptx_c, 4, 32)


@pytest.mark.slow
def test_sm90_fragments_follow_ptx():
  seen = set()
  for atom in ALL:
    if not atom.name.startswith("SM90"):
      continue
    m, n, k = atom.shape_mnk
    bits = dtype_bits(atom.traits.a_type)
    if atom.operation.a_source == "rmem" and (k, bits) not in seen:
      seen.add((k, bits))
      check_fragment(atom.a_layout, 64, PTX_A[k, bits], size(atom.a_layout[1]), 128)
    if n in (8, 24, 256) and atom.name.endswith(("_SS", "_SS_TN")):
      check_fragment(atom.c_layout, 64, ptx_c, n // 2, 128)
  assert seen == {(16, 16), (8, 32), (32, 8)}


# -- post-conditions, for every atom -------------------------------------------------


def test_registry_counts():
  families = {}
  for name in mma_atoms():
    family = name.split("_")[0] + ("_" + name.split("_")[3] if name.startswith("SM90") else "")
    families[family] = families.get(family, 0) + 1
  assert families == {"SM70": 8, "SM80": 15, "SM89": 8, "SM90_SS": 456, "SM90_RS": 456}
  assert len(set(ALL)) == len(ALL) == 943  # frozen dataclasses: hashable, all distinct


def test_every_name_matches_its_traits():
  mma_sync = re.compile(r"SM(70|80|89)_(\d+)x(\d+)x(\d+)_([A-Z0-9]+)_(TN|NT|NN|TT)$")
  wgmma = re.compile(r"SM90_64x(\d+)x(\d+)_([A-Z0-9]+)_(SS|RS)(_TN)?$")
  for atom in ALL:
    tr = atom.traits
    if atom.name.startswith("SM90"):
      n, k, types, source, tn = wgmma.match(atom.name).groups()
      assert tr.shape_mnk == (64, int(n), int(k))
      assert types == (tr.d_type + tr.a_type + tr.b_type).upper() and tr.c_type == tr.d_type
      assert atom.operation.a_source == {"SS": "smem", "RS": "rmem"}[source]
      assert (tn is None) == (dtype_bits(tr.a_type) == 16)  # only 16-bit inputs may be MN-major
      assert int(n) in (GMMA_N_INTEGER if tr.a_type in ("s8", "u8") else GMMA_N_DENSE)
    else:
      arch, m, n, k, types, _ = mma_sync.match(atom.name).groups()
      assert tr.shape_mnk == (int(m), int(n), int(k))
      assert types == (tr.d_type + tr.a_type + tr.b_type + tr.c_type).upper()
      assert (arch == "89") == tr.a_type.startswith("e")
    assert f"m{tr.shape_mnk[0]}n{tr.shape_mnk[1]}k{tr.shape_mnk[2]}" in atom.operation.ptx


def test_every_c_layout_is_a_bijection_onto_the_tile():
  for atom in ALL:
    m, n, _ = atom.shape_mnk
    assert size(atom.c_layout[0]) == size(atom.thr_id) == atom.num_threads, atom.name
    assert is_bijection(atom.c_layout, m * n), atom.name


def test_every_a_and_b_layout_covers_its_tile():
  for atom in ALL:
    for which, source in (("a", atom.operation.a_source), ("b", atom.operation.b_source)):
      layout, (rows, cols) = atom.operand(which)
      assert size(layout[0]) == atom.num_threads, atom.name
      if source == "rmem":  # registers: each element in exactly one thread
        assert is_bijection(layout, rows * cols), (atom.name, which)
      else:  # shared memory: every thread sees the whole tile
        assert filter(layout[0]) == Layout(1, 0), (atom.name, which)
        assert is_bijection(layout[1], rows * cols), (atom.name, which)


def test_every_thr_id_is_injective():
  for atom in ALL:
    ids = values(atom.thr_id)
    assert len(set(ids.tolist())) == len(ids), atom.name


def test_every_register_count_holds_the_values():
  for atom in ALL:
    op, tr = atom.operation, atom.traits
    for regs, dtype, layout, source in (
        (op.a_registers, tr.a_type, atom.a_layout, op.a_source),
        (op.b_registers, tr.b_type, atom.b_layout, op.b_source),
        (op.c_registers, tr.c_type, atom.c_layout, "rmem"),
    ):
      if source == "smem":
        assert str(regs) == "uint64_t[1]", atom.name  # a matrix descriptor
      else:
        assert regs.count * 32 == size(layout[1]) * dtype_bits(dtype), atom.name
    assert op.d_registers == (None if atom.name.startswith("SM90") else op.c_registers)


def test_atoms_are_frozen():
  atom = mma_atom(NT_F32)
  with pytest.raises(dataclasses.FrozenInstanceError):
    atom.operation = None
  with pytest.raises(dataclasses.FrozenInstanceError):
    atom.traits.shape_mnk = (1, 1, 1)
  assert isinstance(atom, MMAAtom) and hash(atom) == hash(mma_atom(NT_F32))


# -- lookup ----------------------------------------------------------------------


def test_unknown_names_list_close_ones():
  with pytest.raises(KeyError) as err:
    mma_atom("SM80_16x8x16_F32BF16BF16F32_NT")
  assert "SM80_16x8x16_F32BF16BF16F32_TN" in str(err.value)
  with pytest.raises(ValueError) as err:  # also a ValueError
    mma_atom("sm90_64x128x16_f32bf16bf16_ss")
  assert str(err.value).count("SM90_64x128x16_F32BF16BF16_SS") == 1
  with pytest.raises(UnknownAtomError) as err:
    mma_atom("SM90_64x40x32_S32S8S8_SS_TN")  # int8 wgmma has no N = 40
  assert "SM90_64x48x32_S32S8S8_SS_TN" in str(err.value)
  with pytest.raises(UnknownAtomError, match="mma_atoms"):
    mma_atom("nonsense")


def test_listing():
  assert mma_atoms()[0].startswith("SM70") and len(mma_atoms()) == 943
  assert mma_atoms("SM89_16x8x32_F16") == (
      "SM89_16x8x32_F16E4M3E4M3F16_TN",
      "SM89_16x8x32_F16E4M3E5M2F16_TN",
      "SM89_16x8x32_F16E5M2E4M3F16_TN",
      "SM89_16x8x32_F16E5M2E5M2F16_TN",
  )
  assert all("F32TF32" in n for n in mma_atoms("TF32"))


def test_mma_fragment_rejects_impossible_shapes():
  with pytest.raises(ValueError):
    mma_fragment(12, 8, pack=2)
  with pytest.raises(ValueError):
    mma_fragment(16, 6, pack=2)
