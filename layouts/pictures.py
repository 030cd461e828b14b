"""Pictures of layouts: terminal tables and SVG/PNG grids, like CuTe's
``print_layout`` and ``print_latex``.

A thread-value (TV) layout maps ``(thread, value)`` to a cell ``m + M*n`` of an
``M x N`` tile; its picture labels each cell ``T<thread>V<value>`` and colors it
by thread (8 pastel colors, cycling, as CuTe's ``print_latex``). A plain layout
is drawn as its table of offsets, colored by offset; a swizzled layout
``Sw<B,M,S> o ...`` by its unit of ``2**M`` offsets, which the swizzle moves
as a block, so the picture shows where each unit goes. When several ``(t, v)``
land on one cell (a broadcast, like a ``wgmma`` operand in shared memory that
every thread sees), the cell shows the first: the smallest thread, then value.

>>> from layouts import Layout
>>> print_tv_layout(Layout((2, 3), (1, 2)), (2, 3))  # 2 threads, one row each
(2,3):(1,2)
         0      1      2
    +------+------+------+
 0  | T0V0 | T0V1 | T0V2 |
    +------+------+------+
 1  | T1V0 | T1V1 | T1V2 |
    +------+------+------+
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

from .layout import rank, size
from .swizzle import Swizzle

__all__ = [
    "PALETTE",
    "tv_layout_table",
    "print_tv_layout",
    "render_layout",
    "render_tv_layout",
    "layout_svg",
    "tv_layout_svg",
]

PALETTE = ("#afafff", "#afffaf", "#ffffaf", "#ffafaf", "#d2d2ff", "#d2ffd2", "#ffffd2", "#ffd2d2")
"""Cell colors: thread ``t`` (or offset ``o``) gets ``PALETTE[t % 8]``."""

_CELL_HEIGHT, _CHAR_WIDTH, _FONT_SIZE, _MARGIN = 22, 7, 11, 34


@dataclass(frozen=True)
class _Grid:
  """What a picture shows: a title and, per cell, a label and a palette index."""

  title: str
  labels: tuple  # rows of str ("" for an empty cell)
  colors: tuple  # rows of palette indices (None: white)


def _tv_grid(tv_layout, tile_shape, thr_id=None, title=None) -> _Grid:
  rows, cols = tile_shape
  if rank(tv_layout) != 2:
    raise ValueError(
        f"a TV layout has two modes (thread, value); {tv_layout} has {rank(tv_layout)}"
    )
  threads, values = size(tv_layout[0]), size(tv_layout[1])
  t = np.repeat(np.arange(threads), values)
  v = np.tile(np.arange(values), threads)
  cell = np.asarray(tv_layout(t, v)) + np.zeros_like(t)
  if cell.min() < 0 or cell.max() >= rows * cols:
    raise ValueError(
        f"{tv_layout} reaches offsets {cell.min()}..{cell.max()}, outside the {rows}x{cols} tile"
    )
  first = np.full(rows * cols, -1)
  cells, where = np.unique(cell, return_index=True)  # first (t, v) of each cell, t outermost
  first[cells] = where
  names = (
      np.asarray([thr_id(int(x)) for x in range(threads)])
      if thr_id is not None
      else np.arange(threads)
  )
  labels, colors = [], []
  for m in range(rows):
    row_labels, row_colors = [], []
    for n in range(cols):
      k = first[m + rows * n]
      if k < 0:
        row_labels.append("")
        row_colors.append(None)
      else:
        thread = int(names[t[k]])
        row_labels.append(f"T{thread}V{v[k]}")
        row_colors.append(thread % len(PALETTE))
    labels.append(tuple(row_labels))
    colors.append(tuple(row_colors))
  return _Grid(title or repr(tv_layout), tuple(labels), tuple(colors))


def _layout_grid(layout, title=None) -> _Grid:
  if rank(layout) > 2:
    raise ValueError(f"cannot draw {layout}: rank {rank(layout)}; group its modes to rank 2 first")
  rows, cols = (size(layout[0]), size(layout[1])) if rank(layout) == 2 else (size(layout), 1)
  offsets = [
      [layout(m, n) if rank(layout) == 2 else layout(m) for n in range(cols)] for m in range(rows)
  ]
  unit = 1 << layout.outer.base if isinstance(getattr(layout, "outer", None), Swizzle) else 1
  labels = tuple(tuple(str(o) for o in row) for row in offsets)
  colors = tuple(
      tuple(o // unit % len(PALETTE) if isinstance(o, int) else None for o in row)
      for row in offsets
  )
  return _Grid(title or repr(layout), labels, colors)


# -- terminal ------------------------------------------------------------------


def _grid_table(grid: _Grid) -> str:
  cols = len(grid.labels[0])
  width = max(len(label) for row in grid.labels for label in row) + 2
  rule = "    " + ("+" + "-" * width) * cols + "+"
  lines = [grid.title, "    " + "".join(f" {n:>{width - 1}} " for n in range(cols)).rstrip()]
  for m, row in enumerate(grid.labels):
    lines.append(rule)
    lines.append(f"{m:>2}  " + "".join(f"| {label:>{width - 2}} " for label in row) + "|")
  lines.append(rule)
  return "\n".join(lines)


def tv_layout_table(tv_layout, tile_shape, thr_id=None) -> str:
  """The ``M x N`` table of ``T<t>V<v>`` labels of a TV layout.

  ``thr_id`` (a layout, e.g. an atom's) renames logical threads to the
  thread indices it maps them to, as CuTe's pictures do (an SM70 quadpair's
  logical thread 4 is lane 16).
  """
  return _grid_table(_tv_grid(tv_layout, tile_shape, thr_id))


def print_tv_layout(tv_layout, tile_shape, thr_id=None) -> None:
  """Print :func:`tv_layout_table`."""
  print(tv_layout_table(tv_layout, tile_shape, thr_id))


# -- SVG and PNG ---------------------------------------------------------------


def _geometry(grid: _Grid):
  """Cell width and height, the left and top edges of the cells, and the
  picture's width and height, in pixels."""
  cell_w = max(3, max(len(label) for row in grid.labels for label in row)) * _CHAR_WIDTH + 10
  left, top = _MARGIN, _MARGIN + _CELL_HEIGHT
  rows, cols = len(grid.labels), len(grid.labels[0])
  title_w = len(grid.title) * (_FONT_SIZE + 2) * 0.62
  width = left + max(cols * cell_w, title_w) + 10
  return cell_w, _CELL_HEIGHT, left, top, int(width), top + rows * _CELL_HEIGHT + 10


