"""Stream-K: the schedule's invariants (on ints and traced values), a numpy replay of
the kernel's reduction, config checks, and CUDA lowering. Its numbers come from the
device only (`benchmarks.device_check`, "streamk" cases): GPU interpret mode has no
global semaphores."""

import dataclasses
import doctest
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pallas_gemm import GemmConfig, GemmProblem, matmul, stream_k
from pallas_gemm.hopper_gemm import hopper_gemm
from hypothesis_budget import examples

schedules = st.builds(
    stream_k.Schedule.plan,
    tiles=st.integers(1, 400),
    workers=st.integers(1, 140),
    k_iters=st.integers(1, 160),
)


def test_docstring_examples():
  assert doctest.testmod(stream_k).failed == 0


@settings(max_examples=examples(100), deadline=None)
@given(schedules)
def test_every_k_step_of_every_tile_runs_once(s):
  covered = np.zeros((s.tiles, s.k_iters), int)
  for w in range(s.workers):
    for tile, kb, ke in s.segments(w):
      covered[tile, kb:ke] += 1
    dp = [s.sk_tiles + w + i * s.workers for i in range(s.dp_tiles_per_worker)]
    covered[dp] += 1
  assert (covered == 1).all()


@settings(max_examples=examples(100), deadline=None)
@given(schedules)
def test_ranges_are_balanced_and_waits_match_signals(s):
  lengths = [s.range_of(w)[1] for w in range(s.workers)]
  assert max(lengths) - min(lengths) <= (1 if s.enabled else 0)
  assert s.enabled == (s.tiles % s.workers != 0)
  signals, waits = set(), []
  for w in range(s.workers):
    segs = s.segments(w)
    # Only a worker's first segment may start inside a tile (it contributes, never waits).
    assert all(kb == 0 for _, kb, _ in segs[1:])
    for tile, kb, ke in segs:
      assert s.owner(tile * s.k_iters + kb) == w
      if kb > 0:
        signals.add(w)
      else:
        contributors = s.owner(tile * s.k_iters + s.k_iters - 1) - w
        assert contributors <= s.max_contributors
        waits += [w + 1 + c for c in range(contributors)]
  assert sorted(waits) == sorted(signals)  # each contributor signals once, is waited for once


@pytest.mark.parametrize("tiles, workers, k_iters", [(512, 66, 64), (64, 66, 32), (256, 132, 2)])
def test_traced_schedule_matches_ints(tiles, workers, k_iters):
  s = stream_k.Schedule.plan(tiles, workers, k_iters)
  w = jnp.arange(workers)
  start, length = jax.jit(s.range_of)(w)
  assert [(int(a), int(b)) for a, b in zip(start, length)] == [
      s.range_of(i) for i in range(workers)
  ]
  steps = jnp.arange(s.sk_steps)
  assert np.asarray(jax.jit(s.owner)(steps)).tolist() == [s.owner(i) for i in range(s.sk_steps)]


def test_numpy_replay_of_the_reduction_equals_the_product():
  """Each worker accumulates its segments; contributors hand partials to the tile's
  finisher, which adds them before the epilogue: the kernel's data flow, in numpy."""
  rng = np.random.default_rng(0)
  tm, tn, tk, m_tiles, n_tiles, k_iters, workers = 4, 3, 2, 5, 3, 7, 4
  a = rng.standard_normal((m_tiles * tm, k_iters * tk))
  b = rng.standard_normal((k_iters * tk, n_tiles * tn))
  s = stream_k.Schedule.plan(m_tiles * n_tiles, workers, k_iters)
  assert s.enabled and s.max_contributors >= 1

  def part(tile, kb, ke):
    mi, ni = divmod(tile, n_tiles)
    rows, cols, ks = (
        slice(mi * tm, (mi + 1) * tm),
        slice(ni * tn, (ni + 1) * tn),
        slice(kb * tk, ke * tk),
    )
    return (mi, ni), a[rows, ks] @ b[ks, cols]

  out, partials, finished = np.full((m_tiles * tm, n_tiles * tn), np.nan), {}, []
  for w in range(workers):
    for tile, kb, ke in s.segments(w):
      if kb > 0:
        partials[w] = part(tile, kb, ke)[1]
      else:
        finished.append((w, tile, kb, ke))
  for w in range(workers):
    finished += [
        (w, s.sk_tiles + w + i * workers, 0, k_iters) for i in range(s.dp_tiles_per_worker)
    ]
  for w, tile, kb, ke in finished:
    (mi, ni), acc = part(tile, kb, ke)
    contributors = s.owner(tile * k_iters + k_iters - 1) - w if tile < s.sk_tiles else 0
    for c in range(contributors):
      acc = acc + partials[w + 1 + c]
    out[mi * tm : (mi + 1) * tm, ni * tn : (ni + 1) * tn] = acc
  np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)


