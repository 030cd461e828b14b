"""`benchmarks.three_consumers` on the CPU: the configs it would time, every variant valid
at the shape it was made for."""

import jax
import pytest

from benchmarks import three_consumers
from pallas_gemm.config import GemmProblem


def test_every_variant_is_a_contender_at_1536_cubed():
  named = three_consumers.configs(GemmProblem(m=1536, n=1536, k=1536))
  assert len(named) == 1 + len(three_consumers.VARIANTS)
  assert all(config.consumers == 3 for name, config in named.items() if name != "default")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU it times the shapes")
def test_the_cpu_run_lists_the_configs(capsys):
  assert three_consumers.main([]) == 0
  out = capsys.readouterr().out
  assert "1536x1536x1536: default, 192x96x64" in out and "no GPU" in out
