"""End-to-end model benchmark: `python -m benchmarks.model`.

Trains and runs the decoders of `benchmarks.models` (GPT-style and
Llama-style, Flax nnx, bf16 compute with f32 parameters, AdamW) in three
variants, XLA's `nnx.Linear`, `nnx.Linear(dot_general=pallas_gemm.dot_general)`
and `pallas_gemm.flax.Linear` with fused epilogues, and reports for each:

  compile   first training step's trace + lowering and XLA compile, in a fresh
            process with an empty persistent compilation cache of its own
            ("cold", one subprocess per variant, which also reports the peak
            device memory of its first steps), then in another fresh process
            from that cache ("warm": XLA's executable and our lowered kernels,
            `pallas_gemm.kernel_cache`); the number of distinct Mosaic kernels
            in the lowered step and its GEMM call sites.
  step      median wall time of a training step (forward, backward, AdamW)
            with `--chain` steps dispatched before each block, as a training
            loop runs them, and with a block after every step; variants
            interleaved in rounds; tokens/s.
  loss      the loss curve of the first steps from the same initial parameters
            on the same batches, and its largest difference from XLA's.
  kernels   the kernels of steps traced back to back (jax's profiler), per
            step, grouped: GEMM, attention, elementwise/normalization, other;
            the GPU's idle time between kernels; and the `--sources` costliest
            kernels that are not GEMMs or attention, each with the jax op and
            the Python lines it came from (`benchmarks.fusion_sources`).
  inference prefill (a training batch, forward only) and decode-like forwards
            with 1..64 tokens per call, medians interleaved; with `--quantized`,
            also the trained "xla" model with int4 (group 128) or int8 (per
            channel) weights (`models.quantize`, `QuantizedLinear`) as rows
            "int4" / "int8", interleaved with the rest.

On a machine without a GPU every variant runs XLA's GEMMs (the library's
`implementation=None` picks XLA there), so the run checks the harness, the
models and the loss agreement, not speed: `--size small` is the CPU size.
JSON goes to `--json`, the table is printed last.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

DECODE_ITERS = 40
"""Timed calls per variant and round of a decode-like forward at least: ~1.5 ms each and
bound by the host's dispatch, whose jitter 5 samples did not average out (NOTES exp. 79)."""