tail_splits = st.builds(
    stream_k.TailSplit.plan,
    tiles=st.integers(1, 400),
    workers=st.integers(1, 140),
    k_iters=st.integers(1, 160),
    min_steps=st.integers(1, 16),
)


def _tail_units(s):
  """(worker, tile, kb, ke) of every unit of a TailSplit, in each worker's order."""
  units = []
  for w in range(s.workers):
    units += [(w, w + i * s.workers, 0, s.k_iters) for i in range(s.dp_tiles_per_worker)]
    if s.enabled and s.slice_of(w) is not None:
      units.append((w, *s.slice_of(w)))
  return units


@settings(max_examples=examples(100), deadline=None)
@given(tail_splits)
def test_tail_split_runs_every_k_step_once_and_waits_match_signals(s):
  if not s.enabled:  # the plan is not used: every tile runs whole (`_Plan.stream_k`)
    tail = s.tiles % s.workers
    assert tail == 0 or 2 * tail > s.workers or s.k_iters < 2 * s.min_steps
    return
  covered = np.zeros((s.tiles, s.k_iters), int)
  signals, waits = set(), []
  for w, tile, kb, ke in _tail_units(s):
    assert ke > kb
    covered[tile, kb:ke] += 1
    if (kb, ke) == (0, s.k_iters):
      # a whole tile: the kernel's finisher path asks for no contributors' partials
      assert s.owner(tile * s.k_iters + s.k_iters - 1) - w <= 0
      continue
    assert s.owner(tile * s.k_iters + kb) == w == s.owner(tile * s.k_iters + ke - 1)
    if kb > 0:
      signals.add(w)
    else:
      contributors = s.owner(tile * s.k_iters + s.k_iters - 1) - w
      assert contributors == s.max_contributors == s.slices - 1
      waits += [w + 1 + c for c in range(contributors)]
  assert (covered == 1).all()
  assert sorted(waits) == sorted(signals)
  # the contributors' workspace slots: one each, no more than there are contributors
  assert sorted(s.slot(w) for w in signals) == list(range(s.slots)) == list(range(len(signals)))
  # equal slices: the tail takes one slice's time, at most ceil(k_iters / slices) steps
  lengths = [ke - kb for _, _, kb, ke in _tail_units(s) if (kb, ke) != (0, s.k_iters)]
  assert max(lengths) - min(lengths) <= 1 and min(lengths) >= s.min_steps


@pytest.mark.parametrize("tiles, workers, k_iters", [(136, 132, 56), (162, 132, 64), (32, 132, 9)])
def test_traced_tail_split_matches_ints(tiles, workers, k_iters):
  s = stream_k.TailSplit.plan(tiles, workers, k_iters, min_steps=1)
  first = s.dp_tiles_per_worker * workers
  steps = jnp.arange(first * k_iters, tiles * k_iters)
  assert np.asarray(jax.jit(s.owner)(steps)).tolist() == [
      s.owner(i) for i in range(first * k_iters, tiles * k_iters)
  ]
  c = jnp.arange(s.slices + 1)
  assert np.asarray(jax.jit(s._bound)(c)).tolist() == [s._bound(i) for i in range(s.slices + 1)]
  w = jnp.arange(workers)
  assert np.asarray(jax.jit(s.slot)(w)).tolist() == [s.slot(i) for i in range(workers)]


@pytest.mark.parametrize("tiles, workers, k_iters", [(136, 132, 56), (162, 132, 64), (10, 4, 8)])
def test_tail_split_units_traced_match_the_plan(tiles, workers, k_iters):
  """The kernel's one loop (`units`, `unit`, traced) runs the units `_tail_units` lists."""
  s = stream_k.TailSplit.plan(tiles, workers, k_iters, min_steps=1)
  w = jnp.arange(workers)
  counts = np.asarray(jax.jit(jax.vmap(s.units))(w)).tolist()
  traced = []
  for worker, count in enumerate(counts):
    i = jnp.arange(count)
    rows = np.asarray(jax.jit(jax.vmap(s.unit, (None, 0)))(jnp.int32(worker), i)).T
    traced += [(worker, *map(int, row)) for row in rows]
  ints = [(w, *s.unit(w, i)) for w in range(workers) for i in range(s.units(w))]
  assert sorted(traced) == sorted(ints) == sorted(_tail_units(s))


