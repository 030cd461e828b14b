"""Kernels compiled in the background while the program that uses them is still traced.

XLA compiles a program's Mosaic GPU kernels when it instantiates their custom calls,
one after another (LLVM and ptxas, ~0.2-0.3 s a GEMM kernel on the H100's host), after
its own passes: 3-5 s of a decoder's cold compile (NOTES exp. 55). Mosaic GPU keeps
compiled kernels per process, by the hash of their module, so a program of one kernel
compiled earlier leaves that kernel compiled for every later program that holds it.
`kernel_cache` hands this module each kernel as soon as its lowering is known (a
lowering worker's answer arrives while the model is still traced); one background
thread compiles a program of that one kernel, and by the time XLA reaches the
kernel in the model's program it is a cache hit. Mosaic's compiles hold one lock
per process, so one thread is all that can run.

Measured (NOTES exp. 81, H100, fresh processes, no cache): the decoders' cold compile
went from 1.36-1.82x XLA's to 0.78-1.59x (two runs). The one-kernel programs are compiled
like any other: where jax's persistent cache would keep them (its minimum compile time set
to 0, as `benchmarks.model` does) they add one small entry per kernel.

`PALLAS_GEMM_COMPILE_AHEAD=0` turns it off; it runs only where the default backend is a
GPU. A job that fails is dropped (the program's own compile then compiles the kernel).

>>> import os
>>> os.environ[ENV] = "0"; enabled()
False
>>> del os.environ[ENV]
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Callable

import jax

ENV = "PALLAS_GEMM_COMPILE_AHEAD"

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_submitted: set[str] = set()


def enabled() -> bool:
  """On unless `PALLAS_GEMM_COMPILE_AHEAD=0`, and only where jax's default backend is a GPU."""
  return os.environ.get(ENV, "1") != "0" and jax.default_backend() == "gpu"


def submit(key: str, compile_program: Callable[[], object]) -> concurrent.futures.Future | None:
  """Runs `compile_program()` on the background thread, once per `key` in this process;
  None when it is off or `key` was submitted before."""
  global _executor
  with _lock:
    if key in _submitted or not enabled():
      return None
    _submitted.add(key)
    if _executor is None:
      _executor = concurrent.futures.ThreadPoolExecutor(
          max_workers=1, thread_name_prefix="pallas-gemm-compile-ahead"
      )
    return _executor.submit(_quietly, compile_program)


def _quietly(compile_program: Callable[[], object]) -> bool:
  """True when the program compiled; False when it failed (only an optimization)."""
  try:
    compile_program()
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def forget() -> None:
  """Forgets which kernels were submitted (with `kernel_cache.forget`, for tests)."""
  with _lock:
    _submitted.clear()
