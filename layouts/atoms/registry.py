"""Looking atoms up by their CuTe name.

>>> mma_atom("SM80_16x8x8_F32TF32TF32F32_TN").shape_mnk
(16, 8, 8)
>>> len(mma_atoms("SM70_"))
8
>>> mma_atom("SM80_16x8x16_F32F16F16F32_NT")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
layouts.atoms.registry.UnknownAtomError: no MMA atom named 'SM80_16x8x16_F32F16F16F32_NT'; close names: SM80_16x8x16_F32F16F16F32_TN, ...
"""

from __future__ import annotations

import difflib
from functools import lru_cache

from .mma_atom import MMAAtom
from .sm70 import sm70_atoms
from .sm80 import sm80_atoms
from .sm90 import sm90_atoms

__all__ = ["mma_atom", "mma_atoms", "UnknownAtomError"]


class UnknownAtomError(KeyError, ValueError):
  """An atom name that is not in the registry (both a KeyError and a ValueError)."""

  def __str__(self) -> str:
    return str(self.args[0])


@lru_cache(maxsize=None)
def _registry() -> dict[str, MMAAtom]:
  return {atom.name: atom for atom in (*sm70_atoms(), *sm80_atoms(), *sm90_atoms())}


def mma_atoms(contains: str = "") -> tuple[str, ...]:
  """Names of the known atoms (those containing ``contains``), SM70 first."""
  return tuple(name for name in _registry() if contains in name)


def mma_atom(name: str) -> MMAAtom:
  """The atom called ``name`` (CuTe's spelling, e.g. ``SM90_64x128x16_F32BF16BF16_SS``).

  Unknown names raise :class:`UnknownAtomError` listing the closest known ones.
  """
  atoms = _registry()
  if name in atoms:
    return atoms[name]
  same_but_case = [known for known in atoms if known.lower() == name.lower()]
  close = dict.fromkeys(
      same_but_case + difflib.get_close_matches(name, list(atoms), n=5, cutoff=0.6)
  )
  hint = (
      f"; close names: {', '.join(close)}"
      if close
      else f"; see layouts.mma_atoms() for the {len(atoms)} known"
  )
  raise UnknownAtomError(f"no MMA atom named {name!r}{hint}")
