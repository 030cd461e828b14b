"""The persistent autotuning cache: which GemmConfig won for which problem.

One JSON file holds the winners for every device kind and jax version; an
entry is keyed by both plus the problem (shape, dtypes, layout, epilogue).
The file lives where the platform keeps caches (`cache_path`), or wherever
the environment variable `PALLAS_GEMM_CACHE` points. A cache that cannot be
used (bad JSON, another schema, configs that no longer validate) is ignored
with a `TuningCacheWarning`, never an error. The package ships a table of
its own (`PACKAGED_PATH`: the LLM projection shapes tuned on an H100), read
after the user's cache; other Hopper boards (H200, H800, GH200) use the
H100's entries where none names them. Writers lock the file, merge
with what is on disk and replace it atomically, so concurrent tuners never
tear it or lose each other's entries.

>>> import os, tempfile
>>> from pallas_gemm.config import GemmConfig, GemmProblem
>>> cache = TuningCache(os.path.join(tempfile.mkdtemp(), "tuning.json"))
>>> key = TuningKey("NVIDIA H100 80GB HBM3", "0.11.2", GemmProblem(m=4096, n=4096, k=4096))
>>> cache.store(key, GemmConfig(stages=3), time_ms=0.2)
>>> cache.lookup(key).stages
3
>>> key.token()
'NVIDIA H100 80GB HBM3|jax 0.11.2|4096x4096x4096 bfloat16->bfloat16 NN|none'
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import threading
import warnings

import jax

from pallas_gemm import _compat
from pallas_gemm.config import GemmConfig, GemmProblem
from pallas_gemm.epilogue import ACTIVATIONS
from pallas_gemm.ragged_gemm import RaggedConfig, RaggedProblem

KERNELS = {"gemm": (GemmProblem, GemmConfig), "ragged": (RaggedProblem, RaggedConfig)}
"""Kernel name -> (problem class, config class) of what the cache holds: the dense GEMM
and the grouped GEMM (`ragged_dot`)."""

SCHEMA_VERSION = 1
"""Bumped whenever the file layout changes; files of another version are ignored."""

CACHE_ENV = "PALLAS_GEMM_CACHE"
"""Environment variable naming the cache file (overrides the platform location)."""

FILE_NAME = "tuning.json"


class TuningCacheWarning(UserWarning):
  """A cache file (or some of its entries) was unusable and is being ignored."""


# -- keys ---------------------------------------------------------------------
def epilogue_name(has_bias: bool, has_c: bool, activation: str | None) -> str:
  """Canonical epilogue spelling: "none" or "+"-joined parts, e.g. "bias+c+relu".

  >>> epilogue_name(True, False, "gelu_tanh")
  'bias+gelu_tanh'
  """
  parts = ["bias"] * has_bias + ["c"] * has_c + [activation] * (activation is not None)
  return "+".join(parts) or "none"


def parse_epilogue(name: str | None) -> tuple[bool, bool, str | None]:
  """Inverse of `epilogue_name` (any part order; None means "none").

  Returns (has_bias, has_c, activation).

  >>> parse_epilogue("relu+bias")
  (True, False, 'relu')
  """
  parts = [] if name in (None, "none") else name.split("+")
  activations = [p for p in parts if p not in ("bias", "c")]
  bad = [p for p in activations if p not in ACTIVATIONS]
  if bad or len(activations) > 1 or len(set(parts)) != len(parts):
    raise ValueError(
        f"epilogue {name!r}: expected 'none' or '+'-joined parts from "
        f"bias, c and at most one of {sorted(ACTIVATIONS)}"
    )
  return "bias" in parts, "c" in parts, (activations or [None])[0]


def layout_name(problem: GemmProblem) -> str:
  """BLAS-style operand layout: "N" or "T" for A, then B ("TN": A stored (K, M))."""
  return "NT"[problem.transpose_a] + "NT"[problem.transpose_b]


@dataclasses.dataclass(frozen=True)
class TuningKey:
  """What a tuned config is valid for: device kind, jax version, problem, activation, and
  the kernel ("gemm", or "ragged" with a `RaggedProblem`)."""

  device_kind: str
  jax_version: str
  problem: GemmProblem | RaggedProblem
  activation: str | None = None
  kernel: str = "gemm"

  @classmethod
  def current(cls, problem, activation: str | None = None, kernel: str = "gemm") -> TuningKey:
    """The key of `problem` on this process's default device and jax."""
    return cls(jax.devices()[0].device_kind, jax.__version__, problem, activation, kernel)

  def token(self) -> str:
    """The key as one readable string (the cache file's index).

    >>> from pallas_gemm.ragged_gemm import RaggedProblem
    >>> TuningKey("H100", "0.11.2", RaggedProblem(m=4096, n=2048, k=7168, groups=8), kernel="ragged").token()
    'H100|jax 0.11.2|ragged 8x4096x2048x7168 bfloat16->bfloat16 N'
    """
    p = self.problem
    if self.kernel == "ragged":
      scaled = " blockwise" if p.block_scaled else ""
      return (
          f"{self.device_kind}|jax {self.jax_version}|ragged {p.groups}x{p.m}x{p.n}x{p.k} "
          f"{p.dtype}->{p.out_dtype} {'NT'[p.transpose_rhs]}{scaled}"
      )
    shape = f"{p.m}x{p.n}x{p.k}" if p.batch == 1 else f"{p.batch}x{p.m}x{p.n}x{p.k}"
    return (
        f"{self.device_kind}|jax {self.jax_version}|{shape} {p.dtype}->{p.out_dtype} "
        f"{layout_name(p)}|{epilogue_name(p.has_bias, p.has_c, self.activation)}"
    )

  def to_json(self) -> dict:
    data = {
        "device_kind": self.device_kind,
        "jax_version": self.jax_version,
        "problem": dataclasses.asdict(self.problem),
        "activation": self.activation,
    }
    if self.kernel != "gemm":  # GEMM entries keep the format of older files
      data["kernel"] = self.kernel
    return data

  @classmethod
  def from_json(cls, data: dict) -> TuningKey:
    kernel = data.get("kernel", "gemm")
    if kernel not in KERNELS:
      raise ValueError(f"unknown kernel {kernel!r} (known: {sorted(KERNELS)})")
    problem = KERNELS[kernel][0](**data["problem"])
    return cls(data["device_kind"], data["jax_version"], problem, data["activation"], kernel)


