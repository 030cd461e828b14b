"""`watchdog.deadline`: a body that returns is left alone; one that does not ends the
process with a message naming it; the limit comes from the environment."""

import os
import subprocess
import sys
import time

import pytest

from pallas_gemm import watchdog


def test_a_body_that_returns_in_time_is_left_alone():
  with watchdog.deadline("a quick step", seconds=2.0):
    time.sleep(0.01)
  time.sleep(2.2)  # past the deadline: the cancelled timer must not fire (we are alive)


def test_a_body_past_its_deadline_ends_the_process_naming_it():
  code = (
      "import time\n"
      "from pallas_gemm.watchdog import deadline\n"
      "with deadline('timing config X on problem P', seconds=0.3):\n"
      "  time.sleep(30)\n"
      "print('not reached')\n"
  )
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  started = time.monotonic()
  done = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      timeout=120,
      env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"},
  )
  assert done.returncode == watchdog.EXIT_CODE
  assert "timing config X on problem P has not returned after 0.3 s" in done.stderr
  assert "not reached" not in done.stdout
  assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    "text, seconds", [("", watchdog.DEFAULT_SECONDS), ("0", 0.0), ("12.5", 12.5)]
)
def test_the_limit_comes_from_the_environment(monkeypatch, text, seconds):
  monkeypatch.setenv(watchdog.ENV_SECONDS, text)
  assert watchdog.seconds_from_env() == seconds


@pytest.mark.parametrize("text", ["-1", "soon", "nan"])
def test_a_bad_limit_is_named(monkeypatch, text):
  monkeypatch.setenv(watchdog.ENV_SECONDS, text)
  with pytest.raises(ValueError, match=watchdog.ENV_SECONDS):
    watchdog.seconds_from_env()
