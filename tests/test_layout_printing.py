"""CuTe notation: repr, Layout.parse / parse_layout, print_layout / layout_table."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layouts import (
    ComposedLayout,
    E,
    Layout,
    Swizzle,
    composition,
    layout_table,
    make_identity_layout,
    parse_layout,
    print_layout,
)

from layout_reference import PROFILE

# -- repr --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout, text",
    [
        (Layout(8), "8:1"),
        (Layout(8, 0), "8:0"),
        (Layout(4, -1), "4:-1"),
        (Layout((4, 3)), "(4,3):(1,4)"),
        (Layout((4, (2, 3)), (6, (3, 1))), "(4,(2,3)):(6,(3,1))"),
        (Layout((4,), (1,)), "(4):(1)"),
        (Layout(((2, 2), (8,)), ((1, 16), (2,))), "((2,2),(8)):((1,16),(2))"),
        (Layout((), ()), "():()"),
        (make_identity_layout((4, 8)), "(4,8):(1@0,1@1)"),
        (Layout((4, 8), (2 * E(0), 3 * E(1))), "(4,8):(2@0,3@1)"),
        (composition(Swizzle(3, 4, 3), Layout((8, 64), (64, 1))), "Sw<3,4,3> o _0 o (8,64):(64,1)"),
        (ComposedLayout(Swizzle(2, 0, -3), 5, Layout(8, -1)), "Sw<2,0,-3> o 5 o 8:-1"),
    ],
)
def test_repr_is_cute_notation_and_parses_back(layout, text):
  assert repr(layout) == text
  assert parse_layout(text) == layout
  assert type(layout).parse(text) == layout


# -- parse -----------------------------------------------------------------------------------


def test_parse_accepts_static_markers_whitespace_and_missing_stride():
  assert Layout.parse("(_4,_8):(_1,_4)") == Layout((4, 8), (1, 4))
  assert Layout.parse(" ( 4 , ( 2 , 3 ) ) : ( 6 , ( 3 , 1 ) ) ") == Layout((4, (2, 3)), (6, (3, 1)))
  assert Layout.parse("(4,(2,3))") == Layout((4, (2, 3)), (1, (4, 8)))  # column-major
  assert Layout.parse("(_4,_8):(_1@1,_1@0)") == Layout((4, 8), (E(1), E(0)))
  assert Layout.parse("(_4,_8):(_1@1,_1@0)")(2, 3) == (3, 2)
  cl = parse_layout("Sw<3,4,3> o 64 o (8,64):(64,1)")
  assert cl == ComposedLayout(Swizzle(3, 4, 3), 64, Layout((8, 64), (64, 1)))
  assert cl(0, 0) == Swizzle(3, 4, 3)(64)


@st.composite
def random_layouts(draw):
  def tree(depth):
    if depth == 0 or draw(st.booleans()):
      return "leaf"
    return tuple(tree(depth - 1) for _ in range(draw(st.integers(1, 3))))

  profile = tree(3)
  basis = draw(st.booleans())

  def fill(p, shape):
    if isinstance(p, tuple):
      return tuple(fill(q, shape) for q in p)
    if shape:
      return draw(st.integers(1, 12))
    if basis:
      return ScaledBasisOf(draw(st.integers(1, 9)), draw(st.integers(0, 3)))
    return draw(st.integers(-20, 40))

  return Layout(fill(profile, True), fill(profile, False))


def ScaledBasisOf(v, m):
  return v * E(m)


@PROFILE
@given(random_layouts(), st.booleans())
def test_parse_round_trip(L, static_marks):
  text = repr(L)
  if static_marks:
    # CuTe prints static integers as _N; the parser ignores the marks.
    text = "".join(
        ("_" + tok if tok[0].isdigit() or tok[0] == "-" else tok) for tok in _split_numbers(text)
    )
  assert parse_layout(text) == L


def _split_numbers(text):
  import re

  return [t for t in re.split(r"(-?\d+(?:@\d+)?)", text) if t]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "ends early"),
        ("(4,8", "ends early"),
        ("(4,8):(1,", "ends early"),
        ("4:", "ends early"),
        ("(4,8)::(1,4)", "expected a number"),
        ("(4,,8)", "expected a number"),
        (":4", "expected a number"),
        ("(4 8)", "expected ','"),
        ("((4,8):(1,4)", "expected ','"),
        ("(4,8):(1,4))", "unexpected"),
        ("(4,8):(1,4) extra", "cannot read"),
        ("abc", "cannot read"),
        ("4.5:1", "cannot read"),
        ("4:1@", "cannot read"),
        ("Sw<3,4,3> x (8):(1)", "cannot read"),
        ("Sw<3,4,3> o _0", "ends early"),
        ("Sw<3,4,3> o (8) o 8:1", "Sw<B,M,S> o offset o layout"),
        # Well-formed text that breaks a layout rule names that rule.
        ("(4,8):(1,4,2)", "not congruent"),
        ("(0,4)", "positive ints"),
        ("Sw<3,0,2> o _0 o 8:1", r"\|S\|"),
        ("(4,2):(1@0,1)", "mixes"),
    ],
)
def test_parse_errors(text, message):
  with pytest.raises(ValueError, match=message):
    parse_layout(text)


# -- print_layout / layout_table -----------------------------------------------------------------


def cells(table):
  """The cell texts of a layout_table, row by row."""
  rows = []
  for line in table.splitlines()[2:]:
    if line.lstrip().startswith("+"):
      continue
    rows.append([c.strip() for c in line.split("|")[1:-1]])
  return rows


def test_print_layout_col_major_4x3(capsys):
  # The Korean notes' example: Layout<(4,3),(1,4)>, cell (i, j) = i + 4j,
  # drawn as CuTe's print_layout does.
  expected = "\n".join(
      [
          "(4,3):(1,4)",
          "       0    1    2",
          "    +----+----+----+",
          " 0  |  0 |  4 |  8 |",
          "    +----+----+----+",
          " 1  |  1 |  5 |  9 |",
          "    +----+----+----+",
          " 2  |  2 |  6 | 10 |",
          "    +----+----+----+",
          " 3  |  3 |  7 | 11 |",
          "    +----+----+----+",
      ]
  )
  L = Layout((4, 3), (1, 4))
  assert layout_table(L) == expected
  print_layout(L)
  assert capsys.readouterr().out == expected + "\n"


@pytest.mark.parametrize(
    "L",
    [
        Layout((4, 8), (8, 1)),
        Layout(((2, 2), (2, 3)), ((1, 4), (2, 8))),
        Layout((3, (2, 2)), (0, (5, 1))),
    ],
)
def test_layout_table_cells_are_the_layout_values(L):
  # Rows are mode 0 and columns mode 1, each indexed by its flat
  # (column-major) coordinate; reference by numpy.
  sh = [x for x in _leaves(L.shape)]
  st_ = [x for x in _leaves(L.stride)]
  n = int(np.prod(sh))
  crd = np.unravel_index(np.arange(n), sh, order="F")
  off = sum(c * d for c, d in zip(crd, st_))
  rows = int(np.prod(_leaves(L.shape[0])))
  grid = np.asarray(off).reshape((rows, n // rows), order="F")
  assert cells(layout_table(L)) == [[str(v) for v in row] for row in grid.tolist()]


def _leaves(t):
  return tuple(x for s in t for x in _leaves(s)) if isinstance(t, tuple) else (t,)


def test_layout_table_of_rank1_swizzled_and_coordinate_layouts():
  assert cells(layout_table(Layout(3, 2))) == [["0"], ["2"], ["4"]]
  sw = composition(Swizzle(1, 0, 1), Layout((2, 2), (2, 1)))
  # Offsets 2r + c, then bit 1 XOR-ed into bit 0 swaps 2 and 3.
  assert cells(layout_table(sw)) == [["0", "1"], ["3", "2"]]
  assert cells(layout_table(make_identity_layout((2, 2)))) == [
      ["(0, 0)", "(0, 1)"],
      ["(1, 0)", "(1, 1)"],
  ]


def test_layout_table_needs_rank_at_most_two():
  with pytest.raises(ValueError, match="rank"):
    layout_table(Layout((2, 2, 2)))
