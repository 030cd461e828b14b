"""A tiled MMA: one atom repeated over a layout of atoms (CuTe's ``TiledMMA``).

``make_tiled_mma(atom, atom_layout, permutation)`` places ``size(atom_layout)``
copies of ``atom`` on distinct threads, arranged ``(AtomsM, AtomsN, AtomsK)``;
an optional per-mode ``permutation`` (a layout, or an int size) sets the tile
``M x N x K`` and reorders its rows, columns or K-slices. The result gives the
thread-value layouts of the whole tile, ``(thread index, value) -> m + M*n``
(``get_layoutC_TV``; A and B likewise), and ``partition_a/b/c`` slice a tensor
for one thread: ``(values, rest_M, rest_N)`` as in CuTe's ``partition_C``.

Thread indices are physical (``threadIdx.x`` within the tiled MMA): the
atom's ``thr_id`` maps each atom's logical threads to them.

>>> mma = make_tiled_mma("SM70_8x8x4_F32F16F16F32_NT", Layout((2, 2), (2, 1)))
>>> mma.tile_shape_mnk, mma.num_threads
((16, 16, 4), 32)
>>> mma.get_layoutC_TV()(4, 0)  # thread 4 (quadpair 1, atom (0, 1)), value 0 -> (m, n) = (0, 8)
128
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from .atoms import MMAAtom, mma_atom
from .int_tuple import crd2idx, flatten, is_int, unflatten
from .layout import (
    Layout,
    append,
    composition,
    logical_divide,
    make_layout,
    rank,
    right_inverse,
    size,
    tiled_product,
    zipped_divide,
)
from .swizzle import ComposedLayout
from .tensor import Tensor, as_tensor

__all__ = ["TiledMMA", "make_tiled_mma"]

_MODES = {"a": (0, 2), "b": (1, 2), "c": (0, 1)}  # operand -> the (M, N, K) modes of its tile


@dataclass(frozen=True)
class TiledMMA:
  """``atom`` repeated over ``atom_layout`` ((AtomsM, AtomsN, AtomsK) -> atom
  index), the tile optionally reshaped by ``permutation`` (per mode: ``None``
  or a layout). Build one with :func:`make_tiled_mma`."""

  atom: MMAAtom
  atom_layout: Layout
  permutation: tuple = (None, None, None)

  @cached_property
  def thr_layout_vmnk(self) -> Layout:
    """``(atom thread, atom m, atom n, atom k) -> thread index``."""
    return tiled_product(self.atom.thr_id, self.atom_layout)

  @property
  def num_threads(self) -> int:
    return size(self.thr_layout_vmnk)

  @property
  def tile_shape_mnk(self) -> tuple[int, int, int]:
    """The ``M x N x K`` tile one call of the tiled MMA covers."""
    vmnk = self.thr_layout_vmnk
    return tuple(
        self.atom.shape_mnk[i] * size(vmnk[i + 1]) if p is None else size(p)
        for i, p in enumerate(self.permutation)
    )

  # -- thread-value layouts ------------------------------------------------
  @lru_cache(maxsize=256)  # every thread partitions the same tensor layout
  def _thread_fragments(self, layout, operand: str) -> Layout:
    """``layout`` (an operand's tile or tensor) as
    ``((ThrV, (ThrI, ThrJ)), (FrgV, (RestI, RestJ)))``, CuTe's ``thrfrg_A/B/C``.
    A swizzled layout keeps its swizzle outside: its inner layout is split."""
    if isinstance(layout, ComposedLayout):
      return layout.map_inner(lambda inner: self._thread_fragments(inner, operand))
    i, j = _MODES[operand]
    atom_tv, _ = self.atom.operand(operand)
    vmnk = self.thr_layout_vmnk
    permuted = logical_divide(layout, (self.permutation[i], self.permutation[j]))
    atoms = zipped_divide(permuted, (self.atom.shape_mnk[i], self.atom.shape_mnk[j]))
    tv = composition(atoms[0], atom_tv)  # (ThrV, FrgV) -> offset
    threads = zipped_divide(atoms[1], (size(vmnk[i + 1]), size(vmnk[j + 1])))
    return make_layout(make_layout(tv[0], threads[0]), make_layout(tv[1], threads[1]))

  def _layout_tv(self, operand: str) -> Layout:
    i, j = _MODES[operand]
    tile = self.tile_shape_mnk
    fragments = self._thread_fragments(Layout((tile[i], tile[j])), operand)
    vmnk = self.thr_layout_vmnk
    thread_to_vmnk = right_inverse(vmnk)
    if size(thread_to_vmnk) != size(vmnk):
      raise ValueError(
          f"the threads of this tiled MMA, {vmnk}, are not the indices 0..{size(vmnk) - 1} "
          f"(an SM70 quadpair alone uses lanes 0-3 and 16-19): use the atom's layouts "
          f"or an atom layout that fills the warp"
      )
    # (ThrV, ThrM, ThrN, ThrK) -> (ThrV, (ThrI, ThrJ)): drop the mode this operand does not use.
    sizes = [size(vmnk[r]) for r in range(4)]
    keep = [0] * 4
    keep[0], keep[i + 1], keep[j + 1] = 1, sizes[0], sizes[0] * sizes[i + 1]
    drop_unused = Layout(tuple(sizes), tuple(keep))
    threads = composition(fragments[0], composition(drop_unused, thread_to_vmnk))
    return make_layout(threads, fragments[1])

  def get_layoutA_TV(self) -> Layout:  # noqa: N802 - CuTe's name
    """``(thread, value) -> m + M*k`` over the ``M x K`` tile."""
    return self._layout_tv("a")

  def get_layoutB_TV(self) -> Layout:  # noqa: N802
    """``(thread, value) -> n + N*k`` over the ``N x K`` tile."""
    return self._layout_tv("b")

  def get_layoutC_TV(self) -> Layout:  # noqa: N802
    """``(thread, value) -> m + M*n`` over the ``M x N`` tile."""
    return self._layout_tv("c")

  # -- partitioning ----------------------------------------------------------
  def _partition(self, tensor, thread_idx, operand: str) -> Tensor:
    tensor = as_tensor(tensor)
    if rank(tensor.layout) != 2:
      raise ValueError(f"partition_{operand}: expected a rank-2 tensor, got layout {tensor.layout}")
    i, j = _MODES[operand]
    vmnk = self.thr_layout_vmnk
    coord = [crd2idx(_mode_coord(thread_idx, mode), mode.shape) for mode in vmnk]
    if is_int(thread_idx) and vmnk(tuple(coord)) != thread_idx:
      raise ValueError(
          f"partition_{operand}: thread {thread_idx} takes no part in this tiled MMA "
          f"(threads: {vmnk})"
      )
    fragments = self._thread_fragments(tensor.layout, operand)
    return tensor.sliced(
        ((coord[0], (coord[i + 1], coord[j + 1])), (None, (None, None))), fragments
    )

  def partition_a(self, tensor, thread_idx) -> Tensor:
    """Thread ``thread_idx``'s part of an ``M x K`` tensor: ``(values, rest_M, rest_K)``."""
    return self._partition(tensor, thread_idx, "a")

  def partition_b(self, tensor, thread_idx) -> Tensor:
    """Thread ``thread_idx``'s part of an ``N x K`` tensor: ``(values, rest_N, rest_K)``."""
    return self._partition(tensor, thread_idx, "b")

  def partition_c(self, tensor, thread_idx) -> Tensor:
    """Thread ``thread_idx``'s part of an ``M x N`` tensor: ``(values, rest_M, rest_N)``."""
    return self._partition(tensor, thread_idx, "c")


def _mode_coord(thread_idx, mode: Layout):
  """The coordinate of ``thread_idx`` in one mode of the thread layout
  (``idx2crd``, except that a size-1 mode, whatever its stride, gives 0)."""
  leaves = [
      0 if s == 1 else (thread_idx // d) % s
      for s, d in zip(flatten(mode.shape), flatten(mode.stride))
  ]
  return unflatten(leaves, mode.shape) if isinstance(mode.shape, tuple) else leaves[0]


def _as_permutation(p):
  if p is None or isinstance(p, Layout):
    return p
  if is_int(p):
    return Layout(p)
  raise ValueError(
      f"make_tiled_mma: a permutation mode must be None, an int or a Layout, got {p!r}"
  )


def make_tiled_mma(atom, atom_layout=(1, 1, 1), permutation=(None, None, None)) -> TiledMMA:
  """Tile ``atom`` (an :class:`~layouts.atoms.MMAAtom` or its name) over
  ``atom_layout`` (a layout or a shape, column-major; padded to rank 3) with an
  optional ``permutation`` per M, N, K mode (``None``, a size, or a layout).

  >>> mma = make_tiled_mma("SM80_16x8x16_F32BF16BF16F32_TN", (2, 2), (None, 32, None))
  >>> mma.tile_shape_mnk, mma.num_threads
  ((32, 32, 16), 128)
  """
  if isinstance(atom, str):
    atom = mma_atom(atom)
  atom_layout = atom_layout if isinstance(atom_layout, Layout) else Layout(atom_layout)
  if rank(atom_layout) > 3:
    raise ValueError(f"make_tiled_mma: atom layout {atom_layout} has more than 3 modes (M, N, K)")
  atom_layout = append(atom_layout, rank=3)
  permutation = tuple(permutation) + (None,) * (3 - len(tuple(permutation)))
  if len(permutation) != 3:
    raise ValueError(
        f"make_tiled_mma: {len(permutation)} permutation modes given, at most 3 (M, N, K)"
    )
  tiled = TiledMMA(atom, atom_layout, tuple(_as_permutation(p) for p in permutation))
  for i, (extent, p) in enumerate(zip(tiled.tile_shape_mnk, tiled.permutation)):
    needed = atom.shape_mnk[i] * size(tiled.thr_layout_vmnk[i + 1])
    if p is not None and extent % needed:
      raise ValueError(
          f"make_tiled_mma: permutation {p} of mode {'MNK'[i]} has size {extent}, "
          f"not a multiple of the {needed} the atoms cover"
      )
  return tiled
