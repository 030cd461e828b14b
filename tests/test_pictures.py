"""Pictures of layouts (terminal, SVG, PNG) and the ``python -m layouts`` CLI.

The SM70 accumulator picture is checked against the reference document's
figure ``HMMA.8x8x4.quadpair.C.png`` (CuTe's ``mma.sync.8x8x4.quadpair.C``),
transcribed below, not against this package's own layouts.
"""

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from layouts import Layout
from layouts.__main__ import main
from layouts.atoms import mma_atom
from layouts.pictures import (
    PALETTE,
    layout_svg,
    print_tv_layout,
    render_layout,
    render_tv_layout,
    tv_layout_svg,
    tv_layout_table,
)

NT_F32 = "SM70_8x8x4_F32F16F16F32_NT"

# Left half of the figure: the lane owning each (m, n) of the 8x8 C tile.
FIGURE_LANES = """
 0  0  2  2  0  0  2  2
 1  1  3  3  1  1  3  3
 0  0  2  2  0  0  2  2
 1  1  3  3  1  1  3  3
16 16 18 18 16 16 18 18
17 17 19 19 17 17 19 19
16 16 18 18 16 16 18 18
17 17 19 19 17 17 19 19
"""
# Right half: thread 0's registers R0..R7 at (m, n); the text lists the same.
FIGURE_T0_REGISTERS = {
    (0, 0): 0,
    (0, 1): 1,
    (2, 0): 2,
    (2, 1): 3,
    (0, 4): 4,
    (0, 5): 5,
    (2, 4): 6,
    (2, 5): 7,
}
# "maps logical thread id [0,8) ... onto the quadpair thread index [0,4)U[16,20)"
LANES = [0, 1, 2, 3, 16, 17, 18, 19]


def figure_labels(lane_names: bool):
  """Expected ``T<t>V<v>`` of each cell, from the figure: every thread's
  registers repeat thread 0's pattern from the thread's top-left cell."""
  lanes = [[int(x) for x in line.split()] for line in FIGURE_LANES.strip().splitlines()]
  corner = {}
  for m, row in enumerate(lanes):
    for n, lane in enumerate(row):
      corner[lane] = min(corner.get(lane, (8, 8)), (m, n))
  labels = {}
  for m, row in enumerate(lanes):
    for n, lane in enumerate(row):
      value = FIGURE_T0_REGISTERS[m - corner[lane][0], n - corner[lane][1]]
      labels[m, n] = f"T{lane if lane_names else LANES.index(lane)}V{value}"
  return labels


def table_cells(text):
  """{(row, col): label} of a printed table."""
  cells = {}
  for line in text.splitlines():
    match = re.match(r"\s*(\d+)\s+\|(.*)\|\s*$", line)
    if match:
      for n, label in enumerate(match.group(2).split("|")):
        cells[int(match.group(1)), n] = label.strip()
  return cells


def svg_cells(svg_text):
  """{(row, col): (label, fill)} of an SVG picture, found by geometry: each
  label belongs to the rectangle that contains its anchor point."""
  root = ET.fromstring(svg_text)
  ns = {"s": "http://www.w3.org/2000/svg"}
  rects = [
      {k: r.get(k) for k in ("x", "y", "width", "height", "fill")}
      for r in root.find("s:g[@id='cells']", ns)
  ]
  xs = sorted({float(r["x"]) for r in rects})
  ys = sorted({float(r["y"]) for r in rects})
  cells = {}
  for text in root.find("s:g[@id='labels']", ns):
    x, y = float(text.get("x")), float(text.get("y"))
    (rect,) = [
        r
        for r in rects
        if float(r["x"]) <= x < float(r["x"]) + float(r["width"])
        and float(r["y"]) <= y < float(r["y"]) + float(r["height"])
    ]
    cells[ys.index(float(rect["y"])), xs.index(float(rect["x"]))] = (text.text, rect["fill"])
  assert len(rects) == len(xs) * len(ys)
  return cells


# -- the SM70 accumulator against the reference figure --------------------------------


