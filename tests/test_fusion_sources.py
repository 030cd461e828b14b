"""`benchmarks.fusion_sources`: kernels of a compiled program traced to the jax op and the
source lines that made them (on the CPU's compiled text; a GPU's has the same tables)."""

import inspect

import jax
import jax.numpy as jnp

from benchmarks import fusion_sources


def _program(x, y):
  h = jnp.tanh(x) * y  # the line the fusion below should name
  return jnp.sum(h, axis=0) + jnp.max(y, axis=1).sum()


def _compiled_text():
  x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
  return jax.jit(_program).lower(x, x).compile().as_text()


def test_fusions_name_their_op_and_a_line_of_this_file():
  found = fusion_sources.sources(_compiled_text())
  assert found, "no fusion found in the compiled text"
  lines = {f"test_fusion_sources.py:{inspect.getsourcelines(_program)[1] + i}" for i in (1, 2)}
  for name, source in found.items():
    assert "." not in name, name  # keyed as a profile names the kernel
    if source.stack:  # XLA's own instructions (a split reduction) may carry no metadata
      assert source.op and source.stack[0] in lines, source
  ops = {source.op for source in found.values()}
  assert {"reduce_sum", "reduce_max"} <= {op.rsplit("/", 1)[-1] for op in ops}, ops


def test_attribute_keeps_the_costliest_unknown_kernels_in_order():
  text = _compiled_text()
  names = list(fusion_sources.sources(text))
  kernels = [(names[0], 5.0), ("pallas_gemm_8x8x8_NN_mosaic_gpu_kernel", 99.0), ("other", 7.0)]
  labelled = fusion_sources.attribute(kernels, text, top=2)
  assert [(n, us) for n, us, _ in labelled] == [("other", 7.0), (names[0], 5.0)]
  assert labelled[0][2] is None and labelled[1][2].name.replace(".", "_") == names[0]


def test_describe_cuts_the_stack():
  source = fusion_sources.Source("f.1", "f32[2]", "add", ("a.py:1", "b.py:2", "c.py:3"))
  assert source.describe(depth=2) == "add @ a.py:1 < b.py:2"
  assert fusion_sources.Source("f", "f32[]", "", ()).describe() == "? @ ?"
