"""Builds the API reference of `pallas_gemm` and `layouts` from their docstrings (pydoc's HTML,
no dependency), one page per module and an index; CI builds it (`tests/test_api_reference.py`).

    python docs/build_api.py [OUT_DIR]        # default: docs/api (not committed)

Fails (exit status 1, the offending names listed) when a module does not import, or a module,
or a public function or class of the packages' `__all__`, has no docstring.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import pkgutil
import pydoc
import sys

PACKAGES = ("pallas_gemm", "layouts")
NEEDS_FLAX = ("pallas_gemm.flax",)


def module_names() -> list[str]:
  """Every public module of the packages (no `_private` or `__main__` ones), packages first."""
  names = []
  for package_name in PACKAGES:
    package = importlib.import_module(package_name)
    names.append(package_name)
    for info in pkgutil.walk_packages(package.__path__, package_name + "."):
      leaf = info.name.rsplit(".", 1)[1]
      if not leaf.startswith("_"):
        names.append(info.name)
  return names


def undocumented(module) -> list[str]:
  """Names in `module` that should carry a docstring and do not."""
  missing = [] if inspect.getdoc(module) else [module.__name__]
  for name in getattr(module, "__all__", ()):
    obj = getattr(module, name)
    if (inspect.isfunction(obj) or inspect.isclass(obj)) and not inspect.getdoc(obj):
      missing.append(f"{module.__name__}.{name}")
  return missing


def build(out_dir: str) -> list[str]:
  """Writes one HTML page per module and index.html into `out_dir`; returns the problems."""
  os.makedirs(out_dir, exist_ok=True)
  problems, rows = [], []
  renderer = pydoc.HTMLDoc()
  for name in module_names():
    try:
      module = importlib.import_module(name)
    except ImportError as e:
      if name in NEEDS_FLAX and "flax" in str(e):
        continue  # an optional extra that is not installed
      problems.append(f"{name}: does not import ({e})")
      continue
    problems += [f"{missing}: no docstring" for missing in undocumented(module)]
    page = renderer.page(pydoc.describe(module), renderer.document(module, name))
    with open(os.path.join(out_dir, f"{name}.html"), "w", encoding="utf-8") as f:
      f.write(page)
    summary = (inspect.getdoc(module) or "").split("\n", 1)[0]
    rows.append(f'<li><a href="{name}.html">{name}</a>: {html.escape(summary)}</li>')
  with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
    f.write(
        "<!doctype html><title>pallas-gemm API reference</title>"
        "<h1>pallas-gemm API reference</h1>"
        "<p>Generated from the docstrings by docs/build_api.py. Start with "
        '<a href="pallas_gemm.html">pallas_gemm</a> (the entry points) and '
        '<a href="pallas_gemm.config.html">pallas_gemm.config</a> (GemmConfig: every tuning '
        "knob, explained).</p><ul>" + "\n".join(rows) + "</ul>"
    )
  return problems


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  out_dir = argv[0] if argv else os.path.join(os.path.dirname(__file__), "api")
  problems = build(out_dir)
  for problem in problems:
    print(problem, file=sys.stderr)
  print(f"API reference in {out_dir}: {len(os.listdir(out_dir))} pages")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