def test_sm70_accumulator_table_matches_the_figure():
  atom = mma_atom(NT_F32)
  assert table_cells(tv_layout_table(atom.c_layout, (8, 8))) == figure_labels(lane_names=False)
  assert table_cells(tv_layout_table(atom.c_layout, (8, 8), atom.thr_id)) == figure_labels(
      lane_names=True
  )


def test_sm70_accumulator_svg_matches_the_figure(tmp_path):
  atom = mma_atom(NT_F32)
  path = tmp_path / "c.svg"
  render_tv_layout(atom.c_layout, (8, 8), path, thr_id=atom.thr_id)
  cells = svg_cells(path.read_text())
  assert {cell: label for cell, (label, _) in cells.items()} == figure_labels(lane_names=True)
  for label, fill in cells.values():
    lane = int(re.match(r"T(\d+)V", label).group(1))
    assert fill == PALETTE[lane % 8]
  # As in CuTe's pictures: lanes 0 and 16 blue, 1 and 17 green, 2 and 18 yellow, 3 and 19 red.
  assert [cells[0, 0][1], cells[1, 0][1], cells[0, 2][1], cells[1, 2][1], cells[4, 0][1]] == [
      "#afafff",
      "#afffaf",
      "#ffffaf",
      "#ffafaf",
      "#afafff",
  ]


def test_palette_is_eight_pastel_colors():
  assert len(set(PALETTE)) == 8
  assert all(min(int(c[i : i + 2], 16) for i in (1, 3, 5)) >= 0xAF for c in PALETTE)


# -- other pictures ---------------------------------------------------------------------


def test_sm90_accumulator_core_matrix():
  # CuTe's "GMMA C/D core matrix": T0..T3 across row 0, T4..T7 across row 1, ...
  atom = mma_atom("SM90_64x8x16_F32F16F16_SS")
  cells = table_cells(tv_layout_table(atom.c_layout, (64, 8)))
  assert [cells[0, n] for n in range(8)] == [
      "T0V0",
      "T0V1",
      "T1V0",
      "T1V1",
      "T2V0",
      "T2V1",
      "T3V0",
      "T3V1",
  ]
  assert cells[1, 0] == "T4V0" and cells[8, 0] == "T0V2" and cells[16, 0] == "T32V0"


def test_broadcast_cells_show_the_first_thread():
  atom = mma_atom("SM90_64x8x16_F16F16F16_SS")  # A in shared memory: every thread sees every cell
  cells = table_cells(tv_layout_table(atom.a_layout, (64, 16)))
  assert cells[0, 0] == "T0V0" and cells[5, 3] == f"T0V{5 + 64 * 3}"


def test_empty_cells_and_bad_tiles():
  half = Layout((2, 2), (1, 2))  # covers 4 of the 8 cells of a 2x4 tile
  cells = table_cells(tv_layout_table(half, (2, 4)))
  assert cells[0, 0] == "T0V0" and cells[1, 3] == ""
  with pytest.raises(ValueError, match="outside"):
    tv_layout_table(half, (2, 1))
  with pytest.raises(ValueError, match="two modes"):
    tv_layout_table(Layout((2, 2, 2)), (4, 2))


def test_print_tv_layout(capsys):
  print_tv_layout(Layout((2, 3), (1, 2)), (2, 3))
  out = capsys.readouterr().out
  assert out.splitlines()[0] == "(2,3):(1,2)" and "| T1V2 |" in out


def test_plain_and_swizzled_layout_pictures(tmp_path):
  layout = Layout((4, 8), (8, 1))
  cells = svg_cells(layout_svg(layout))
  assert cells[1, 2] == ("10", PALETTE[10 % 8])
  swizzled = Layout.parse("Sw<3,3,3> o _0 o (8,64):(64,1)")
  path = tmp_path / "sw.svg"
  render_layout(swizzled, path)
  text = path.read_text()
  assert "Sw&lt;3,3,3&gt;" in text  # the title is escaped
  cells = svg_cells(text)
  # Row 1 swaps 8-element units 0 and 1; colors follow the unit.
  assert cells[1, 0] == ("72", PALETTE[1]) and cells[1, 8] == ("64", PALETTE[0])
  with pytest.raises(ValueError, match="rank 3"):
    render_layout(Layout((2, 2, 2)), tmp_path / "x.svg")