def _grid_svg(grid: _Grid) -> str:
  cell_w, cell_h, left, top, width, height = _geometry(grid)
  rows, cols = len(grid.labels), len(grid.labels[0])
  baseline = 0.35 * _FONT_SIZE  # from a text's center to its baseline
  font = f'font-family="monospace" font-size="{_FONT_SIZE}"'
  out = [
      f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
      f'viewBox="0 0 {width} {height}">',
      f'<rect width="{width}" height="{height}" fill="white"/>',
      f'<text x="{left}" y="{_MARGIN / 2 + baseline}" font-family="monospace" font-size="{_FONT_SIZE + 2}">'
      f"{escape(grid.title)}</text>",
      '<g id="cells" stroke="black" stroke-width="0.5">',
  ]
  for m in range(rows):
    for n in range(cols):
      color = grid.colors[m][n]
      out.append(
          f'<rect x="{left + n * cell_w}" y="{top + m * cell_h}" width="{cell_w}" height="{cell_h}" '
          f'fill="{"white" if color is None else PALETTE[color]}"/>'
      )
  out.append(f'</g>\n<g id="indices" {font} text-anchor="middle">')
  out += [
      f'<text x="{left + (n + 0.5) * cell_w}" y="{top - cell_h / 2 + baseline}">{n}</text>'
      for n in range(cols)
  ]
  out += [
      f'<text x="{left / 2}" y="{top + (m + 0.5) * cell_h + baseline}">{m}</text>'
      for m in range(rows)
  ]
  out.append(f'</g>\n<g id="labels" {font} text-anchor="middle">')
  out += [
      f'<text x="{left + (n + 0.5) * cell_w}" y="{top + (m + 0.5) * cell_h + baseline}">'
      f"{escape(grid.labels[m][n])}</text>"
      for m in range(rows)
      for n in range(cols)
      if grid.labels[m][n]
  ]
  out.append("</g>\n</svg>")
  return "\n".join(out) + "\n"


