"""TMA tensor maps from layouts, and the coordinates TMA copies are issued with.

A tiled TMA copy names a box of a global tensor by a tensor map (the fields of
``cuTensorMapEncodeTiled``) and a coordinate, innermost dimension first
(``shared/reference/cute_tma_tensors.txt``). :func:`make_tma_desc` derives the
tensor map from the layout of the global tensor, checking the hardware's
rules, and a coordinate tensor whose strides are basis elements: it maps a
coordinate of the layout to the TMA coordinate, so ``local_tile`` of it gives
the coordinate each box copy is issued with.

>>> from layouts import Layout, local_tile
>>> desc = make_tma_desc(Layout((512, 256), (256, 1)), (64, 64), "bf16", swizzle=128)
>>> desc.global_dims, desc.global_strides, desc.box_dims
((256, 512), (512,), (64, 64))
>>> desc.coords.layout
(512,256):(1@1,1@0)
>>> local_tile(desc.coords, (64, 64), (2, 3)).offset  # box (2, 3): row 128, column 192
(192, 128)
"""

from __future__ import annotations

from dataclasses import dataclass

from .basis import ArithmeticTuple
from .dtypes import dtype_bits
from .int_tuple import is_int, is_tuple
from .layout import Layout, coalesce, make_layout
from .tensor import Tensor, make_identity_tensor

__all__ = ["TmaDescriptor", "make_tma_desc"]

_SWIZZLES = (0, 32, 64, 128)
_MAX_RANK = 5
_MAX_BOX = 256
_MAX_ELEMENT_STRIDE = 8
_ALIGN = 16


@dataclass(frozen=True)
class TmaDescriptor:
  """The fields of a tiled tensor map, innermost dimension first.

  ``global_strides`` (bytes) are those of dimensions 1.. (dimension 0 has
  stride one element); ``global_offset`` is the byte offset of the tensor's
  origin from its buffer (the tensor map's address is the buffer's plus
  this); ``swizzle`` is in bytes (0: none); ``interleave`` is always
  ``"none"`` here. ``modes[d]`` is the layout mode that TMA dimension ``d``
  walks; ``coords`` maps layout coordinates to TMA coordinates.
  """

  rank: int
  global_dims: tuple[int, ...]
  global_strides: tuple[int, ...]
  box_dims: tuple[int, ...]
  element_strides: tuple[int, ...]
  swizzle: int
  interleave: str
  global_offset: int
  modes: tuple[int, ...]
  coords: Tensor


def _flat_modes(gmem: Layout) -> list[tuple[int, int]]:
  """(extent, stride) of each top-level mode, each a single stride."""
  modes = list(gmem) if is_tuple(gmem.shape) else [gmem]
  flat = []
  for i, mode in enumerate(modes):
    merged = coalesce(mode)
    if is_tuple(merged.shape):
      raise ValueError(
          f"a tensor map dimension has one stride: mode {i} of {gmem} is {mode}; "
          "give each stride its own mode"
      )
    flat.append((merged.shape, merged.stride))
  return flat


def _per_mode(value, n: int, name: str) -> tuple[int, ...]:
  value = (value,) if is_int(value) else tuple(value)
  if len(value) != n or not all(is_int(v) for v in value):
    raise ValueError(f"{name} must give one int per mode of the layout ({n}), got {value!r}")
  return value


def make_tma_desc(
    gmem, box_shape, dtype, swizzle: int = 0, *, element_strides=None
) -> TmaDescriptor:
  """The tensor map of a box copy of ``gmem``, each violated rule a ``ValueError``.

  ``gmem`` is the layout (element offsets) of the global tensor, or a
  ``Tensor`` of one whose offset is the origin. One mode must have stride 1:
  it becomes TMA dimension 0, the others follow by increasing stride
  (size-1 modes are dropped). ``box_shape`` and ``element_strides`` give one
  entry per mode of ``gmem``, in its mode order. Rules (CUDA driver API,
  ``cuTensorMapEncodeTiled``): rank <= 5; 1, 2, 4 or 8-byte elements; global
  address and strides multiples of 16 bytes, strides < 2**40, each stride at
  least the extent of the dimension below; global dims <= 2**32; box dims in
  [1, 256], the inner one a multiple of 16 bytes and, with a swizzle, at most
  the swizzle span; element strides in [1, 8].

  >>> make_tma_desc(Layout((64, 32), (1, 64)), (64, 16), "f32").global_strides
  (256,)
  """
  bits = dtype_bits(dtype)
  if bits not in (8, 16, 32, 64):
    raise ValueError(f"TMA elements are 1, 2, 4 or 8 bytes, got {bits}-bit {dtype!r}")
  if swizzle not in _SWIZZLES:
    raise ValueError(f"swizzle must be 128, 64, 32 (bytes) or 0 (none), got {swizzle!r}")
  origin = 0
  if isinstance(gmem, Tensor):
    origin, gmem = gmem.offset, gmem.layout
  if not isinstance(gmem, Layout) or not is_int(origin):
    raise ValueError(f"expected the Layout of a global tensor (or a Tensor of one), got {gmem!r}")
  flat = _flat_modes(gmem)
  boxes = _per_mode(box_shape, len(flat), "box_shape")
  steps = _per_mode(
      (1,) * len(flat) if element_strides is None else element_strides, len(flat), "element_strides"
  )
  modes = _tma_dims(gmem, flat, boxes)
  elem_bytes = bits // 8
  dims = tuple(flat[i][0] for i in modes)
  stride_bytes = tuple(flat[i][1] * elem_bytes for i in modes[1:])
  _check_global(origin * elem_bytes, dims, stride_bytes, modes, elem_bytes)
  box_dims, element_steps = tuple(boxes[i] for i in modes), tuple(steps[i] for i in modes)
  _check_box(box_dims, element_steps, elem_bytes, swizzle)
  return TmaDescriptor(
      rank=len(modes),
      global_dims=dims,
      global_strides=stride_bytes,
      box_dims=box_dims,
      element_strides=element_steps,
      swizzle=swizzle,
      interleave="none",
      global_offset=origin * elem_bytes,
      modes=modes,
      coords=_coord_tensor(flat, modes),
  )


