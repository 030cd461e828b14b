"""Tune GEMM shapes ahead of time and write the tuning cache.

    python -m pallas_gemm.tune --shapes my_shapes.json    # a shapes file (see pallas_gemm.shapes)
    python -m pallas_gemm.tune --sweep llm                # a named sweep of pallas_gemm/shapes
    python -m pallas_gemm.tune --sweep odd --dry-run      # list the candidates; no GPU needed
    python -m pallas_gemm.tune --ragged 8x16384x4096x7168 # grouped GEMMs: GxMxNxK (ragged_dot)

Tuning needs a Hopper GPU: without one it says so and exits with status 2.
The cache goes to --cache, else $PALLAS_GEMM_CACHE, else the platform's cache
directory (see `pallas_gemm.tuning_cache.cache_path`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys

from absl import app
from absl import flags
import jax

from pallas_gemm import tuning_cache
from pallas_gemm.cli import parse_flags
from pallas_gemm.tuner import L2_MODES, CuptiTimer, SearchSpace, candidate_configs, tune_problem

_SHAPES = flags.DEFINE_string("shapes", None, "shapes file: JSON sweep or text lines 'M N K'")
_SWEEP = flags.DEFINE_string(
    "sweep", None, "named sweep of pallas_gemm/shapes (llm, training, ...)"
)
_RAGGED = flags.DEFINE_list(
    "ragged",
    None,
    "grouped GEMMs to tune instead: GxMxNxK[:T] (groups, rows, N, K; T: rhs (G, N, K))",
)
_M_VALUES = flags.DEFINE_list("m_values", None, "keep only the shapes whose M is one of these")
_TILE_K = flags.DEFINE_list("tile_k", None, "tile_k values to try (default: all of SearchSpace)")
_LOG = flags.DEFINE_string("log", None, "append every timed config as a JSON line to this file")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "list the candidate configs per shape; time nothing")
_CACHE = flags.DEFINE_string(
    "cache", None, "cache file (default: $PALLAS_GEMM_CACHE or the " "platform's cache directory)"
)
_ITERATIONS = flags.DEFINE_integer("iterations", 20, "timed runs per config (median is kept)")
_L2 = flags.DEFINE_enum(
    "l2",
    "cold",
    list(L2_MODES),
    "cold: a problem under 4 L2s is timed over several operand sets in turn "
    "(operands from HBM, as the benchmark harness does); warm: one set",
)
_DEEPEST_STAGES = flags.DEFINE_integer(
    "deepest_stages",
    SearchSpace.deepest_stages,
    "per tile shape and schedule, how many of the deepest SMEM rings to try (1 halves the search)",
)
_REFINE_TOP = flags.DEFINE_integer(
    "refine_top",
    SearchSpace.refine_top,
    "how many of the fastest configs get their raster order and group tuned",
)

NO_GPU_STATUS = 2


def describe(config) -> str:
  """One line per config, e.g. '128x256x64 s4 cooperative/m cluster 1x1 along_n/8'
  (then ' split_k 4' when K is split); a grouped GEMM's '128x256x64 s4 epilogue 64x32
  along_n/8'."""
  if not hasattr(config, "schedule"):  # a RaggedConfig
    em, en = config.epilogue_tile
    return (
        f"{config.tile_m}x{config.tile_n}x{config.tile_k} s{config.stages} epilogue {em}x{en} "
        f"{config.raster}/{config.group}"
    )
  schedule = config.schedule + ("/" + config.wg_split if config.schedule == "cooperative" else "")
  split = f" split_k {config.split_k}" if config.split_k > 1 else ""
  return (
      f"{config.tile_m}x{config.tile_n}x{config.tile_k} s{config.stages} {schedule} "
      f"cluster {config.cluster[0]}x{config.cluster[1]} {config.raster}/{config.group}{split}"
  )


def missing_gpu() -> str | None:
  """Why tuning cannot run here (no Hopper GPU), or None if it can."""
  device = jax.devices()[0]
  if device.platform != "gpu":
    return f"no GPU (jax's default device is {device.device_kind!r})"
  capability = str(getattr(device, "compute_capability", "9.0"))
  if not capability.startswith("9."):
    return f"{device.device_kind} is not a Hopper GPU (compute capability {capability})"
  return None