GROUPS = ("gemm", "attention", "elementwise", "other")
_GROUP_WORDS = (
    # Checked in order: the first group whose words match a kernel name wins.
    ("elementwise", ("pallas_gemm_dpre",)),
    ("attention", ("fmha", "flash", "sdpa", "attention", "attn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "dot")),
    (
        "elementwise",
        (
            "fusion",
            "loop_",
            "input_",
            "reduce",
            "convert",
            "transpose",
            "broadcast",
            "copy",
            "add",
            "multiply",
            "norm",
            "select",
            "scatter",
            "gather",
            "dynamic",
            "concatenate",
            "slice",
            "pad",
        ),
    ),
)


def kernel_group(name: str) -> str:
  """The breakdown group of a kernel name.

  >>> [kernel_group(n) for n in ("pallas_gemm_gemm", "nvjet_tst_256x128", "loop_add_fusion",
  ...                            "cudnn_generated_fort_native_sdpa_sm90", "memset32")]
  ['gemm', 'gemm', 'elementwise', 'attention', 'other']
  """
  lower = name.lower()
  for group, words in _GROUP_WORDS:
    if any(word in lower for word in words):
      return group
  return "other"


# -- the model and its steps --------------------------------------------------
def build(spec, variant: str, seed: int = 0, implementation: str | None = None):
  """(graphdef, params, rest) of the decoder; same values for every variant."""
  from flax import nnx
  from benchmarks import models

  model = models.Decoder(spec, variant, nnx.Rngs(seed), implementation)
  return nnx.split(model, nnx.Param, ...)


def make_train_step(graphdef, learning_rate: float = 3e-4):
  """A jitted (params, opt_state, rest, tokens, labels) -> (params, opt_state, loss)
  that donates params and optimizer state, and the optimizer."""
  from flax import nnx
  import optax

  tx = optax.adamw(learning_rate, weight_decay=0.1)

  def loss_fn(params, rest, tokens, labels):
    return nnx.merge(graphdef, params, rest).loss(tokens, labels)

  def train_step(params, opt_state, rest, tokens, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, rest, tokens, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(train_step, donate_argnums=(0, 1)), tx


def make_forward(graphdef):
  """A jitted (params, rest, tokens) -> logits."""
  from flax import nnx

  return jax.jit(lambda params, rest, tokens: nnx.merge(graphdef, params, rest)(tokens))


def batches(spec, count: int, seed: int = 1):
  """`count` (tokens, labels) pairs of random token ids (the next-token labels)."""
  key = jax.random.key(seed)
  out = []
  for i in range(count):
    ids = jax.random.randint(
        jax.random.fold_in(key, i), (spec.batch, spec.seq + 1), 0, spec.vocab, jnp.int32
    )
    out.append((ids[:, :-1], ids[:, 1:]))
  return out


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def compile_step(step, *args):
  """(compiled, {"lower_s", "compile_s", "kernels", "gemm_sites"}) of `step` at `args`."""
  from pallas_gemm import compile_once

  t0 = time.perf_counter()
  lowered = step.lower(*args)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  text = lowered.as_text()
  return compiled, dict(
      lower_s=t1 - t0,
      compile_s=t2 - t1,
      kernels=compile_once.module_kernel_count(text),
      gemm_sites=text.count("call @_launch"),
  )


def peak_memory_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


# -- the cold-compile worker (one fresh process per variant) --------------------
def enable_persistent_cache(path: str) -> None:
  """Every executable goes to (and comes from) the persistent cache at `path`."""
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def disable_persistent_cache() -> None:
  """Back to no persistent cache in this process (jax keeps the opened cache otherwise,
  and would go on writing to a directory that is about to be removed)."""
  from jax.experimental.compilation_cache import compilation_cache

  jax.config.update("jax_compilation_cache_dir", None)
  compilation_cache.reset_cache()


def worker(spec, variant: str, cache_dir: str | None, steps: int = 2) -> dict:
  """Compile the training step in this (fresh) process, run `steps`, report."""
  if cache_dir:
    os.makedirs(cache_dir, exist_ok=True)
    enable_persistent_cache(cache_dir)
  t0 = time.perf_counter()
  graphdef, params, rest = build(spec, variant)
  step, tx = make_train_step(graphdef)
  opt_state = tx.init(params)
  build_s = time.perf_counter() - t0
  ((tokens, labels),) = batches(spec, 1)
  compiled, stats = compile_step(step, params, opt_state, rest, tokens, labels)
  report = dict(
      variant=variant,
      build_s=build_s,
      **stats,
      cache_files=len(os.listdir(cache_dir)) if cache_dir else None,
  )
  print(json.dumps(report), flush=True)  # the compile report survives a failed run
  try:
    for _ in range(steps):
      params, opt_state, loss = compiled(params, opt_state, rest, tokens, labels)
    report.update(peak_bytes=peak_memory_bytes(), loss=float(loss))
  except jax.errors.JaxRuntimeError as e:
    report.update(run_error=str(e)[:300])
  return report


def _worker_process(spec, variant, cache_dir, log) -> dict:
  cmd = [
      sys.executable,
      "-m",
      "benchmarks.model",
      "--worker",
      variant,
      "--spec",
      json.dumps(dataclasses.asdict(spec)),
  ]
  if cache_dir:
    cmd += ["--cache-dir", cache_dir]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode or not proc.stdout.strip():
    log(f"  worker for {variant} failed:\n{proc.stderr[-3000:]}")
    return dict(variant=variant, error=proc.stderr[-500:])
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  report["process_s"] = time.perf_counter() - t0
  return report


def fresh_compiles(spec, variants, cache_dir: str | None, log) -> dict:
  """{variant: {"cold": report, "warm": report}}: each variant's training step
  compiled in a fresh process (`worker`), first with an empty persistent cache of its
  own under `cache_dir` (no variant warms another's kernels: they share GEMMs), then
  again, in another fresh process, from that cache."""
  reports = {}
  for variant in variants:
    reports[variant] = {}
    variant_dir = cache_dir and os.path.join(cache_dir, variant)
    for kind in ("cold", "warm") if cache_dir else ("cold",):
      r = reports[variant][kind] = _worker_process(spec, variant, variant_dir, log)
      if "error" in r:
        continue
      log(
          f"  {kind} {variant:9s} lower {r['lower_s']:6.1f} s  compile {r['compile_s']:6.1f} s  "
          f"kernels {r['kernels']:3d} (GEMM sites {r['gemm_sites']})  peak "
          f"{_gib(r.get('peak_bytes'))}  cache files {r['cache_files']}  loss {r.get('loss')}"
          + (f"  run failed: {r['run_error']}" if "run_error" in r else "")
      )
  return reports


# -- timing ---------------------------------------------------------------------
def interleaved(calls: dict, rounds: int, iters: int, chain: int = 1) -> dict:
  """{name: wall-clock ms per call}: every call warmed up, then timed `iters` times, the
  names taking turns in `rounds` rounds. With `chain` > 1 each sample dispatches `chain`
  calls before it blocks (the host runs ahead, as in a training loop) and is divided by
  `chain`; with 1 every call's host-side dispatch is in its time."""
  samples = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      jax.block_until_ready(call())
      for _ in range(iters):
        t0 = time.perf_counter()
        outs = [call() for _ in range(chain)]
        jax.block_until_ready(outs)
        samples[name].append(1e3 * (time.perf_counter() - t0) / chain)
  return samples


def group_kernels(kernels, per: int = 1) -> dict:
  """{group: µs} and the top kernels of `per` steps' [(name, µs)], per step."""
  totals = {g: 0.0 for g in GROUPS}
  by_name: dict[str, float] = {}
  for name, us in kernels:
    totals[kernel_group(name)] += us / per
    by_name[name] = by_name.get(name, 0.0) + us / per
  top = sorted(by_name.items(), key=lambda kv: -kv[1])[:40]
  return dict(
      groups=totals,
      total_us=sum(totals.values()),
      launches=len(kernels) // per,
      top=[(n[:90], round(us, 1)) for n, us in top],
  )


def _gib(x):
  return "-" if x is None else f"{x / 2**30:.2f} GiB"


class Run:
  """Every variant of one model spec in one process, sharing one training state.

  The variants' parameters have one structure and one initial value, so one
  (params, opt_state) flows through whichever variant's step runs: the device
  holds one state, not one per variant (three would not fit beside the
  default model's 38 GB of step temporaries). Each loss curve starts again
  from the initial parameters (kept on the host).
  """

  def __init__(self, spec, variants, loss_steps: int, log):
    self.spec, self.variants, self.log = spec, variants, log
    self.batches = batches(spec, max(loss_steps, 1))
    self.steps, self.forwards, self.rows, self.graphdefs = {}, {}, {}, {}
    initial = None
    for variant in variants:
      graphdef, params, rest = build(spec, variant)
      host = jax.device_get(params)
      if initial is None:
        initial, self.rest, treedef = host, rest, jax.tree.structure(params)
      elif jax.tree.structure(params) != treedef or not all(
          np.array_equal(x, y) for x, y in zip(jax.tree.leaves(host), jax.tree.leaves(initial))
      ):
        raise AssertionError(f"{variant}'s parameters differ from {variants[0]}'s")
      del params
      step, self.tx = make_train_step(graphdef)
      self.steps[variant] = step
      self.forwards[variant] = make_forward(graphdef)
      self.graphdefs[variant] = graphdef
      self.rows[variant] = dict(variant=variant, params=count_params(host))
    self.initial = initial
    self.restart()

  def restart(self):
    """The shared state back at the initial parameters and a fresh optimizer."""
    params = jax.device_put(self.initial)
    self.state = [params, self.tx.init(params)]

  def compile(self):
    tokens, labels = self.batches[0]
    for variant in self.variants:
      compiled, stats = compile_step(self.steps[variant], *self.state, self.rest, tokens, labels)
      self.steps[variant] = compiled
      self.rows[variant]["in_process"] = stats
      memory = compiled.memory_analysis()
      if memory is not None:
        self.rows[variant]["temp_bytes"] = int(memory.temp_size_in_bytes)
      self.log(
          f"  this process {variant:9s} lower {stats['lower_s']:6.1f} s  compile "
          f"{stats['compile_s']:6.1f} s  kernels {stats['kernels']}"
      )

  def _step(self, variant, tokens, labels):
    params, opt_state = self.state
    params, opt_state, loss = self.steps[variant](params, opt_state, self.rest, tokens, labels)
    self.state = [params, opt_state]
    return loss

  def losses(self):
    for variant in self.variants:
      self.restart()
      curve = [self._step(variant, *batch) for batch in self.batches]
      self.rows[variant]["loss_curve"] = [float(x) for x in jax.device_get(curve)]
    ref = np.asarray(self.rows[self.variants[0]]["loss_curve"])
    for variant in self.variants:
      curve = np.asarray(self.rows[variant]["loss_curve"])
      self.rows[variant]["loss_max_diff"] = float(np.max(np.abs(curve - ref)))

  def time_steps(self, rounds: int, iters: int, chain: int):
    """Step time as a training loop sees it (`chain` steps dispatched before one block)
    and with a block after every step (host-side dispatch exposed)."""
    tokens, labels = self.batches[0]
    calls = {v: lambda v=v: self._step(v, tokens, labels) for v in self.variants}
    pipelined = interleaved(calls, rounds, iters, chain)
    blocked = interleaved(calls, rounds, iters)
    for variant in self.variants:
      med = statistics.median(pipelined[variant])
      self.rows[variant].update(
          step_ms=med,
          step_min_ms=min(pipelined[variant]),
          step_chain=chain,
          step_samples=len(pipelined[variant]),
          tokens_per_s=self.spec.tokens / (med * 1e-3),
          step_blocked_ms=statistics.median(blocked[variant]),
      )

  def power(self, seconds: float, rounds: int, chain: int):
    """Steps back to back for `seconds` per variant and round while `nvidia-smi` samples
    the SM clock and board power: at the power limit a step is fast only if it spends
    fewer joules (`benchmarks.power`)."""
    from benchmarks.power import Sampler

    tokens, labels = self.batches[0]
    sampler = Sampler()
    windows = {v: [] for v in self.variants}
    try:
      for _ in range(rounds):
        for variant in self.variants:
          jax.block_until_ready(self._step(variant, tokens, labels))
          steps, t0 = 0, time.perf_counter()
          while time.perf_counter() - t0 < seconds:
            loss = self._step(variant, tokens, labels)
            steps += 1
            if steps % chain == 0:
              jax.block_until_ready(loss)
          jax.block_until_ready(loss)
          t1 = time.perf_counter()
          samples = sampler.window(t0 + 0.25 * (t1 - t0), t1)  # past the ramp
          windows[variant].append(((t1 - t0) / steps, samples))
    finally:
      sampler.close()
    for variant, runs in windows.items():
      ms = statistics.median(1e3 * s for s, _ in runs)
      clock = statistics.median(x[0] for _, samples in runs for x in samples)
      watts = statistics.median(x[1] for _, samples in runs for x in samples)
      self.rows[variant]["power"] = dict(
          step_ms=ms, sm_clock_mhz=clock, watts=watts, joules_per_step=watts * ms / 1e3
      )
      self.log(
          f"  {variant:9s} sustained: {ms:.2f} ms/step at {clock:.0f} MHz, {watts:.0f} W, "
          f"{watts * ms / 1e3:.1f} J/step"
      )

  def breakdown(self, chain: int, sources: int = 0):
    """`chain` steps per variant traced back to back (jax's profiler, CUPTI underneath):
    the kernels of one step grouped by kind, the GPU's idle time between them, and the
    `sources` costliest other kernels traced to their source lines."""
    from benchmarks import fusion_sources, timeline

    tokens, labels = self.batches[0]
    for variant in self.variants:
      jax.block_until_ready(self._step(variant, tokens, labels))
      _, events, host = timeline.capture(
          lambda: [self._step(variant, tokens, labels) for _ in range(chain)]
      )
      if not events:
        raise RuntimeError("the profiler saw no GPU kernels")
      kernels = group_kernels([(e.name, (e.end_ns - e.start_ns) / 1e3) for e in events], per=chain)
      report = timeline.idle_report(events)
      report.update(
          steps=chain,
          host_top=timeline.top_host(host),
          span_ms_per_step=(events[-1].end_ns - events[0].start_ns) / 1e6 / chain,
      )
      self.rows[variant].update(kernels=kernels, timeline=report)
      self.log(
          f"  {variant:9s} {chain} steps traced, per step: span "
          f"{report['span_ms_per_step']:.2f} ms, kernels {kernels['total_us'] / 1e3:.2f} ms, "
          f"GPU idle {report['idle_us'] / 1e3 / chain:.2f} ms; idle before "
          + ", ".join(
              f"{k} {v['us'] / 1e3 / chain:.2f} ms" for k, v in report["gaps_before"].items()
          )
      )
      if sources:
        per_step = collections.Counter()
        for e in events:
          per_step[e.name] += (e.end_ns - e.start_ns) / 1e3 / chain
        labelled = fusion_sources.attribute(
            per_step.items(), self.steps[variant].as_text(), top=sources
        )
        self.rows[variant]["sources"] = [
            dict(kernel=name, us=us, shape=src and src.shape, source=src and src.describe())
            for name, us, src in labelled
        ]
        for name, us, src in labelled:
          where = f"{src.shape[:48]:48s} {src.describe()}" if src else "?"
          self.log(f"      {us:8.1f} us  {name[:32]:32s} {where}")

  def quantized(self, params, bits: int):
    """(forward, params, rest) of the "xla" model with `params` and its weights
    quantized to `bits` (int4: group 128; int8: per channel), as it is served."""
    from flax import nnx
    from benchmarks import models

    model = nnx.merge(self.graphdefs["xla"], params, self.rest)
    models.quantize(model, bits=bits, group_size=128 if bits == 4 else -1)
    graphdef, qparams, rest = nnx.split(model, nnx.Param, ...)
    return make_forward(graphdef), qparams, rest

  def inference(self, decode_tokens, rounds: int, iters: int, quantized_bits=()):
    """Forward passes with the weights in bf16, as they are served (f32 master weights
    would make every variant stream 4-byte weights and convert them first); and with
    the "xla" model's weights quantized to each of `quantized_bits` (rows "int4"...)."""
    cases = {"prefill": self.batches[0][0]}
    for t in decode_tokens:
      cases[f"decode{t}"] = jnp.zeros((t, 1), jnp.int32)
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), self.state[0])
    served = {v: (self.forwards[v], params, self.rest) for v in self.variants}
    for bits in quantized_bits:
      served[f"int{bits}"] = self.quantized(params, bits)
      self.rows.setdefault(f"int{bits}", dict(variant=f"int{bits}"))
    for case, tokens in cases.items():
      calls = {}
      for name, (forward, weights, rest) in served.items():
        t0 = time.perf_counter()
        compiled = forward.lower(weights, rest, tokens).compile()
        self.rows[name].setdefault("inference", {})[case] = dict(
            tokens=int(tokens.size), compile_s=time.perf_counter() - t0
        )
        calls[name] = functools.partial(compiled, weights, rest, tokens)
      samples = interleaved(calls, rounds, iters if case == "prefill" else max(iters, DECODE_ITERS))
      for name, times in samples.items():
        self.rows[name]["inference"][case]["ms"] = statistics.median(times)
        if _on_gpu():
          from benchmarks import timeline

          _, events, _ = timeline.capture(calls[name])
          self.rows[name]["inference"][case]["kernels"] = group_kernels(
              [(e.name, (e.end_ns - e.start_ns) / 1e3) for e in events]
          )
          self.rows[name]["inference"][case]["span_us"] = (
              (events[-1].end_ns - events[0].start_ns) / 1e3 if events else None
          )


# -- report -----------------------------------------------------------------------
def table(results) -> str:
  """The printed table: one line per (model, variant), ratios against XLA."""
  lines = []
  head = (
      f"{'model':6s} {'variant':9s} {'cold compile s':>14s} {'x XLA':>6s} {'warm s':>7s} "
      f"{'kern':>4s} {'step ms':>8s} {'XLA/this':>8s} {'blocked':>7s} {'tok/s':>9s} {'peak GiB':>8s} "
      f"{'temp GiB':>8s} "
      f"{'loss diff':>9s} {'GEMM ms':>8s} {'attn ms':>7s} {'elem ms':>7s} {'other ms':>8s} "
      f"{'prefill':>8s} {'decode':>16s}"
  )
  lines.append(head)
  for arch, result in results.items():
    rows = result["variants"]
    xla = rows.get("xla", {})
    for variant, row in rows.items():
      cold = row.get("cold", {})
      cold_s, xla_cold_s = _compile_s(cold), _compile_s(xla.get("cold", {}))
      groups = row.get("kernels", {}).get("groups", {})
      inf = row.get("inference", {})
      decode = (
          "/".join(
              f"{xla['inference'][c]['ms'] / inf[c]['ms']:.2f}"
              for c in inf
              if c.startswith("decode")
          )
          if "inference" in xla
          else "-"
      )
      prefill = (
          f"{xla['inference']['prefill']['ms'] / inf['prefill']['ms']:.3f}"
          if "inference" in xla and "prefill" in inf
          else "-"
      )
      ratio = xla.get("step_ms", float("nan")) / row.get("step_ms", float("nan"))
      blocked = xla.get("step_blocked_ms", float("nan")) / row.get("step_blocked_ms", float("nan"))
      lines.append(
          f"{arch:6s} {variant:9s} {_num(cold_s, 14, 1)} "
          f"{_num(cold_s / xla_cold_s if cold_s and xla_cold_s else None, 6, 2)} "
          f"{_num(_compile_s(row.get('warm', {})), 7, 1)} "
          f"{row.get('in_process', {}).get('kernels', 0):4d} "
          f"{_num(row.get('step_ms'), 8, 2)} {ratio:8.3f} {blocked:7.3f} "
          f"{_num(row.get('tokens_per_s'), 9, 0)} "
          f"{_num(cold.get('peak_bytes') and cold['peak_bytes'] / 2**30, 8, 2)} "
          f"{_num(row.get('temp_bytes') and row['temp_bytes'] / 2**30, 8, 2)} "
          f"{_num(row.get('loss_max_diff'), 9, 5)} "
          + " ".join(
              _num(groups[g] / 1e3 if g in groups else None, w, 2)
              for g, w in zip(GROUPS, (8, 7, 7, 8))
          )
          + f" {prefill:>8s} {decode:>16s}"
      )
  lines.append(
      "x XLA: cold compile / XLA's; XLA/this: XLA step time / this variant's "
      "(> 1 is faster; steps dispatched in chains, as a training loop runs them); "
      "blocked: the same with a block after every step; peak GiB: the device's peak in the "
      "variant's cold process; temp GiB: the step's temporaries by XLA's memory analysis (this "
      "process); prefill, decode: XLA time / this (decode at "
      + "/".join(
          c[6:]
          for c in next(iter(results.values()))["variants"].get("xla", {}).get("inference", {})
          if c.startswith("decode")
      )
      + " tokens)"
  )
  return "\n".join(lines)


def _compile_s(report):
  """lower + compile seconds of a worker report, None if it has none."""
  return report["lower_s"] + report["compile_s"] if "lower_s" in report else None


def _num(x, width, digits):
  return f"{'-':>{width}s}" if x is None else f"{x:{width}.{digits}f}"


def run_model(spec, variants, args, log) -> dict:
  """Compiles, checks and times `variants` of `spec`; the persistent compilation cache
  it fills (unless --no-cache) is a temporary directory, removed afterwards."""
  log(f"== {spec.arch}: {spec}")
  if args.no_cache:
    return _run_model(spec, variants, args, log, None)
  with tempfile.TemporaryDirectory(prefix="pallas-gemm-jax-cache-") as cache_dir:
    try:
      return _run_model(spec, variants, args, log, cache_dir)
    finally:
      disable_persistent_cache()


def _run_model(spec, variants, args, log, cache_dir) -> dict:
  fresh = {} if args.in_process else fresh_compiles(spec, variants, cache_dir, log)
  if args.compile_only:
    return dict(spec=dataclasses.asdict(spec), variants=fresh)
  if cache_dir:
    enable_persistent_cache(cache_dir)
    log(f"  persistent cache: {len(os.listdir(cache_dir))} files")
  run = Run(spec, variants, args.loss_steps, log)
  run.compile()
  for variant in variants:
    run.rows[variant].update(fresh.get(variant, {}))
  run.losses()
  run.time_steps(args.rounds, args.iters, args.chain)
  if _on_gpu():
    run.breakdown(args.chain, args.sources)
    if args.power:
      run.power(args.power, args.rounds, args.chain)
  run.inference(
      [int(t) for t in args.decode.split(",") if t],
      args.rounds,
      args.iters,
      quantized_bits=[int(b) for b in args.quantized.split(",") if b],
  )
  for variant in variants:
    row = run.rows[variant]
    log(
        f"  {variant:9s} step {row['step_ms']:.2f} ms ({row['step_blocked_ms']:.2f} blocked), loss {row['loss_curve'][0]:.4f} -> "
        f"{row['loss_curve'][-1]:.4f} (max diff from {variants[0]} {row['loss_max_diff']:.2e})"
        + (f", kernels {row['kernels']['groups']}" if "kernels" in row else "")
    )
  return dict(
      spec=dataclasses.asdict(spec),
      params=run.rows[variants[0]]["params"],
      train_flops=spec.train_flops,
      variants=run.rows,
  )


def _on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


def parse_args(argv=None):
  from benchmarks import models

  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument(
      "--arch",
      default=None,
      help="comma-separated: gpt, llama (default: both; a held-out preset's own arch)",
  )
  p.add_argument(
      "--size",
      default=None,
      choices=sorted(models.SIZES) + sorted(models.HELDOUT),
      help="preset sizes (default: 'default' on a GPU, 'small' elsewhere); the held-out "
      "presets carry their arch",
  )
  for field in ("layers", "d_model", "heads", "kv_heads", "mlp", "vocab", "batch", "seq"):
    p.add_argument(
        f"--{field.replace('_', '-')}",
        type=int,
        default=None,
        help=f"override the preset's {field}",
    )
  p.add_argument("--variants", default=",".join(models.VARIANTS))
  p.add_argument("--loss-steps", type=int, default=20, help="steps of the loss curve")
  p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
  p.add_argument("--iters", type=int, default=5, help="timed calls per variant per round")
  p.add_argument(
      "--chain",
      type=int,
      default=4,
      help="training steps dispatched before each block when timing steps",
  )
  p.add_argument(
      "--power",
      type=float,
      default=0,
      help="seconds of back-to-back steps per variant and round while nvidia-smi "
      "samples clock and power (GPU only; 0: skip)",
  )
  p.add_argument(
      "--sources",
      type=int,
      default=10,
      help="per variant, this many of the costliest kernels that are not GEMMs or attention, "
      "with the jax op and source lines they came from (GPU only; 0: skip)",
  )
  p.add_argument("--decode", default="1,16,64", help="tokens per decode-like forward")
  p.add_argument(
      "--quantized",
      default="",
      help="comma-separated bits (4, 8): also serve the trained 'xla' model with its "
      "weights quantized (prefill and decode rows 'int4', 'int8')",
  )
  p.add_argument(
      "--in-process",
      action="store_true",
      help="no cold-compile subprocesses (compile times: this process only)",
  )
  p.add_argument(
      "--compile-only",
      action="store_true",
      help="only the fresh-process compiles (cold and warm), no training or timing",
  )
  p.add_argument("--no-cache", action="store_true", help="no persistent compilation cache")
  p.add_argument("--json", default=None, help="write the results here")
  p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  p.add_argument("--spec", default=None, help=argparse.SUPPRESS)
  p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.size in models.HELDOUT:
    own = models.HELDOUT[args.size].arch
    if args.arch not in (None, own):
      p.error(f"--size {args.size} is a {own} model: leave --arch out or pass {own}")
    args.arch = own
  args.arch = args.arch or "gpt,llama"
  if args.quantized and "xla" not in args.variants.split(","):
    p.error("--quantized quantizes the trained 'xla' variant: include it in --variants")
  if not set(args.quantized.split(",")) <= {"", "4", "8"}:
    p.error(f"--quantized takes bits 4 and/or 8, got {args.quantized!r}")
  return args


def specs_from(args):
  from benchmarks import models

  size = args.size or ("default" if _on_gpu() else "small")
  base = models.HELDOUT.get(size) or models.SIZES[size]
  overrides = {
      f: getattr(args, f)
      for f in ("layers", "d_model", "heads", "kv_heads", "mlp", "vocab", "batch", "seq")
      if getattr(args, f) is not None
  }
  if _on_gpu():  # flash attention, as a real model runs it; jax's own pick is XLA's
    overrides.setdefault("attention", "cudnn")
  out = []
  for arch in args.arch.split(","):
    spec = models.for_arch(base, arch)
    out.append(dataclasses.replace(spec, **overrides))
  return out


def main(argv=None) -> int:
  args = parse_args(argv)
  from benchmarks import models

  if args.worker:
    spec = models.ModelSpec(**json.loads(args.spec))
    print(json.dumps(worker(spec, args.worker, args.cache_dir)))
    return 0
  log = lambda *a: print(*a, flush=True)
  device = jax.devices()[0]
  log(
      f"jax {jax.__version__}, {device.device_kind} ({device.platform}); step: wall-clock "
      "median, variants interleaved; kernels: jax profiler (CUPTI), steps back to back"
  )
  variants = tuple(args.variants.split(","))
  meta = dict(
      jax=jax.__version__,
      device=device.device_kind,
      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
  )
  results = {}
  for spec in specs_from(args):
    results[spec.arch] = run_model(spec, variants, args, log)
    if args.json:  # after each model: a run cut short keeps what it measured
      with open(args.json, "w") as f:
        json.dump(dict(meta=meta, models=results), f, indent=1)
    log(table(results))
  return 0


if __name__ == "__main__":
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  sys.exit(main())
