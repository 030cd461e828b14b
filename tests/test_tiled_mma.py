"""TiledMMA: CuTe's documented examples, coverage of the tile, and a GEMM done
thread by thread through the partitions."""

import dataclasses

import numpy as np
import pytest

from layouts import Layout, LayoutRight, Tensor, make_tensor, right_inverse, size
from layouts.atoms import mma_atom
from layouts.tiled_mma import TiledMMA, make_tiled_mma

NT_F32 = "SM70_8x8x4_F32F16F16F32_NT"
N_MAJOR_2x2 = Layout((2, 2), (2, 1))

TILED = {  # name -> (atom, atom layout, permutation)
    "sm70 2x2": (NT_F32, N_MAJOR_2x2, ()),
    "sm70 2x2 32x32x4": (NT_F32, N_MAJOR_2x2, (32, 32, 4)),
    "sm70 2x2 permuted M": (NT_F32, N_MAJOR_2x2, (Layout((4, 4, 2), (1, 8, 4)), 32, 4)),
    "sm70 TN 2x2": ("SM70_8x8x4_F16F16F16F16_TN", (2, 2), ()),
    "sm80 2x2 N=32": ("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2), (None, 32, None)),
    "sm80 tf32 1x2x2": ("SM80_16x8x8_F32TF32TF32F32_TN", (1, 2, 2), ()),
    "sm80 s8 4x1": ("SM80_16x8x32_S32S8S8S32_TN", (4, 1), ()),
    "sm89 fp8": ("SM89_16x8x32_F32E4M3E5M2F32_TN", (1, 1), ()),
    "sm90 ss 2x1": ("SM90_64x32x16_F32BF16BF16_SS", (2, 1), ()),
    "sm90 rs": ("SM90_64x24x16_F16F16F16_RS", (1, 1), ()),
    "sm90 rs 8-bit 1x1 N=48": ("SM90_64x16x32_S32U8S8_RS_TN", (1, 1), (None, 48, None)),
}


def tiled(name) -> TiledMMA:
  atom, atom_layout, permutation = TILED[name]
  return make_tiled_mma(atom, atom_layout, permutation)


def offsets(tensor):
  """All offsets of a tensor without storage, in index order."""
  n = size(tensor.layout)
  return np.asarray(tensor.layout(np.arange(n))) + tensor.offset + np.zeros(n, dtype=int)


# -- CuTe's documented TiledMMA examples (CUTLASS 0t_mma_atom.md, "TiledMMAs") -------


def test_four_quadpairs_make_a_16x16x4_mma():
  mma = tiled("sm70 2x2")
  assert mma.tile_shape_mnk == (16, 16, 4) and mma.num_threads == 32
  assert mma.thr_layout_vmnk == Layout(((4, 2), 2, 2, 1), ((1, 16), 8, 4, 0))
  c = mma.get_layoutC_TV()
  # "replication follows a (2,2):(2,1) layout": quadpair 1 (lanes 4-7) takes the
  # atom to the right, quadpair 2 (lanes 8-11) the one below.
  assert divmod(c(4, 0), 16)[::-1] == (0, 8)
  assert divmod(c(8, 0), 16)[::-1] == (8, 0)
  assert divmod(c(16, 0), 16)[::-1] == (4, 0)


def test_32x32x4_tile_repeats_values():
  mma = tiled("sm70 2x2 32x32x4")
  assert mma.tile_shape_mnk == (32, 32, 4)
  a = mma.get_layoutA_TV()
  # "eight values that T0 receives from the A-matrix ... at coordinates"
  doc = [(0, 0), (1, 0), (2, 0), (3, 0), (16, 0), (17, 0), (18, 0), (19, 0)]
  assert [(a(0, v) % 32, a(0, v) // 32) for v in range(8)] == doc
  c = mma.get_layoutC_TV()
  # "We can see the T0V8 and T16V8 and T8V8 values in the C-matrix that were not used before."
  assert size(c[1]) == 32 and all(c(t, 8) < 32 * 32 for t in (0, 8, 16))


def owners(tv, rows):
  """{(row, col): "T<t>V<v>"} of a TV layout over a tile with ``rows`` rows;
  a cell that several threads hold shows the first (as CuTe's pictures do)."""
  cells = {}
  for t in range(size(tv[0])):
    for v in range(size(tv[1])):
      cells.setdefault(divmod(tv(t, v), rows)[::-1], f"T{t}V{v}")
  return cells


def test_32x32x4_matches_cutes_picture():
  # Transcribed from CuTe's print_latex of this TiledMMA (mma.sync.8x8x4.NT_2x2_32x32x4.png).
  mma = tiled("sm70 2x2 32x32x4")
  c, a = owners(mma.get_layoutC_TV(), 32), owners(mma.get_layoutA_TV(), 32)
  c_row0 = (
      "T0V0 T0V1 T2V0 T2V1 T0V4 T0V5 T2V4 T2V5 T4V0 T4V1 T6V0 T6V1 T4V4 T4V5 T6V4 T6V5 "
      "T0V16 T0V17 T2V16 T2V17 T0V20 T0V21 T2V20 T2V21 T4V16 T4V17 T6V16 T6V17 T4V20 T4V21 T6V20 T6V21"
  )
  c_col0 = (
      "T0V0 T1V0 T0V2 T1V2 T16V0 T17V0 T16V2 T17V2 T8V0 T9V0 T8V2 T9V2 T24V0 T25V0 T24V2 T25V2 "
      "T0V8 T1V8 T0V10 T1V10 T16V8 T17V8 T16V10 T17V10 T8V8 T9V8 T8V10 T9V10 T24V8 T25V8 T24V10 T25V10"
  )
  a_col0 = (
      "T0V0 T0V1 T0V2 T0V3 T16V0 T16V1 T16V2 T16V3 T8V0 T8V1 T8V2 T8V3 T24V0 T24V1 T24V2 T24V3 "
      "T0V4 T0V5 T0V6 T0V7 T16V4 T16V5 T16V6 T16V7 T8V4 T8V5 T8V6 T8V7 T24V4 T24V5 T24V6 T24V7"
  )
  assert [c[0, n] for n in range(32)] == c_row0.split()
  assert [c[m, 0] for m in range(32)] == c_col0.split()
  assert [a[m, 0] for m in range(32)] == a_col0.split()
  assert [a[0, k] for k in range(4)] == ["T0V0", "T1V0", "T2V0", "T3V0"]


def test_m_permutation_makes_a_reads_contiguous():
  plain, permuted = tiled("sm70 2x2 32x32x4"), tiled("sm70 2x2 permuted M")
  a = permuted.get_layoutA_TV()
  assert [a(0, v) % 32 for v in range(8)] == list(range(8))
  # "old m-coord -> new m-coord", verbatim from the document:
  new_m = [
      0,
      1,
      2,
      3,
      8,
      9,
      10,
      11,
      16,
      17,
      18,
      19,
      24,
      25,
      26,
      27,
      4,
      5,
      6,
      7,
      12,
      13,
      14,
      15,
      20,
      21,
      22,
      23,
      28,
      29,
      30,
      31,
  ]
  for tv_plain, tv_perm, rows in (
      (plain.get_layoutA_TV(), a, 32),
      (plain.get_layoutC_TV(), permuted.get_layoutC_TV(), 32),
  ):
    for t in range(32):
      for v in range(size(tv_plain[1])):
        m, other = tv_plain(t, v) % rows, tv_plain(t, v) // rows
        assert tv_perm(t, v) == new_m[m] + rows * other
  assert plain.get_layoutB_TV() == permuted.get_layoutB_TV()


# -- coverage ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TILED))
def test_tv_layouts_cover_the_tile(name):
  mma = tiled(name)
  m, n, k = mma.tile_shape_mnk
  vmnk = mma.thr_layout_vmnk
  thr_m, thr_n, thr_k = (size(vmnk[i]) for i in (1, 2, 3))
  smem_a, smem_b = (
      source == "smem" for source in (mma.atom.operation.a_source, mma.atom.operation.b_source)
  )
  broadcast = mma.atom.num_threads  # a shared-memory operand is seen by every thread of the atom
  for tv, cells, copies in (
      (mma.get_layoutC_TV(), m * n, thr_k),
      (mma.get_layoutA_TV(), m * k, thr_n * (broadcast if smem_a else 1)),
      (mma.get_layoutB_TV(), n * k, thr_m * (broadcast if smem_b else 1)),
  ):
    assert size(tv[0]) == mma.num_threads
    counts = np.bincount(offsets(Tensor(tv)), minlength=cells)
    assert len(counts) == cells and (counts == copies).all(), (tv, np.unique(counts))


@pytest.mark.parametrize("name", sorted(TILED))
def test_partition_c_covers_the_tile_exactly_once(name):
  mma = tiled(name)
  m, n, _ = mma.tile_shape_mnk
  tile = Tensor(Layout((2 * m, 3 * n), LayoutRight))  # 2x3 tiles: the rest modes take the repeats
  thr_k = size(mma.thr_layout_vmnk[3])
  owners = np.concatenate([offsets(mma.partition_c(tile, t)) for t in range(mma.num_threads)])
  assert (np.bincount(owners, minlength=6 * m * n) == thr_k).all()
  # (values, rest_M, rest_N): the rest modes count the atom grids (of the tile of
  # atoms, not of the permutation) along M and N.
  vmnk, (atom_m, atom_n, _) = mma.thr_layout_vmnk, mma.atom.shape_mnk
  frag = mma.partition_c(tile, 0)
  assert _shape(frag)[1:] == (2 * m // (atom_m * size(vmnk[1])), 3 * n // (atom_n * size(vmnk[2])))


# -- a GEMM, thread by thread ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TILED))
def test_gemm_through_the_partitions(name):
  """Each thread loads its A and B registers through partition_a/b, the
  "tensor core" gathers every thread's registers (checking that they agree
  and cover the operands), and each thread computes and stores its C values
  through partition_c. The result must be a @ b."""
  mma = tiled(name)
  tm, tn, tk = mma.tile_shape_mnk
  M, N, K = 2 * tm, tn, 2 * tk
  rng = np.random.default_rng(0)
  a, b = rng.integers(-4, 5, (M, K)), rng.integers(-4, 5, (N, K))
  a_t, b_t = make_tensor(a, Layout((M, K), LayoutRight)), make_tensor(
      b, Layout((N, K), LayoutRight)
  )
  out = np.zeros(M * N, dtype=a.dtype)
  out_t = make_tensor(out, Layout((M, N), LayoutRight))

  def gather(part, src, rows, cols):
    seen = np.full(rows * cols, np.iinfo(np.int64).min)
    for t in range(mma.num_threads):
      frag = part(src, t)
      cells = offsets(Tensor(frag.layout, None, frag.offset))
      regs = frag.engine[cells]  # what thread t loaded
      known = seen[cells] != np.iinfo(np.int64).min
      assert (seen[cells][known] == regs[known]).all()
      seen[cells] = regs
    assert (seen != np.iinfo(np.int64).min).all(), "some element reached no thread"
    return seen.reshape(rows, cols)

  a_seen, b_seen = gather(mma.partition_a, a_t, M, K), gather(mma.partition_b, b_t, N, K)
  # The K an atom covers at each K step: every k its threads hold (all of them
  # when A is in shared memory), for each K-coordinate of the atom grid.
  vmnk = mma.thr_layout_vmnk
  k_coord = [
      int(right_inverse(vmnk)(t)) // (size(vmnk) // size(vmnk[3])) for t in range(mma.num_threads)
  ]
  atom_ks = {}
  for t in range(mma.num_threads):
    frag = mma.partition_a(a_t, t)  # (values, rest_M, rest_K)
    cells = offsets(Tensor(frag.layout, None, frag.offset)).reshape(_shape(frag), order="F")
    for rest_k in range(cells.shape[2]):
      atom_ks.setdefault((k_coord[t], rest_k), set()).update(
          (cells[:, :, rest_k] % K).ravel().tolist()
      )
  for t in range(mma.num_threads):
    frag = mma.partition_c(out_t, t)  # (values, rest_M, rest_N)
    cells = offsets(Tensor(frag.layout, None, frag.offset))
    m, n = cells // N, cells % N
    for (kc, _), ks in atom_ks.items():  # one MMA per K step
      if kc == k_coord[t]:
        ks = sorted(ks)
        out[cells] += (a_seen[m][:, ks] * b_seen[n][:, ks]).sum(axis=1)
  np.testing.assert_array_equal(out.reshape(M, N), a @ b.T)


def _shape(tensor):
  return tuple(size(mode) for mode in tensor.layout)


def test_partition_slices_a_numpy_tensor():
  mma = tiled("sm80 2x2 N=32")
  c = np.arange(32 * 32).reshape(32, 32)
  frag = mma.partition_c(make_tensor(c, Layout((32, 32), LayoutRight)), 5)
  # Lane 5 = group 1, thread 1 of warp 0 (atom (0, 0)): rows 1 and 9, columns 2, 3 (and +16 for rest N).
  got = [int(frag(v, 0, r)) for r in range(2) for v in range(4)]
  assert got == [c[1, 2], c[1, 3], c[9, 2], c[9, 3], c[1, 18], c[1, 19], c[9, 18], c[9, 19]]


def test_partition_of_a_swizzled_tensor():
  # A swizzled shared-memory tile: thread t reads the swizzled offsets of the
  # same elements it would read in the plain tile.
  mma = tiled("sm80 2x2 N=32")
  plain = Layout((32, 64), LayoutRight)
  swizzled = Layout.parse("Sw<3,3,3> o _0 o (32,64):(64,1)")
  for t in (0, 5, 127):
    a_plain, a_swizzled = mma.partition_a(Tensor(plain), t), mma.partition_a(Tensor(swizzled), t)
    n = size(a_plain.layout)
    assert [a_swizzled(i) for i in range(n)] == [swizzled.outer(a_plain(i)) for i in range(n)]


def test_partition_with_a_traced_thread_index():
  jax = pytest.importorskip("jax")
  mma = tiled("sm90 ss 2x1")
  c = np.arange(128 * 32).reshape(128, 32)
  layout = Layout((128, 32), LayoutRight)

  @jax.jit
  def thread_values(t):
    frag = mma.partition_c(make_tensor(jax.numpy.asarray(c), layout), t)
    return jax.numpy.stack([frag(i) for i in range(16)])

  for t in (0, 37, 200):
    frag = mma.partition_c(make_tensor(c, layout), t)
    np.testing.assert_array_equal(thread_values(t), [frag(i) for i in range(16)])


# -- errors and structure -------------------------------------------------------------


def test_a_lone_quadpair_has_no_contiguous_thread_index():
  mma = make_tiled_mma(NT_F32)
  with pytest.raises(ValueError, match="lanes 0-3 and 16-19"):
    mma.get_layoutC_TV()
  # ...but partitioning by lane works: lane 16 is logical thread 4.
  frag = mma.partition_c(Tensor(Layout((8, 8))), 16)
  assert frag.offset == 4
  with pytest.raises(ValueError, match="takes no part"):
    mma.partition_c(Tensor(Layout((8, 8))), 5)


def test_bad_arguments():
  with pytest.raises(ValueError, match="multiple"):
    make_tiled_mma(NT_F32, (2, 2), (24, None, None))
  with pytest.raises(ValueError, match="more than 3"):
    make_tiled_mma(NT_F32, (1, 1, 1, 1))
  with pytest.raises(KeyError):
    make_tiled_mma("SM80_16x8x16_F32F16F16F32_NT")
  with pytest.raises(ValueError, match="rank-2"):
    tiled("sm80 2x2 N=32").partition_c(Tensor(Layout(32)), 0)


def test_defaults_and_immutability():
  mma = make_tiled_mma(mma_atom("SM90_64x128x16_F32BF16BF16_SS"))
  assert mma.tile_shape_mnk == (64, 128, 16) and mma.num_threads == 128
  assert mma.get_layoutC_TV()[0] == mma.atom.c_layout[0]
  assert mma == make_tiled_mma("SM90_64x128x16_F32BF16BF16_SS") and hash(mma) == hash(
      make_tiled_mma(mma.atom)
  )
  with pytest.raises(dataclasses.FrozenInstanceError):
    mma.atom_layout = Layout(2)