def test_tv_layout_svg_title():
  svg = tv_layout_svg(Layout((2, 2)), (2, 2), title="a <b> & c")
  assert "a &lt;b&gt; &amp; c" in svg
  ET.fromstring(svg)


def test_unknown_suffix(tmp_path):
  with pytest.raises(ValueError, match=".svg or .png"):
    render_layout(Layout(4), tmp_path / "x.pdf")


def test_png_needs_matplotlib(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
  with pytest.raises(RuntimeError, match="matplotlib"):
    render_layout(Layout((2, 2)), tmp_path / "x.png")
  render_layout(Layout((2, 2)), tmp_path / "x.svg")  # SVG needs nothing


def png_size(path):
  data = Path(path).read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_png(tmp_path):
  pytest.importorskip("matplotlib")
  atom = mma_atom(NT_F32)
  svg_path, png_path = tmp_path / "c.svg", tmp_path / "c.png"
  render_tv_layout(atom.c_layout, (8, 8), svg_path, thr_id=atom.thr_id)
  render_tv_layout(atom.c_layout, (8, 8), png_path, thr_id=atom.thr_id)
  root = ET.fromstring(svg_path.read_text())
  assert png_size(png_path) == (2 * int(root.get("width")), 2 * int(root.get("height")))


# -- the command line ----------------------------------------------------------------------


def test_cli_shows_an_atom(capsys, tmp_path):
  out_path = tmp_path / "c.svg"
  assert main(["show", NT_F32, "--out", str(out_path)]) == 0
  out = capsys.readouterr().out
  assert "mma.sync.aligned.m8n8k4.col.row.f32.f16.f16.f32" in out
  assert table_cells(out) == figure_labels(lane_names=True)
  assert {c: label for c, (label, _) in svg_cells(out_path.read_text()).items()} == figure_labels(
      lane_names=True
  )


def test_cli_operand_and_tiled(capsys):
  assert main(["show", "SM80_16x8x8_F32TF32TF32F32_TN", "--operand", "b"]) == 0
  cells = table_cells(capsys.readouterr().out)
  assert len(cells) == 8 * 8 and cells[0, 4] == "T0V1"  # (n, k) = (0, 4): lane 0's second register
  assert main(["show", NT_F32, "--atoms", "2x2"]) == 0
  cells = table_cells(capsys.readouterr().out)
  # Atoms in column-major order: quadpair 1 (lane 4) is below quadpair 0, quadpair 2 (lane 8) to its right.
  assert (
      len(cells) == 16 * 16
      and cells[8, 0] == "T4V0"
      and cells[0, 8] == "T8V0"
      and cells[4, 0] == "T16V0"
  )


def test_cli_shows_a_layout(capsys, tmp_path):
  assert main(["show", "Sw<3,4,3> o _0 o (8,64):(64,1)"]) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[0] == "Sw<3,4,3> o _0 o (8,64):(64,1)"
  assert main(["show", "(4,2):(2,1)", "--out", str(tmp_path / "l.svg")]) == 0
  assert (tmp_path / "l.svg").exists()


def test_cli_errors(capsys):
  assert main(["show", "SM90_64x128x16_F16F16F16F16_TN"]) == 2
  assert "SM90_64x128x16_F16F16F16_SS" in capsys.readouterr().err
  assert main(["show", "(2,2,2)"]) == 2
  assert "rank 3" in capsys.readouterr().err
  assert main(["show", "(4,2)", "--operand", "a"]) == 2
  assert (
      main(
          [
              "show",
              "(4,2",
          ]
      )
      == 2
  )
  with pytest.raises(SystemExit):
    main(["show", NT_F32, "--atoms", "2xtwo"])


def test_cli_list(capsys):
  assert main(["list", "SM89"]) == 0
  assert len(capsys.readouterr().out.split()) == 8


def test_python_dash_m(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "layouts", "show", "SM90_64x8x16_F16F16F16_RS", "--operand", "a"],
      capture_output=True,
      text=True,
      cwd=Path(__file__).parent.parent,
      check=True,
  )
  assert "T127V7" in result.stdout
