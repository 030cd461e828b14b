"""CuTe's MMA atoms: tensor-core instructions with their thread-value layouts.

``mma_atom(name)`` looks one up by CuTe's name; ``mma_atoms()`` lists them:
SM70 quadpair ``mma.sync.m8n8k4``, SM80/SM89 warp ``mma.sync.m16n8kK`` and
every SM90 warpgroup ``wgmma.m64nNkK``.

>>> atom = mma_atom("SM90_64x128x16_F32BF16BF16_SS")
>>> atom.c_layout
((4,8,4),(2,2,16)):((128,1,16),(64,8,512))
>>> atom.operation.ptx
'wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16'
"""

from .fragments import mma_fragment
from .mma_atom import MMAAtom, MMAOperation, MMATraits, Registers
from .registry import UnknownAtomError, mma_atom, mma_atoms

__all__ = [
    "MMAAtom",
    "MMAOperation",
    "MMATraits",
    "Registers",
    "UnknownAtomError",
    "mma_atom",
    "mma_atoms",
    "mma_fragment",
]
