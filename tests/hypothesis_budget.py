"""How many examples a hypothesis test draws in this process.

CI's legs on other jax versions (``PALLAS_GEMM_SKIP_SLOW=1``: they run the code paths, not
every case of them) draw a quarter of each test's examples, two at least; its leg on the GPU
machine's jax, and any run without the variable, draws them all."""

import os

SKIP_SLOW = os.environ.get("PALLAS_GEMM_SKIP_SLOW") == "1"


def examples(count: int) -> int:
  """`count` examples, or a quarter of them (two at least) where slow tests are skipped."""
  return max(2, count // 4) if SKIP_SLOW else count
