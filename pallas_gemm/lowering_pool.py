"""Helper processes that lower kernels while the program around them is traced.

jax lowers a program's Pallas kernels one after another when it lowers the
program, in Python (Mosaic GPU's layout inference and MLIR building, ~0.35 s
per GEMM kernel on the H100's host): 5-7 s of a decoder's cold compile for its
15-18 kernels (NOTES exp. 49). What a kernel lowers to depends only on what is
known when it is traced (its function, static arguments and operand types), so
`kernel_cache` hands each new kernel to this pool as soon as it is traced, and
by the time jax reaches it the lowering is done or under way.

The workers are plain Python processes running CPU-only jax (no GPU memory, no
CUDA context), started on the first job and ended with this process (they exit
when their stdin closes). A job is a picklable `(function, args)`; a job that
fails, a worker that dies and a result that does not come back within
`TIMEOUT_S` all give None, and the caller lowers in-process as before. A job
no worker has started yet can be taken back (`Future.cancel()`): the caller
never waits for a worker that is still starting or busy with other kernels.
The library's Flax layers and `make_dot_general` start the pool when a model is built
(`start`).

How many workers: `PALLAS_GEMM_LOWERING_WORKERS` (0 turns the pool off); by
default half the CPUs this process may run on, shared among jax's processes, at
most 8, where the default backend is a GPU, and none elsewhere. A worker holds
~190 MB of host memory.

>>> pool = Pool(workers=1)
>>> pool.submit(divmod, (7, 2)).result()
(3, 1)
>>> pool.close()
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import pickle
import queue
import subprocess
import sys
import threading
from typing import Any, Callable

import jax

ENV_WORKERS = "PALLAS_GEMM_LOWERING_WORKERS"
TIMEOUT_S = 300.0
"""The longest wait for one job's result before the caller lowers it itself."""

_ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


