"""Command line: look at layouts and MMA atoms.

    python -m layouts show SM90_64x128x16_F32BF16BF16_SS --out c.svg
    python -m layouts show SM80_16x8x16_F32BF16BF16F32_TN --operand a --atoms 2x2x1
    python -m layouts show "Sw<3,4,3> o _0 o (8,64):(64,1)" --out sw.png
    python -m layouts list SM89

``show`` prints an atom's summary and the table of one operand's thread-value
layout (C unless ``--operand``), or a layout's table; ``--out`` also draws it
(``.svg``, or ``.png`` with matplotlib). ``--atoms MxNxK`` shows the tiled MMA
of that many atoms instead of one atom.
"""

from __future__ import annotations

import argparse
import sys

from .atoms import mma_atom, mma_atoms
from .pictures import print_tv_layout, render_layout, render_tv_layout
from .printing import parse_layout, print_layout
from .tiled_mma import make_tiled_mma


def _atom_shape(text: str) -> tuple[int, ...]:
  try:
    shape = tuple(int(x) for x in text.lower().split("x"))
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected MxNxK, like 2x2x1, got {text!r}") from None
  if not 1 <= len(shape) <= 3 or min(shape) < 1:
    raise argparse.ArgumentTypeError(f"expected MxNxK of positive ints, got {text!r}")
  return shape


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m layouts", description="Show CuTe layouts and MMA atoms."
  )
  commands = parser.add_subparsers(dest="command", required=True)
  show = commands.add_parser("show", help="print (and draw) an MMA atom's layout or a layout")
  show.add_argument("target", help='an atom name, or a layout like "(8,64):(64,1)"')
  show.add_argument(
      "--operand", choices=("a", "b", "c"), default="c", help="which operand of an atom (default c)"
  )
  show.add_argument("--atoms", type=_atom_shape, help="tile the atom MxNxK times (e.g. 2x2x1)")
  show.add_argument("--out", help="also draw the picture into this .svg or .png file")
  listing = commands.add_parser("list", help="list the MMA atoms")
  listing.add_argument("contains", nargs="?", default="", help="only names containing this")
  return parser


def _show_atom(args) -> None:
  atom = mma_atom(args.target)
  op, traits = atom.operation, atom.traits
  print(f"{atom.name}: {op.ptx}")
  print(
      f"  D={traits.d_type} A={traits.a_type} ({op.a_source}) B={traits.b_type} ({op.b_source}) "
      f"C={traits.c_type}, M x N x K = {'x'.join(map(str, atom.shape_mnk))}, thr_id {atom.thr_id}"
  )
  print(f"  A {atom.a_layout}\n  B {atom.b_layout}\n  C {atom.c_layout}")
  if args.atoms:
    tiled = make_tiled_mma(atom, args.atoms)
    m, n, k = tiled.tile_shape_mnk
    tv = {"a": tiled.get_layoutA_TV, "b": tiled.get_layoutB_TV, "c": tiled.get_layoutC_TV}[
        args.operand
    ]()
    tile, thr_id = {"a": (m, k), "b": (n, k), "c": (m, n)}[args.operand], None
    what = f"{atom.name} x {'x'.join(map(str, args.atoms))} {args.operand.upper()}"
  else:
    (tv, tile), thr_id = atom.operand(args.operand), atom.thr_id
    what = f"{atom.name} {args.operand.upper()}"
  print(f"{what} ({'x'.join(map(str, tile))} tile, thread -> lane {thr_id or 'identity'}):")
  print_tv_layout(tv, tile, thr_id)
  if args.out:
    render_tv_layout(tv, tile, args.out, thr_id=thr_id, title=f"{what}: {tv}")
    print(f"wrote {args.out}")


def _show_layout(args) -> None:
  layout = parse_layout(args.target)
  print_layout(layout)
  if args.out:
    render_layout(layout, args.out)
    print(f"wrote {args.out}")


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.command == "list":
      print("\n".join(mma_atoms(args.contains)))
    elif args.target in mma_atoms():
      _show_atom(args)
    elif args.target[:1].isalpha() and not args.target.startswith("Sw<"):
      mma_atom(args.target)  # not an atom: raises, naming close ones
    elif args.atoms or args.operand != "c":
      raise ValueError("--atoms and --operand apply to MMA atoms, not to layouts")
    else:
      _show_layout(args)
  except (KeyError, ValueError, RuntimeError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
