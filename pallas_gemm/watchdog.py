"""A deadline for device work that may never return: past it the process exits, naming
what hung.

A kernel that never finishes (a deadlock on the device) leaves its process waiting
forever: nothing cancels it, and the process cannot use its GPU again. The tuner compiles,
checks and times configs that have not run before, so it bounds each with
`deadline(what)`: past `seconds`, a message naming `what` and every thread's Python stack
go to stderr and the process exits with `EXIT_CODE` (NOTES exp. 142: processes that
compiled stream-K configs on threads hung in a config's first run or the next compile).

>>> with deadline("a step that returns", seconds=5.0):
...   pass
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading

ENV_SECONDS = "PALLAS_GEMM_DEADLINE_S"
DEFAULT_SECONDS = 600.0
"""Far above any compile (~2-10 s) or timing (well under a second) of one config."""

EXIT_CODE = 70
"""EX_SOFTWARE: the process stopped itself."""


def seconds_from_env() -> float:
  """`PALLAS_GEMM_DEADLINE_S` (seconds; 0 turns deadlines off), else `DEFAULT_SECONDS`."""
  text = os.environ.get(ENV_SECONDS, "").strip()
  if not text:
    return DEFAULT_SECONDS
  try:
    seconds = float(text)
  except ValueError:
    seconds = -1.0
  if not seconds >= 0:  # also NaN
    raise ValueError(f"{ENV_SECONDS}={text!r}: must be a number of seconds >= 0 (0: no limit)")
  return seconds


@contextlib.contextmanager
def deadline(what: str, seconds: float | None = None):
  """Runs the body; if it has not finished after `seconds` (default: `seconds_from_env`;
  0: no limit), reports `what` and exits the process with `EXIT_CODE`."""
  seconds = seconds_from_env() if seconds is None else seconds
  if seconds <= 0:
    yield
    return
  timer = threading.Timer(seconds, _expire, (what, seconds))
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    timer.cancel()


def _expire(what: str, seconds: float) -> None:
  sys.stderr.write(
      f"pallas_gemm: {what} has not returned after {seconds:g} s. A kernel that never "
      f"finishes cannot be stopped, so the process exits (code {EXIT_CODE}); "
      f"{ENV_SECONDS} sets the limit, 0 turns it off. Stacks:\n"
  )
  sys.stderr.flush()
  faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
  os._exit(EXIT_CODE)
