"""CuTe notation in and out: ``repr``, ``Layout.parse`` and ``print_layout``.

>>> parse_layout("(4,(2,3)):(6,(3,1))")
(4,(2,3)):(6,(3,1))
>>> parse_layout("Sw<3,4,3> o _0 o (8,64):(64,1)")
Sw<3,4,3> o _0 o (8,64):(64,1)
>>> parse_layout("(_4,_8):(_1@1,_1@0)")(2, 3)
(3, 2)
"""

from __future__ import annotations

import re

from .basis import ScaledBasis
from .int_tuple import is_tuple

__all__ = ["format_tuple", "parse_layout", "print_layout", "layout_table"]


def format_tuple(t) -> str:
  """``(4,(2,3))`` style, no spaces."""
  if is_tuple(t):
    return "(" + ",".join(format_tuple(x) for x in t) + ")"
  return str(t)


_TOKEN = re.compile(
    r"\s*(?:(Sw<\s*-?\d+\s*,\s*-?\d+\s*,\s*-?\d+\s*>)|(_?-?\d+(?:@\d+)?)|([(),:])|(o\b))"
)


def _tokens(text: str):
  pos, out = 0, []
  text = text.strip()
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m or m.end() == pos:
      raise ValueError(f"parse_layout: cannot read {text[pos:]!r} in {text!r}")
    out.append(next(g for g in m.groups() if g is not None))
    pos = m.end()
  return out


def _leaf(tok: str):
  if not re.fullmatch(r"_?-?\d+(?:@\d+)?", tok):
    raise ValueError(f"parse_layout: expected a number, got {tok!r}")
  tok = tok.lstrip("_")
  if "@" in tok:
    value, mode = tok.split("@")
    return ScaledBasis(int(value), int(mode))
  return int(tok)


def _tuple(tokens, i):
  """Parse an int tuple starting at tokens[i]; return (value, next index)."""
  if tokens[i] != "(":
    return _leaf(tokens[i]), i + 1
  items, i = [], i + 1
  while tokens[i] != ")":
    item, i = _tuple(tokens, i)
    items.append(item)
    if tokens[i] == ",":
      i += 1
    elif tokens[i] != ")":
      raise ValueError(f"parse_layout: expected ',' or ')' before {tokens[i]!r}")
  return tuple(items), i + 1


def parse_layout(text: str):
  """Read ``shape:stride``, ``shape`` (column-major) or
  ``Sw<B,M,S> o offset o shape:stride``; static ``_8`` and basis ``1@0``
  leaves are accepted."""
  from .layout import Layout
  from .swizzle import ComposedLayout, Swizzle

  tokens = _tokens(text)
  try:
    if tokens[0].startswith("Sw<"):
      bits, base, shift = (int(x) for x in re.findall(r"-?\d+", tokens[0]))
      if tokens[1] != "o" or tokens[3] != "o":
        raise ValueError(f"parse_layout: expected 'Sw<B,M,S> o offset o layout', got {text!r}")
      inner = parse_layout(" ".join(tokens[4:]))
      return ComposedLayout(Swizzle(bits, base, shift), _leaf(tokens[2]), inner)
    shape, i = _tuple(tokens, 0)
    stride = None
    if i < len(tokens) and tokens[i] == ":":
      stride, i = _tuple(tokens, i + 1)
    if i != len(tokens):
      raise ValueError(f"parse_layout: unexpected {' '.join(tokens[i:])!r} in {text!r}")
  except IndexError:
    raise ValueError(f"parse_layout: {text!r} ends early") from None
  return Layout(shape, stride)


def layout_table(layout) -> str:
  """The 2-D table of a rank-1 or rank-2 layout's values, as CuTe's
  ``print_layout`` draws it (rows are mode 0, columns mode 1)."""
  from .layout import rank, size

  if rank(layout) > 2:
    raise ValueError(f"print_layout: {layout} has rank {rank(layout)}; group modes to rank 2 first")
  if rank(layout) == 2:
    rows, cols = size(layout[0]), size(layout[1])
    cells = [[str(layout(m, n)) for n in range(cols)] for m in range(rows)]
  else:
    rows, cols = size(layout), 1
    cells = [[str(layout(m))] for m in range(rows)]
  width = max(len(c) for row in cells for c in row) + 2
  rule = "    " + ("+" + "-" * width) * cols + "+"
  lines = [repr(layout), "    " + "".join(f" {n:>{width - 1}} " for n in range(cols)).rstrip()]
  for m, row in enumerate(cells):
    lines.append(rule)
    lines.append(f"{m:>2}  " + "".join(f"| {c:>{width - 2}} " for c in row) + "|")
  lines.append(rule)
  return "\n".join(lines)


def print_layout(layout) -> None:
  """Print ``layout_table(layout)``.

  >>> print_layout(parse_layout("(2,3):(1,2)"))  # doctest: +NORMALIZE_WHITESPACE
  (2,3):(1,2)
        0   1   2
      +---+---+---+
   0  | 0 | 2 | 4 |
      +---+---+---+
   1  | 1 | 3 | 5 |
      +---+---+---+
  """
  print(layout_table(layout))