class ProgressBar:
  """A one-line text progress bar: `[#####.....] 52/174 best 0.412 ms`.

  On a terminal it redraws in place; elsewhere (CI logs) it prints a line at
  every tenth of the way.
  """

  def __init__(self, stream, width: int = 30):
    self.stream, self.width = stream, width
    self.best_ms = None
    self.trials = []  # (config, ms or None), in the order they ran
    self._tty = stream.isatty()

  def __call__(self, done: int, total: int, config, ms: float | None) -> None:
    self.trials.append((config, ms))
    if ms is not None and (self.best_ms is None or ms < self.best_ms):
      self.best_ms = ms
    if not self._tty and done * 10 // total == (done - 1) * 10 // total:
      return
    filled = self.width * done // total
    best = "none yet" if self.best_ms is None else f"{self.best_ms:.4f} ms"
    line = f"  [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} best {best}"
    self.stream.write(f"\r{line}" if self._tty else f"{line}\n")
    self.stream.flush()

  def close(self) -> None:
    if self._tty:
      self.stream.write("\n")


def tune_shapes(
    shapes,
    *,
    dry_run: bool,
    cache: tuning_cache.TuningCache,
    space: SearchSpace = SearchSpace(),
    out=None,
    err=None,
    timer_factory=CuptiTimer,
    iterations: int = 20,
    log: str | None = None,
) -> int:
  """Tunes (or, with `dry_run`, lists the candidates of) each `pallas_gemm.shapes.Shape`.

  Returns the exit status: 0; 1 if some shape had no config that ran; or
  `NO_GPU_STATUS` when tuning needs a GPU that is not there. `timer_factory(problem, activation, iterations=...)` makes the
  timer of one shape. `out` and `err` default to stdout and stderr. `log`: a
  file that gets one JSON line per timed config (shape, config, ms or null).
  """
  out, err = out or sys.stdout, err or sys.stderr
  reason = None if dry_run else missing_gpu()
  if reason:
    err.write(
        f"pallas_gemm.tune: cannot tune: {reason}. Tuning times kernels on a Hopper GPU; "
        "--dry-run lists the candidate configs without one.\n"
    )
    return NO_GPU_STATUS
  failed = 0
  for i, shape in enumerate(shapes, 1):
    problem, activation = shape.problem()
    candidates = candidate_configs(problem, space)
    name = f" ({shape.name})" if shape.name else ""
    out.write(
        f"[{i}/{len(shapes)}] {shape.label}{name}: {len(candidates)} candidates "
        f"(then raster variants of the fastest {space.refine_top}, and the fastest "
        f"{space.confirm_top} again in {space.confirm_rounds} interleaved rounds)\n"
    )
    if dry_run:
      out.writelines(f"    {describe(config)}\n" for config in candidates)
      continue
    bar = ProgressBar(out)
    timer = timer_factory(problem, activation, iterations=iterations)
    try:
      best = tune_problem(problem, activation, timer=timer, space=space, cache=cache, progress=bar)
    except RuntimeError as e:  # every config failed: report it, tune the other shapes
      bar.close()
      out.write(f"  failed: {e} ({type(e.__cause__).__name__}: {e.__cause__})\n")
      failed += 1
      continue
    finally:
      if log:
        with open(log, "a", encoding="utf-8") as f:
          f.writelines(
              json.dumps({"shape": shape.label, "config": dataclasses.asdict(config), "ms": ms})
              + "\n"
              for config, ms in bar.trials
          )
    bar.close()
    ms = cache.record(tuning_cache.TuningKey.current(problem, activation)).time_ms
    out.write(f"  best {describe(best)}: {ms:.4f} ms, {problem.flops / ms / 1e9:.1f} TFLOP/s\n")
  if not dry_run:
    out.write(f"wrote {cache.path} ({len(shapes) - failed} of {len(shapes)} shapes tuned)\n")
  return 1 if failed else 0