class Pool:
  """`workers` helper processes, each served by one thread of this process that
  sends it a job and waits for the answer (the GIL is released while waiting)."""

  def __init__(self, workers: int):
    if workers < 1:
      raise ValueError(f"workers={workers}: a pool needs at least one worker")
    self._jobs: queue.SimpleQueue = queue.SimpleQueue()
    self._threads = [
        threading.Thread(target=self._serve, name=f"pallas-gemm-lowering-{i}", daemon=True)
        for i in range(workers)
    ]
    self.served = 0
    """Jobs that came back with a result (the rest were answered None)."""
    for thread in self._threads:
      thread.start()

  def submit(self, fn: Callable, args: tuple) -> concurrent.futures.Future:
    """`fn(*args)` in a worker; the future's result is its value, or None if it failed."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
      job = pickle.dumps((fn, args))
    except Exception:  # pylint: disable=broad-except
      future.set_result(None)  # not picklable: the caller does it itself
      return future
    self._jobs.put((job, future))
    return future

  def close(self) -> None:
    """Ends the workers (they finish the job they are on)."""
    for _ in self._threads:
      self._jobs.put(None)

  def _serve(self) -> None:
    worker = None
    while True:
      if worker is None or worker.poll() is not None:
        # Started before a job is taken: no job waits on a worker's start-up, and
        # the first start overlaps the trace of the rest of the program.
        worker = _start_worker()
        if worker is None:
          return  # queued jobs are cancelled by their callers, who do them
      item = self._jobs.get()
      if item is None:
        worker.stdin.close()
        return
      job, future = item
      if not future.set_running_or_notify_cancel():
        continue  # the caller took it back (`Future.cancel`) and does it itself
      result = None
      try:
        worker.stdin.write(len(job).to_bytes(8, "little") + job)
        worker.stdin.flush()
        ok, result = pickle.loads(_read_message(worker.stdout))
        if ok:
          self.served += 1
        else:
          result = None
      except Exception:  # pylint: disable=broad-except  (a dead or garbled worker)
        worker.kill()
        worker, result = None, None
      future.set_result(result)


def _start_worker() -> subprocess.Popen | None:
  """A worker that has done its imports (so no job waits on its start-up), or None."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the parent owns the caches
  env[ENV_WORKERS] = "0"  # no pools of pools
  try:
    worker = subprocess.Popen(
        [sys.executable, "-c", "from pallas_gemm import lowering_pool; lowering_pool.serve()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
  except OSError:
    return None
  try:
    _read_message(worker.stdout)  # the empty "ready" message
  except EOFError:
    worker.kill()
    return None
  return worker


def _read_message(stream) -> bytes:
  header = stream.read(8)
  if len(header) != 8:
    raise EOFError("the worker closed its output")
  size = int.from_bytes(header, "little")
  body = stream.read(size)
  if len(body) != size:
    raise EOFError("the worker's answer was cut short")
  return body


def serve() -> None:
  """A worker's loop: length-prefixed pickled `(fn, args)` in on stdin, `(ok, value)`
  out on the original stdout (anything the jobs print goes to stderr)."""
  out = os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  source = sys.stdin.buffer
  out.write((0).to_bytes(8, "little"))  # ready (imports done)
  out.flush()
  while True:
    try:
      message = _read_message(source)
    except EOFError:
      return
    try:
      fn, args = pickle.loads(message)
      answer = pickle.dumps((True, fn(*args)))
    except Exception as e:  # pylint: disable=broad-except
      answer = pickle.dumps((False, f"{type(e).__name__}: {e}"))
    out.write(len(answer).to_bytes(8, "little") + answer)
    out.flush()


def default_workers() -> int:
  """The pool size: the environment's setting, else half the usable CPUs over jax's
  process count (at most 8) where the default backend is a GPU, else 0."""
  text = os.environ.get(ENV_WORKERS, "").strip()
  if text:
    try:
      workers = int(text)
    except ValueError:
      raise ValueError(f"{ENV_WORKERS}={text!r}: expected a whole number of workers") from None
    if workers < 0:
      raise ValueError(f"{ENV_WORKERS}={workers}: expected 0 (off) or more workers")
    return workers
  if jax.default_backend() != "gpu":
    return 0
  return max(1, min(8, _usable_cpus() // 2 // jax.process_count()))


def _usable_cpus() -> int:
  """The CPUs this process may run on (a batch system's binding), else all of them."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 2


_lock = threading.Lock()
_pool: Pool | None = None
_pool_size: int | None = None


def shared_pool() -> Pool | None:
  """This process's pool (started on first use), or None where it is off."""
  global _pool, _pool_size
  with _lock:
    if _pool_size is None:
      _pool_size = default_workers()
      if _pool_size:
        _pool = Pool(_pool_size)
    return _pool


def reset(workers: int | None = None) -> None:
  """Ends the shared pool; the next `shared_pool()` starts one of `workers` workers
  (None: `default_workers()`). For tests and benchmarks."""
  global _pool, _pool_size
  with _lock:
    if _pool is not None:
      _pool.close()
    _pool, _pool_size = None, workers
    if workers:
      _pool = Pool(workers)


def start(implementation: str | None = None) -> bool:
  """Starts the shared pool now, for a layer built with `implementation` (None, "auto" or
  "pallas": one that may run kernels), so that its workers have imported jax by the time
  the model's first program is traced; whether a pool runs. A pool started at the first
  kernel's trace instead is still importing when jax lowers the first kernels, which
  the caller then lowers itself (NOTES exps. 134-135). Called by the Flax layers'
  constructors and `make_dot_general` (a model's build needs the devices anyway), never
  at import: the backend must not start before the user configures it
  (`jax.distributed.initialize`).

  >>> start("xla")
  False
  """
  if implementation not in (None, "auto", "pallas"):
    return False
  return shared_pool() is not None


def run(fn: Callable[..., Any], args: tuple) -> concurrent.futures.Future | None:
  """`fn(*args)` submitted to the shared pool, or None where there is no pool."""
  pool = shared_pool()
  return None if pool is None else pool.submit(fn, args)