def _write_png(grid: _Grid, path: Path) -> None:
  try:
    from matplotlib.collections import PatchCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
  except ImportError:
    raise RuntimeError(
        f"writing {path} needs matplotlib (pip install matplotlib); " "an .svg path needs nothing"
    ) from None
  cell_w, cell_h, left, top, width, height = _geometry(grid)
  rows, cols = len(grid.labels), len(grid.labels[0])
  dpi, scale = 100, 2  # one SVG pixel is two PNG pixels
  fig = Figure(
      figsize=(width * scale / dpi, height * scale / dpi), dpi=dpi
  )  # no pyplot: no global state
  ax = fig.add_axes((0, 0, 1, 1))
  ax.set_xlim(0, width)
  ax.set_ylim(height, 0)
  ax.axis("off")
  points = _FONT_SIZE * scale * 72 / dpi
  rects = [
      Rectangle((left + n * cell_w, top + m * cell_h), cell_w, cell_h)
      for m in range(rows)
      for n in range(cols)
  ]
  fills = ["white" if c is None else PALETTE[c] for row in grid.colors for c in row]
  ax.add_collection(
      PatchCollection(rects, facecolors=fills, edgecolors="black", linewidths=0.5 * scale)
  )
  style = dict(ha="center", va="center", family="monospace", fontsize=points)
  ax.text(
      left,
      _MARGIN / 2,
      grid.title,
      ha="left",
      va="center",
      family="monospace",
      fontsize=points * 1.2,
  )
  for n in range(cols):
    ax.text(left + n * cell_w + cell_w / 2, top - cell_h / 2, str(n), **style)
  for m in range(rows):
    ax.text(left / 2, top + m * cell_h + cell_h / 2, str(m), **style)
    for n in range(cols):
      if grid.labels[m][n]:
        ax.text(
            left + n * cell_w + cell_w / 2,
            top + m * cell_h + cell_h / 2,
            grid.labels[m][n],
            **style,
        )
  fig.savefig(path, dpi=dpi)


def _write(grid: _Grid, path) -> None:
  path = Path(path)
  suffix = path.suffix.lower()
  if suffix == ".svg":
    path.write_text(_grid_svg(grid))
  elif suffix == ".png":
    _write_png(grid, path)
  else:
    raise ValueError(f"cannot write {path}: use a .svg or .png path")


def layout_svg(layout, title=None) -> str:
  """The SVG picture of a rank-1 or rank-2 layout (a table of offsets)."""
  return _grid_svg(_layout_grid(layout, title))


def tv_layout_svg(tv_layout, tile_shape, thr_id=None, title=None) -> str:
  """The SVG picture of a TV layout over an ``M x N`` tile."""
  return _grid_svg(_tv_grid(tv_layout, tile_shape, thr_id, title))


def render_layout(layout, path, title=None) -> None:
  """Draw a rank-1 or rank-2 layout (or swizzled layout) into ``path``:
  ``.svg`` (always) or ``.png`` (needs matplotlib)."""
  _write(_layout_grid(layout, title), path)


def render_tv_layout(tv_layout, tile_shape, path, thr_id=None, title=None) -> None:
  """Draw a TV layout over an ``M x N`` tile into ``path`` (``.svg``, or
  ``.png`` with matplotlib); ``thr_id`` as in :func:`tv_layout_table`.

  >>> import tempfile, os
  >>> from layouts.atoms import mma_atom
  >>> atom = mma_atom("SM70_8x8x4_F32F16F16F32_NT")
  >>> with tempfile.TemporaryDirectory() as d:
  ...     render_tv_layout(atom.c_layout, (8, 8), os.path.join(d, "c.svg"), thr_id=atom.thr_id)
  ...     "T16V0" in open(os.path.join(d, "c.svg")).read()
  True
  """
  _write(_tv_grid(tv_layout, tile_shape, thr_id, title), path)