def test_numpy_replay_of_the_tail_split_equals_the_product():
  rng = np.random.default_rng(1)
  tm, tn, tk, m_tiles, n_tiles, k_iters, workers = 4, 3, 2, 3, 3, 7, 4
  a = rng.standard_normal((m_tiles * tm, k_iters * tk))
  b = rng.standard_normal((k_iters * tk, n_tiles * tn))
  s = stream_k.TailSplit.plan(m_tiles * n_tiles, workers, k_iters, min_steps=1)  # 2 waves + 1 in 4
  assert (s.dp_tiles_per_worker, s.slices) == (2, 4)

  def part(tile, kb, ke):
    mi, ni = divmod(tile, n_tiles)
    ks = slice(kb * tk, ke * tk)
    return (mi, ni), a[mi * tm : (mi + 1) * tm, ks] @ b[ks, ni * tn : (ni + 1) * tn]

  out, partials = np.full((m_tiles * tm, n_tiles * tn), np.nan), {}
  units = _tail_units(s)
  for w, tile, kb, ke in units:  # contributors store into their workspace slots
    if kb > 0:
      assert s.slot(w) not in partials
      partials[s.slot(w)] = part(tile, kb, ke)[1]
  assert sorted(partials) == list(range(s.slots))
  for w, tile, kb, ke in units:
    if kb == 0:
      (mi, ni), acc = part(tile, kb, ke)
      if ke < k_iters:
        for c in range(s.owner(tile * k_iters + k_iters - 1) - w):
          acc = acc + partials[s.slot(w + 1 + c)]
      out[mi * tm : (mi + 1) * tm, ni * tn : (ni + 1) * tn] = acc
  np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)


def test_split_tail_needs_stream_k():
  with pytest.raises(ValueError, match="GemmConfig.split_tail=True: must be a bool, True only"):
    GemmConfig(split_tail=True)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            dict(schedule="pingpong", tile_n=128, stages=4),
            "GemmConfig.stream_k=True: needs schedule='cooperative'",
        ),
        (dict(split_k=2), "GemmConfig.stream_k=True: needs schedule='cooperative' and split_k=1"),
    ],
)
def test_stream_k_rules_name_the_field(change, match):
  cfg = dataclasses.replace(GemmConfig(stream_k=True), **change)
  with pytest.raises(ValueError, match=re.escape(match)):
    cfg.validate(GemmProblem(m=512, n=512, k=1024))


def test_interpret_mode_refuses_stream_k():
  a = jnp.ones((256, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="GemmConfig.stream_k=True: GPU interpret mode"):
    matmul(a, a.T, config=GemmConfig(stream_k=True, num_sms=2), implementation="interpret")


@pytest.mark.parametrize(
    "m, n, k, cfg, extras",
    [
        (4096, 8192, 4096, GemmConfig(stream_k=True, cluster=(2, 1)), {}),
        (2048, 2048, 128, GemmConfig(stream_k=True), {}),
        (1000, 1024, 576, GemmConfig(stream_k=True), dict(bias=True)),
        (
            600,
            1024,
            1024,
            GemmConfig(stream_k=True, wg_split="n", tile_n=128),
            dict(return_pre=True),
        ),
        (2304, 2112, 4096, GemmConfig(stream_k=True, split_tail=True, cluster=(2, 1)), {}),
        (1000, 1024, 1600, GemmConfig(stream_k=True, split_tail=True), dict(bias=True)),
    ],
)
def test_stream_k_lowers_for_cuda(m, n, k, cfg, extras):
  from pallas_gemm import epilogue as epilogue_lib

  problem = GemmProblem(m=m, n=n, k=k, has_bias=extras.get("bias", False))
  spec = epilogue_lib.EpilogueSpec(activation="gelu_tanh" if extras else None)
  tn = cfg.tile_n

  def f(a, b, *bias):
    return hopper_gemm(
        a,
        b,
        *bias,
        problem=problem,
        config=cfg,
        epilogue=spec,
        return_pre=extras.get("return_pre", False),
    )

  args = [jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16)]
  if problem.has_bias:
    args.append(jax.ShapeDtypeStruct((-(-n // tn) * tn,), jnp.float32))
  exported = jax.export.export(jax.jit(f), platforms=["cuda"])(*args)
  outs = 2 if extras.get("return_pre") else 1
  assert [a.shape for a in exported.out_avals] == [(m, n)] * outs  # the workspace is dropped
