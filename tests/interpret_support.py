"""What the GPU-interpret-mode kernel tests share: the version gap and a hang guard.

A failing callback in a warp-specialized kernel hangs jax's GPU interpreter, so
every interpret test runs under `faulthandler` with a deadline (import
`hang_guard` into a test module to apply it to every test there).
"""

import faulthandler

import pytest

from pallas_gemm import _compat

HANG_TIMEOUT_S = 180

needs_transposes = pytest.mark.skipif(
    not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS,
    reason="jax 0.10.2's GPU interpreter cannot run WGMMA on transposed SMEM views",
)


@pytest.fixture(autouse=True)
def hang_guard():
  """Abort loudly instead of hanging; reset the interpreter after a failure."""
  faulthandler.dump_traceback_later(HANG_TIMEOUT_S, exit=True)
  try:
    yield
  except BaseException:
    _compat.reset_interpret_state()
    raise
  finally:
    faulthandler.cancel_dump_traceback_later()