def ragged_problem(spec: str, dtype: str = "bfloat16"):
  """A `RaggedProblem` from "GxMxNxK" (":T" after it: rhs stored (G, N, K)).

  >>> ragged_problem("8x4096x2048x7168:T")
  RaggedProblem(m=4096, n=2048, k=7168, groups=8, dtype='bfloat16', out_dtype='bfloat16', transpose_rhs=True, m_out=None, block_scaled=False)
  """
  from pallas_gemm.ragged_gemm import RaggedProblem

  shape, _, layout = spec.partition(":")
  try:
    groups, m, n, k = (int(v) for v in shape.split("x"))
  except ValueError:
    raise app.UsageError(f"--ragged: {spec!r} is not GxMxNxK[:T]") from None
  if layout not in ("", "T"):
    raise app.UsageError(f"--ragged: {spec!r}: the only layout suffix is ':T'")
  return RaggedProblem(m=m, n=n, k=k, groups=groups, dtype=dtype, out_dtype=dtype,
                       transpose_rhs=layout == "T")  # fmt: skip


def tune_ragged_shapes(
    problems, *, dry_run: bool, cache, out=None, err=None, timer_factory=None
) -> int:
  """`tune_shapes` for grouped GEMMs (`ragged_tuning`): the same statuses."""
  from pallas_gemm import ragged_tuning

  out, err = out or sys.stdout, err or sys.stderr
  reason = None if dry_run else missing_gpu()
  if reason:
    err.write(f"pallas_gemm.tune: cannot tune: {reason}. --dry-run lists the candidates.\n")
    return NO_GPU_STATUS
  failed = 0
  for i, problem in enumerate(problems, 1):
    candidates = ragged_tuning.candidate_configs(problem)
    out.write(f"[{i}/{len(problems)}] ragged {problem}: {len(candidates)} candidates\n")
    if dry_run:
      out.writelines(f"    {describe(config)}\n" for config in candidates)
      continue
    timer = (timer_factory or ragged_tuning.CuptiTimer)(problem)
    try:
      best = ragged_tuning.tune_ragged(problem, timer=timer, cache=cache)
    except RuntimeError as e:
      out.write(f"  failed: {e}\n")
      failed += 1
      continue
    ms = cache.record(tuning_cache.TuningKey.current(problem, kernel="ragged")).time_ms
    out.write(f"  best {describe(best)}: {ms:.4f} ms, {problem.flops / ms / 1e9:.1f} TFLOP/s\n")
  return 1 if failed else 0


def _load_shapes():
  from pallas_gemm import shapes

  if (_SHAPES.value is None) == (_SWEEP.value is None):
    raise app.UsageError("give exactly one of --shapes FILE or --sweep NAME")
  found = shapes.load_sweep(_SWEEP.value) if _SWEEP.value else shapes.load_shapes(_SHAPES.value)
  if _M_VALUES.value:
    kept = {int(m) for m in _M_VALUES.value}
    found = [shape for shape in found if shape.m in kept]
  return found


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cache = tuning_cache.TuningCache(_CACHE.value or tuning_cache.cache_path())
  if _RAGGED.value:
    if _SHAPES.value or _SWEEP.value:
      raise app.UsageError("--ragged tunes grouped GEMMs alone: drop --shapes / --sweep")
    problems = [ragged_problem(spec) for spec in _RAGGED.value]
    return tune_ragged_shapes(problems, dry_run=_DRY_RUN.value, cache=cache)
  space = SearchSpace(deepest_stages=_DEEPEST_STAGES.value, refine_top=_REFINE_TOP.value)
  if _TILE_K.value:
    space = dataclasses.replace(space, tile_k=tuple(int(k) for k in _TILE_K.value))
  return tune_shapes(
      _load_shapes(),
      dry_run=_DRY_RUN.value,
      cache=cache,
      space=space,
      iterations=_ITERATIONS.value,
      log=_LOG.value,
      timer_factory=functools.partial(CuptiTimer, l2=_L2.value),
  )


def run() -> None:
  """The `pallas-gemm-tune` console script."""
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