@dataclasses.dataclass(frozen=True)
class TuningRecord:
  """A cache entry: the winning config and its median time."""

  key: TuningKey
  config: GemmConfig | RaggedConfig
  time_ms: float

  def to_json(self) -> dict:
    return {
        "key": self.key.to_json(),
        "config": dataclasses.asdict(self.config),
        "time_ms": self.time_ms,
    }

  @classmethod
  def from_json(cls, data: dict) -> TuningRecord:
    """Parses and re-validates an entry; raises if it is malformed or no longer valid."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()}
    key = TuningKey.from_json(data["key"])
    record = cls(key, KERNELS[key.kernel][1](**fields), float(data["time_ms"]))
    record.config.validate(record.key.problem)
    return record


# -- location -----------------------------------------------------------------
def cache_path(environ=None, platform: str | None = None) -> str:
  """Where the cache file lives: $PALLAS_GEMM_CACHE, else the platform's cache dir.

  Linux and others: $XDG_CACHE_HOME (or ~/.cache)/pallas_gemm/tuning.json;
  macOS: ~/Library/Caches/pallas_gemm/tuning.json;
  Windows: %LOCALAPPDATA%/pallas_gemm/Cache/tuning.json.

  >>> cache_path({"XDG_CACHE_HOME": "/xdg"}, "linux")
  '/xdg/pallas_gemm/tuning.json'
  >>> cache_path({"PALLAS_GEMM_CACHE": "/tmp/t.json"}, "linux")
  '/tmp/t.json'
  """
  environ = os.environ if environ is None else environ
  platform = sys.platform if platform is None else platform
  if environ.get(CACHE_ENV):
    return environ[CACHE_ENV]
  home = os.path.expanduser("~")
  if platform == "darwin":
    return os.path.join(home, "Library", "Caches", "pallas_gemm", FILE_NAME)
  if platform == "win32":
    local = environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
    return os.path.join(local, "pallas_gemm", "Cache", FILE_NAME)
  base = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
  return os.path.join(base, "pallas_gemm", FILE_NAME)


# -- file access --------------------------------------------------------------
@contextlib.contextmanager
def _exclusive_lock(lock_path: str):
  """Holds an exclusive OS lock on `lock_path` (created if needed) for the block."""
  with open(lock_path, "a+b") as f:
    if os.name == "nt":
      import msvcrt

      msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
      try:
        yield
      finally:
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
    else:
      import fcntl

      fcntl.flock(f, fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(f, fcntl.LOCK_UN)


def _read_records(path: str) -> dict[str, TuningRecord]:
  """The usable entries of the file at `path`, by token; warns about the rest."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError, RecursionError) as e:  # RecursionError: absurdly deep JSON
    warnings.warn(
        f"ignoring the tuning cache {path}: unreadable ({type(e).__name__}: {e})",
        TuningCacheWarning,
        stacklevel=3,
    )
    return {}
  if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
    found = data.get("schema") if isinstance(data, dict) else type(data).__name__
    warnings.warn(
        f"ignoring the tuning cache {path}: schema {found!r}, expected {SCHEMA_VERSION}",
        TuningCacheWarning,
        stacklevel=3,
    )
    return {}
  entries = data.get("entries")
  if not isinstance(entries, dict):
    warnings.warn(
        f"ignoring the tuning cache {path}: 'entries' is not an object",
        TuningCacheWarning,
        stacklevel=3,
    )
    return {}
  records, stale = {}, []
  for token, entry in entries.items():
    try:
      record = TuningRecord.from_json(entry)
    except Exception as e:  # noqa: BLE001 -- any malformed entry is stale, never fatal
      stale.append(f"{token}: {type(e).__name__}: {e}")
      continue
    records[record.key.token()] = record
  if stale:
    warnings.warn(
        f"ignoring {len(stale)} stale entries of the tuning cache {path} " f"(first: {stale[0]})",
        TuningCacheWarning,
        stacklevel=3,
    )
  return records


