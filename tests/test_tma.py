"""TMA tensor maps and coordinate tensors against ``shared/reference/cute_tma_tensors.txt``
("the document") and the rules of ``cuTensorMapEncodeTiled``."""

import doctest
import itertools

import numpy as np
import pytest

import layouts.tma
from layouts import ArithmeticTuple, Layout, Tensor, local_tile, make_identity_tensor, parse_layout, size
from layouts.gmma import gmma_smem_spec
from layouts.tma import make_tma_desc


def test_docstring_examples():
  assert doctest.testmod(layouts.tma).failed == 0


# -- the document's examples ------------------------------------------------------


def test_document_integer_strides_give_offsets():
  # "for 'ordinary' integer strides, e.g., (1, 100), the inner product of the
  #  input coordinate (i, j) and the strides is i + 100j"
  layout = Layout((4, 8), (1, 100))
  for i, j in itertools.product(range(4), range(8)):
    assert layout(i, j) == i + 100 * j


def test_document_basis_strides_give_coordinates():
  # "if the strides are (_1@0, _1@1) ... That translates into the (TMA) coordinate (i, j)"
  # "If we wanted to reverse the coordinates, then we could use (_1@1, _1@0) ... that is, (j, i)"
  identity, reversed_ = parse_layout("(_4,_8):(_1@0,_1@1)"), parse_layout("(_4,_8):(_1@1,_1@0)")
  for i, j in itertools.product(range(4), range(8)):
    assert identity(i, j) == (i, j)
    assert reversed_(i, j) == (j, i)


def test_document_arithmetic_tuples_add_elementwise():
  # "The sum of two tuples is the tuple of the sum of the elements."
  assert ArithmeticTuple((1, 2, 3)) + ArithmeticTuple((10, 20, 30)) == (11, 22, 33)


def test_document_base_coordinate_moves_when_sliced():
  # "the base coordinate of the whole tensor might start out as (0, 0, ..., 0).
  #  However, slicing the tensor might result in a different base coordinate."
  coords = make_identity_tensor((64, 32))
  assert coords.offset == (0, 0)
  assert local_tile(coords, (16, 8), (2, 3)).offset == (32, 24)
  assert coords(None, 5).offset == (0, 5)


# -- GEMM operand tiles -----------------------------------------------------------


