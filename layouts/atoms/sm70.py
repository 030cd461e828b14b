"""Volta's quadpair MMA, ``mma.sync.aligned.m8n8k4`` (``cute_mma_atoms.md``, "Volta").

Eight threads of a warp, a *quadpair*, compute an ``8x8x4`` product: logical
threads 0-3 are lanes 0-3 and logical threads 4-7 are lanes 16-19. The name's
last two letters are BLAS transposes: A is ``T`` (row-major, K-major) or ``N``
(column-major, M-major); B is ``N`` (K-major) or ``T`` (N-major).

>>> [a.name for a in sm70_atoms()][:2]
['SM70_8x8x4_F16F16F16F16_TN', 'SM70_8x8x4_F16F16F16F16_NT']
"""

from __future__ import annotations

from ..layout import Layout, size
from .mma_atom import MMAAtom, MMAOperation, MMATraits, registers_for

__all__ = ["sm70_atoms", "QUADPAIR"]

QUADPAIR = Layout((4, 2), (1, 16))
"""Logical thread ``[0, 8)`` -> lane ``[0, 4) U [16, 20)``."""

_K_MAJOR = Layout((8, 4), (1, 8))
"""(T8,V4) -> (m,k): thread ``t`` holds row ``t``, its 4 values along K."""

_MN_MAJOR = Layout(((4, 2), 4), ((8, 4), 1))
"""(T8,V4) -> (m,k): thread ``t`` holds column ``t % 4`` of rows ``4*(t//4) + v``."""

_ACCUMULATORS = {
    # (T8,V8) -> (m,n): thread t holds row t.
    "f16": Layout((8, 8), (1, 8)),
    # (T8,V8) -> (m,n): thread t holds rows r, r+2 (r = t%2 + 4*(t//4)) by
    # columns c, c+1, c+4, c+5 (c = 2*((t//2)%2)).
    "f32": Layout(((2, 2, 2), (2, 2, 2)), ((1, 16, 4), (8, 2, 32))),
}

_A_MAJOR = {"T": "K", "N": "MN"}  # BLAS letter of A -> majorness
_B_MAJOR = {"N": "K", "T": "MN"}  # BLAS letter of B -> majorness
_A_PTX = {"K": "row", "MN": "col"}  # majorness of A -> PTX .alayout
_B_PTX = {"K": "col", "MN": "row"}  # majorness of B -> PTX .blayout


def _atom(acc: str, transposes: str) -> MMAAtom:
  a_major, b_major = _A_MAJOR[transposes[0]], _B_MAJOR[transposes[1]]
  tv = {"K": _K_MAJOR, "MN": _MN_MAJOR}
  c_layout = _ACCUMULATORS[acc]
  name = f"SM70_8x8x4_{acc.upper()}F16F16{acc.upper()}_{transposes}"
  ptx = f"mma.sync.aligned.m8n8k4.{_A_PTX[a_major]}.{_B_PTX[b_major]}.{acc}.f16.f16.{acc}"
  c_registers = registers_for(acc, size(c_layout[1]))
  operation = MMAOperation(
      name=name,
      ptx=ptx,
      d_registers=c_registers,
      a_registers=registers_for("f16", 4),
      b_registers=registers_for("f16", 4),
      c_registers=c_registers,
      a_major=(a_major,),
      b_major=(b_major,),
  )
  traits = MMATraits(
      d_type=acc,
      a_type="f16",
      b_type="f16",
      c_type=acc,
      shape_mnk=(8, 8, 4),
      thr_id=QUADPAIR,
      a_layout=tv[a_major],
      b_layout=tv[b_major],
      c_layout=c_layout,
  )
  return MMAAtom(operation, traits)


def sm70_atoms():
  """The eight SM70 atoms: F16 and F32 accumulators, each TN, NT, NN, TT."""
  return [_atom(acc, t) for acc in ("f16", "f32") for t in ("TN", "NT", "NN", "TT")]