def _tma_dims(gmem, flat, boxes) -> tuple[int, ...]:
  """The modes TMA walks, innermost first: the stride-1 mode, then by stride."""
  kept = [i for i, (extent, _) in enumerate(flat) if extent > 1]
  for i in set(range(len(flat))) - set(kept):
    if boxes[i] != 1:
      raise ValueError(f"mode {i} has extent 1, so its box extent must be 1, got {boxes[i]}")
  for i in kept:
    if not is_int(flat[i][1]) or flat[i][1] <= 0:
      raise ValueError(
          f"TMA walks memory forwards: mode {i} has stride {flat[i][1]} "
          "(broadcast, reversed or coordinate strides have no tensor map)"
      )
  if not any(flat[i][1] == 1 for i in kept):
    raise ValueError(f"{gmem} has no stride-1 mode: TMA's innermost dimension is contiguous")
  if len(kept) > _MAX_RANK:
    raise ValueError(f"a tensor map has at most {_MAX_RANK} dimensions, {gmem} needs {len(kept)}")
  return tuple(sorted(kept, key=lambda i: flat[i][1]))


def _check_global(origin_bytes, dims, stride_bytes, modes, elem_bytes):
  if origin_bytes % _ALIGN:
    raise ValueError(
        f"the global address must be 16-byte aligned: the origin is {origin_bytes} bytes in"
    )
  if any(d > 1 << 32 for d in dims):
    raise ValueError(f"global dims must be at most 2**32, got {dims}")
  below = dims[0] * elem_bytes
  for mode, extent, stride in zip(modes[1:], dims[1:], stride_bytes):
    if stride % _ALIGN or stride >= 1 << 40:
      raise ValueError(
          f"global strides must be multiples of 16 bytes below 2**40: mode {mode} has "
          f"stride {stride} bytes"
      )
    if stride < below:
      raise ValueError(
          f"each global stride must cover the dimension below it (globalStrides[i] >= "
          f"globalStrides[i-1] * globalDim[i]): mode {mode} has stride {stride} bytes < {below}"
      )
    below = stride * extent


def _check_box(box_dims, element_steps, elem_bytes, swizzle):
  if not all(1 <= b <= _MAX_BOX for b in box_dims):
    raise ValueError(f"box dims must be in [1, {_MAX_BOX}], got {box_dims}")
  inner_bytes = box_dims[0] * elem_bytes
  if inner_bytes % _ALIGN:
    raise ValueError(
        f"the inner box dimension must be a multiple of 16 bytes, got {inner_bytes} bytes"
    )
  if swizzle and inner_bytes > swizzle:
    raise ValueError(
        f"with a {swizzle}B swizzle the inner box dimension must be at most {swizzle} bytes "
        f"(the swizzle span), got {inner_bytes} bytes"
    )
  if not all(1 <= e <= _MAX_ELEMENT_STRIDE for e in element_steps):
    raise ValueError(f"element strides must be in [1, {_MAX_ELEMENT_STRIDE}], got {element_steps}")


def _coord_tensor(flat, modes) -> Tensor:
  """``layout coordinate -> TMA coordinate``: mode ``modes[d]`` gets stride ``1@d``."""
  identity = make_identity_tensor(tuple(flat[i][0] for i in modes))
  dim_of = {m: d for d, m in enumerate(modes)}
  per_mode = [identity.layout[dim_of[i]] if i in dim_of else Layout(1, 0) for i in range(len(flat))]
  layout = make_layout(*per_mode) if len(flat) > 1 else per_mode[0]
  return Tensor(layout, None, ArithmeticTuple(identity.offset))