def _write_atomically(path: str, records: dict[str, TuningRecord]) -> None:
  """Writes `records` to a temp file beside `path`, then renames it over `path`."""
  data = {
      "schema": SCHEMA_VERSION,
      "entries": {token: records[token].to_json() for token in sorted(records)},
  }
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tuning.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(data, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


# -- the cache ----------------------------------------------------------------
class TuningCache:
  """One cache file, read lazily and re-read whenever it changes on disk."""

  def __init__(self, path: str):
    self.path = path
    self._records: dict[str, TuningRecord] = {}
    self._stamp = None
    self._mutex = threading.Lock()

  def _file_stamp(self):
    try:
      st = os.stat(self.path)
    except OSError:
      return None
    return st.st_mtime_ns, st.st_size, st.st_ino

  def records(self) -> dict[str, TuningRecord]:
    """All usable entries by token (cheap: one stat when the file is unchanged)."""
    stamp = self._file_stamp()
    with self._mutex:
      if stamp != self._stamp:
        self._records, self._stamp = _read_records(self.path), stamp
      return self._records

  def record(self, key: TuningKey) -> TuningRecord | None:
    return self.records().get(key.token())

  def lookup(self, key: TuningKey) -> GemmConfig | RaggedConfig | None:
    """The tuned config for `key`, or None if it was never tuned."""
    record = self.record(key)
    return record.config if record else None

  def store(self, key: TuningKey, config: GemmConfig | RaggedConfig, time_ms: float) -> None:
    """Adds (or replaces) the entry for `key`, merged with the file under a lock.

    An unwritable location is reported with a warning, not an error: tuning
    results are an optimisation.
    """
    record = TuningRecord(key, config, float(time_ms))
    try:
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
      with _exclusive_lock(self.path + ".lock"):
        records = _read_records(self.path)
        records[key.token()] = record
        _write_atomically(self.path, records)
        stamp = self._file_stamp()
      with self._mutex:
        self._records, self._stamp = records, stamp
    except OSError as e:
      warnings.warn(
          f"could not write the tuning cache {self.path}: {e}", TuningCacheWarning, stacklevel=2
      )


_caches: dict[str, TuningCache] = {}


def _cache_at(path: str) -> TuningCache:
  """The one `TuningCache` object of `path` (so each file is parsed once per change)."""
  if path not in _caches:
    _caches[path] = TuningCache(path)
  return _caches[path]


def default_cache() -> TuningCache:
  """The cache at `cache_path()` (one object per path, so it is read once)."""
  return _cache_at(cache_path())


PACKAGED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned_configs.json")
"""Winners shipped with the package (same format), tuned on the devices they name."""

PACKAGED_M_REACH = 4
"""A shipped entry tuned at M serves problems with M' <= M <= max(16, PACKAGED_M_REACH * M')."""


def same_family(kind: str, other: str) -> bool:
  """Whether a table tuned on `other` may serve `kind`: both the same, or both Hopper
  boards (sm_90; an H200 is an H100 with faster HBM).

  >>> same_family("NVIDIA H200", "NVIDIA H100 80GB HBM3"), same_family("cpu", "NVIDIA H100 80GB HBM3")
  (True, False)
  """
  hopper = _compat.HOPPER_KINDS
  return kind == other or bool(hopper.search(kind) and hopper.search(other))


def packaged_config(
    problem: GemmProblem,
    activation: str | None = None,
    device_kind: str | None = None,
    path: str = PACKAGED_PATH,
) -> GemmConfig | None:
  """The shipped config for `problem` on `device_kind` (default: this device), or None.

  Shipped entries match every problem field except M, under any jax version
  (their configs are re-validated when read), and the device kind: entries
  that name it, else those of another board of its family (`same_family`).
  Of those tuned at M >= problem.m and within reach (`PACKAGED_M_REACH`), the
  smallest M wins: a decode GEMM of 3 tokens runs the config tuned for 16.

  >>> from pallas_gemm.config import GemmProblem
  >>> packaged_config(GemmProblem(m=3, n=4096, k=4096), device_kind="NVIDIA H100 80GB HBM3").split_k
  4
  >>> packaged_config(GemmProblem(m=3, n=4096, k=4096), device_kind="NVIDIA H200").split_k
  4
  >>> packaged_config(GemmProblem(m=3, n=4096, k=4096), device_kind="cpu") is None
  True
  """
  device_kind = device_kind or jax.devices()[0].device_kind
  best = {True: None, False: None}  # by whether the entry names this device kind
  for record in _cache_at(path).records().values():
    key = record.key
    tuned_m = key.problem.m
    if (
        not same_family(device_kind, key.device_kind)
        or key.activation != activation
        or dataclasses.replace(key.problem, m=problem.m) != problem
        or not problem.m <= tuned_m <= max(16, PACKAGED_M_REACH * problem.m)
    ):
      continue
    exact = key.device_kind == device_kind
    if best[exact] is None or tuned_m < best[exact].key.problem.m:
      best[exact] = record
  chosen = best[True] or best[False]
  if chosen is None:
    return None
  try:
    chosen.config.validate(problem)
  except ValueError:
    return None
  return chosen.config


def lookup_config(problem: GemmProblem, activation: str | None = None) -> GemmConfig | None:
  """The tuned config for `problem` on this device and jax, or None (never tunes).

  The user's cache (`default_cache`) first, then the shipped table
  (`packaged_config`). `activation` is the fused activation's name (part of
  the key, like bias and c).
  """
  key = TuningKey.current(problem, activation)
  return default_cache().lookup(key) or packaged_config(problem, activation, key.device_kind)


def lookup_ragged_config(problem: RaggedProblem) -> RaggedConfig | None:
  """The tuned grouped-GEMM config of `problem` on this device (`ragged_tuning`), or None.

  >>> lookup_ragged_config(RaggedProblem(m=64, n=64, k=64, groups=2)) is None  # never tuned
  True
  """
  return default_cache().lookup(TuningKey.current(problem, kernel="ragged"))