@pytest.mark.parametrize("m,k,bm,bk", [(512, 256, 128, 64), (256, 128, 64, 32), (64, 64, 64, 64)])
def test_row_major_operand_tiles_are_transposed_coordinates(m, k, bm, bk):
  desc = make_tma_desc(Layout((m, k), (k, 1)), (bm, bk), "bf16")
  assert (desc.global_dims, desc.global_strides, desc.box_dims) == ((k, m), (2 * k,), (bk, bm))
  assert desc.modes == (1, 0)
  assert desc.coords.layout == parse_layout(f"({m},{k}):(1@1,1@0)")
  for i, j in itertools.product(range(m // bm), range(k // bk)):
    assert local_tile(desc.coords, (bm, bk), (i, j)).offset == (j * bk, i * bm)


@pytest.mark.parametrize("m,k,bm,bk", [(512, 256, 128, 64), (128, 64, 64, 32)])
def test_column_major_operand_tiles_are_identity_coordinates(m, k, bm, bk):
  desc = make_tma_desc(Layout((m, k), (1, m)), (bm, bk), "f16")
  assert (desc.global_dims, desc.global_strides, desc.box_dims) == ((m, k), (2 * m,), (bm, bk))
  assert desc.coords.layout == parse_layout(f"({m},{k}):(1@0,1@1)")
  for i, j in itertools.product(range(m // bm), range(k // bk)):
    assert local_tile(desc.coords, (bm, bk), (i, j)).offset == (i * bm, j * bk)


def test_batched_operand_and_size_one_modes():
  desc = make_tma_desc(Layout((4, 128, 64), (128 * 64, 64, 1)), (1, 64, 64), "bf16")
  assert (desc.rank, desc.global_dims, desc.modes) == (3, (64, 128, 4), (2, 1, 0))
  assert local_tile(desc.coords, (1, 64, 64), (3, 1, 0)).offset == (0, 64, 3)
  single = make_tma_desc(Layout((1, 128, 64), (0, 64, 1)), (1, 64, 64), "bf16")
  assert (single.rank, single.global_dims, single.modes) == (2, (64, 128), (2, 1))
  assert local_tile(single.coords, (1, 64, 64), (0, 1, 0)).offset == (0, 64)


LAYOUTS = [
    Layout((96, 80), (80, 1)),  # row-major
    Layout((96, 80), (1, 104)),  # column-major, padded leading dimension
    Layout((6, 40, 24), (1200, 1, 48)),  # batched, K-contiguous, padded
    Layout((8, (4, 6)), (1, (8, 32))),  # a nested mode that coalesces into one stride
]


@pytest.mark.parametrize("gmem", LAYOUTS)
def test_tensor_map_reproduces_the_layout(gmem):
  """offset(c) = sum over TMA dims of coordinate * stride: the map describes gmem."""
  bits = 16
  box = tuple(8 for _ in range(len(gmem)))
  desc = make_tma_desc(gmem, box, "bf16")
  elem_strides = (1,) + tuple(s * 8 // bits for s in desc.global_strides)
  idx = np.arange(size(gmem))
  tma_coord = desc.coords(idx)
  recomputed = sum(np.asarray(c) * s for c, s in zip(tma_coord, elem_strides))
  assert np.array_equal(recomputed, gmem(idx))
  assert all(np.asarray(c).max() < d for c, d in zip(tma_coord, desc.global_dims))


def test_sliced_tensor_origin_is_the_global_offset():
  gmem = Layout((256, 128), (128, 1))
  tile = local_tile(gmem, (64, 64), (1, 1))  # a view starting at row 64, column 64
  desc = make_tma_desc(tile, (64, 64), "bf16")
  assert desc.global_offset == (64 * 128 + 64) * 2
  with pytest.raises(ValueError, match="16-byte aligned"):
    make_tma_desc(Tensor(gmem, None, 4), (64, 64), "bf16")


def test_box_for_a_gmma_tile():
  spec = gmma_smem_spec("bf16", (128, 64), "K")
  desc = make_tma_desc(Layout((4096, 4096), (4096, 1)), (128, 64), "bf16", swizzle=spec.swizzle)
  assert desc.box_dims == (64, 128) and desc.swizzle == 128


# -- hardware rules ---------------------------------------------------------------


@pytest.mark.parametrize(
    "gmem,box,dtype,swizzle,kwargs,rule",
    [
        (
            Layout((2, 2, 2, 2, 2, 16), (512, 256, 128, 64, 32, 1)),
            (1, 1, 1, 1, 1, 16),
            "bf16",
            0,
            {},
            "at most 5 dimensions",
        ),
        (Layout((64, 100), (100, 1)), (8, 8), "bf16", 0, {}, "multiples of 16 bytes"),
        (Layout((2, 16), (1 << 40, 1)), (1, 16), "e4m3", 0, {}, "below 2\\*\\*40"),
        (Layout((64, 64), (64, 1)), (512, 64), "bf16", 0, {}, r"box dims must be in \[1, 256\]"),
        (
            Layout((64, 64), (64, 1)),
            (64, 4),
            "bf16",
            0,
            {},
            "inner box dimension must be a multiple of 16 bytes",
        ),
        (Layout((256, 256), (256, 1)), (64, 128), "bf16", 128, {}, "at most 128 bytes"),
        (Layout((256, 256), (256, 1)), (64, 64), "bf16", 64, {}, "at most 64 bytes"),
        (
            Layout((64, 64), (64, 1)),
            (8, 8),
            "bf16",
            0,
            {"element_strides": (9, 1)},
            r"element strides must be in \[1, 8\]",
        ),
        (Layout((64, 64), (128, 2)), (8, 8), "bf16", 0, {}, "no stride-1 mode"),
        (Layout((64, 64), (32, 1)), (8, 8), "bf16", 0, {}, "must cover the dimension below"),
        (Layout((64, 64), (0, 1)), (8, 8), "bf16", 0, {}, "walks memory forwards"),
        (Layout(((4, 4), 64), ((1, 512), 4)), (8, 8), "f32", 0, {}, "one stride"),
        (Layout((64, 64), (64, 1)), (8, 32), "int4", 0, {}, "1, 2, 4 or 8 bytes"),
        (Layout((64, 64), (64, 1)), (8, 8), "bf16", 16, {}, "swizzle must be"),
        (Layout((64, 64), (64, 1)), (8, 8, 8), "bf16", 0, {}, "one int per mode"),
        (Layout(((1 << 16) + 16, 1 << 17), (1, (1 << 16) + 16)), (16, 8), "e4m3", 0, {}, None),
    ],
)
def test_rules_are_named(gmem, box, dtype, swizzle, kwargs, rule):
  if rule is None:  # a large but legal map
    assert make_tma_desc(gmem, box, dtype, swizzle, **kwargs).global_dims == (
        (1 << 16) + 16,
        1 << 17,
    )
    return
  with pytest.raises(ValueError, match=rule):
    make_tma_desc(gmem, box, dtype, swizzle, **kwargs)


def test_global_dims_limit():
  with pytest.raises(ValueError, match=r"at most 2\*\*32"):
    make_tma_desc(Layout(((1 << 32) + 16,), (1,)), (16,), "e4m3")
