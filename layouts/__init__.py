"""layouts: CuTe's layout algebra as pure functions over immutable values.

Layouts, swizzles and coordinate layouts evaluate the same way on Python ints,
numpy integer arrays and traced jax integers (inside ``jit``, ``vmap`` and
Pallas kernels): evaluation uses only ``+ * // % & ^ >> <<``.

>>> from layouts import Layout, Swizzle, composition, zipped_divide
>>> zipped_divide(Layout((8, 8), (8, 1)), (4, 2))
((4,2),(2,4)):((8,1),(32,2))
>>> composition(Swizzle(3, 3, 3), Layout((8, 64), (64, 1)))(1, 0)
72
"""

from .basis import ArithmeticTuple, E, ScaledBasis
from .coordinates import make_identity_layout
from .int_tuple import (
    compatible, congruent, crd2idx, flatten, idx2crd, inner_product, prefix_product,
    product, shape_div, suffix_product,
)
from .layout import (
    Layout, LayoutLeft, LayoutRight, append, blocked_product, coalesce, complement,
    composition, cosize, depth, downcast, filter, flat_divide, flat_product, group_modes,
    left_inverse, local_partition, local_tile, logical_divide, logical_product, make_layout,
    max_common_layout, max_common_vector, prepend, raked_product, rank, recast,
    right_inverse, select, size, slice_and_offset, tiled_divide, tiled_product, upcast,
    zipped_divide, zipped_product,
)
from .printing import layout_table, parse_layout, print_layout
from .swizzle import ComposedLayout, Swizzle
from .tensor import Tensor, make_identity_tensor, make_tensor

# Hardware: MMA atoms, WGMMA shared memory, TMA, cooperative matrices, pictures.
from .atoms import (
    MMAAtom, MMAOperation, MMATraits, Registers, UnknownAtomError, mma_atom, mma_atoms,
    mma_fragment,
)
from .coopmatrix import CoopMatrixParams, coopmatrix_layout, coopmatrix_load, coopmatrix_params
from .dtypes import dtype_bits
from .gmma import (
    GmmaDescriptor, GmmaSmemSpec, encode_gmma_desc, gmma_canonical_layout, gmma_smem_layout,
    gmma_smem_spec, gmma_swizzle, gmma_swizzle_atom, make_gmma_desc, make_gmma_descs,
)
from .pictures import (
    PALETTE, layout_svg, print_tv_layout, render_layout, render_tv_layout, tv_layout_svg,
    tv_layout_table,
)
from .tiled_mma import TiledMMA, make_tiled_mma
from .tma import TmaDescriptor, make_tma_desc

__all__ = [
    "ArithmeticTuple", "E", "ScaledBasis", "make_identity_layout",
    "compatible", "congruent", "crd2idx", "flatten", "idx2crd", "inner_product",
    "prefix_product", "product", "shape_div", "suffix_product",
    "Layout", "LayoutLeft", "LayoutRight", "append", "blocked_product", "coalesce",
    "complement", "composition", "cosize", "depth", "downcast", "filter", "flat_divide",
    "flat_product", "group_modes", "left_inverse", "local_partition", "local_tile",
    "logical_divide", "logical_product", "make_layout", "max_common_layout",
    "max_common_vector", "prepend", "raked_product", "rank", "recast", "right_inverse",
    "select", "size", "slice_and_offset", "tiled_divide", "tiled_product", "upcast",
    "zipped_divide", "zipped_product",
    "layout_table", "parse_layout", "print_layout",
    "ComposedLayout", "Swizzle", "Tensor", "make_identity_tensor", "make_tensor",
    "MMAAtom", "MMAOperation", "MMATraits", "Registers", "UnknownAtomError", "mma_atom",
    "mma_atoms", "mma_fragment",
    "CoopMatrixParams", "coopmatrix_layout", "coopmatrix_load", "coopmatrix_params",
    "dtype_bits",
    "GmmaDescriptor", "GmmaSmemSpec", "encode_gmma_desc", "gmma_canonical_layout",
    "gmma_smem_layout", "gmma_smem_spec", "gmma_swizzle", "gmma_swizzle_atom",
    "make_gmma_desc", "make_gmma_descs",
    "PALETTE", "layout_svg", "print_tv_layout", "render_layout", "render_tv_layout",
    "tv_layout_svg", "tv_layout_table",
    "TiledMMA", "make_tiled_mma", "TmaDescriptor", "make_tma_desc",
]
