"""Where a compiled program's kernels come from: each XLA fusion (or custom call) named in a
profile, traced back to the jax op and the Python lines that made it.

A profile names a GPU kernel after its HLO instruction (`loop_add_fusion_2` is the
instruction `%loop_add_fusion.2`). The compiled module's text (`compiled.as_text()`)
carries, per instruction, the jax op (`op_name`) and a stack frame id, and at its top
the tables of files, functions, locations and frames that resolve the id into a call
stack. `sources(text)` builds that map; `attribute(kernels, text)` labels profiled
kernels with it, which is how NOTES exp. 132 found what the fused GPT step's elementwise
time is made of (AdamW, LayerNorm, the cross-entropy, the qkv split).

>>> import jax, jax.numpy as jnp
>>> x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
>>> text = jax.jit(lambda x: jnp.exp(x).sum(0)).lower(x).compile().as_text()
>>> found = sources(text)
>>> any(s.op.endswith("reduce_sum") for s in found.values())
True
"""

from __future__ import annotations

import dataclasses
import os
import re

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<shape>.*?) (?:fusion|custom-call)\((?P<rest>.*)$",
    re.M,
)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_CALLS = re.compile(r"calls=%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Source:
  """One instruction: its HLO name, output shape, the jax op and the call stack
  (innermost first, "file.py:line")."""

  name: str
  shape: str
  op: str
  stack: tuple[str, ...]

  def describe(self, depth: int = 4) -> str:
    where = " < ".join(self.stack[:depth]) or "?"
    return f"{self.op or '?'} @ {where}"


def _table(text: str, title: str) -> str:
  """The body of one of the module's tables ("FileNames", "StackFrames", ...)."""
  match = re.search(rf"^{title}\n(.*?)(?:\n\n|\n(?=[A-Z]\w*\n)|\Z)", text, re.M | re.S)
  return match.group(1) if match else ""


def _stacks(text: str):
  """A function of a stack frame id (a string) to its call stack, innermost first."""
  files = dict(re.findall(r'^(\d+) "([^"]*)"', _table(text, "FileNames"), re.M))
  locations = {
      i: (f, line)
      for i, f, line in re.findall(
          r"^(\d+) \{file_name_id=(\d+) function_name_id=\d+ line=(\d+)",
          _table(text, "FileLocations"),
          re.M,
      )
  }
  frames = dict(
      (i, (loc, parent))
      for i, loc, parent in re.findall(
          r"^(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)",
          _table(text, "StackFrames"),
          re.M,
      )
  )

  def stack(frame_id: str, depth: int = 8) -> tuple[str, ...]:
    out, seen = [], set()
    while frame_id in frames and frame_id not in seen and len(out) < depth:
      seen.add(frame_id)
      location, parent = frames[frame_id]
      file_id, line = locations.get(location, ("", "?"))
      out.append(f"{os.path.basename(files.get(file_id, '?'))}:{line}")
      frame_id = str(int(parent) - 1)  # the tables count parents from 1; 0 is none
    return tuple(out)

  return stack


def sources(text: str) -> dict[str, Source]:
  """Every fusion and custom call of a compiled module's text, by the name a profile
  gives its kernel (the HLO name with "." as "_")."""
  stack = _stacks(text)
  found = {}
  for match in _INSTRUCTION.finditer(text):
    rest = match.group("rest")
    if "op_name=" not in rest:  # a GEMM fusion XLA made: its computation's ops say
      rest = _called_body(text, rest)
    op = _OP_NAME.search(rest)
    frame = _FRAME_ID.search(rest)
    name = match.group("name")
    found[name.replace(".", "_")] = Source(
        name=name,
        shape=re.sub(r"\{[\d,]*\}", "", match.group("shape")),
        op=op.group(1).split("/", 1)[-1] if op else "",
        stack=stack(frame.group(1)) if frame else (),
    )
  return found


def _called_body(text: str, rest: str) -> str:
  """The text of the computation an instruction calls (`calls=%name`), or ""."""
  called = _CALLS.search(rest)
  if not called:
    return ""
  start = text.find(f"\n%{called.group(1)} (")
  return text[start : text.find("\n}", start)] if start >= 0 else ""


def attribute(kernels, text: str, top: int = 12, skip=("mosaic_gpu", "nvjet", "sdpa")) -> list:
  """[(kernel name, us, Source or None)] of the `top` costliest (name, us) `kernels`
  whose names contain none of `skip` (the GEMM and attention kernels, known already)."""
  found = sources(text)
  kept = [(n, us) for n, us in kernels if not any(s in n for s in skip)]
  kept.sort(key=lambda kv: -kv[1])
  return [(name, us, found.get(name)) for name, us in kept[:top]]
