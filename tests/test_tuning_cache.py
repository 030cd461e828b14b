"""The tuning cache: keys, location, corrupt and stale files, atomic concurrent writes."""

import dataclasses
import doctest
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from pallas_gemm import tuning_cache as tc
from pallas_gemm.config import GemmConfig, GemmProblem

PROBLEM = GemmProblem(m=4096, n=8192, k=4096)
KEY = tc.TuningKey("NVIDIA H100 80GB HBM3", "0.11.2", PROBLEM)
CONFIG = GemmConfig(tile_m=128, tile_n=128, stages=5, cluster=(2, 1), epilogue_tile=None)


@pytest.fixture
def cache(tmp_path):
  return tc.TuningCache(str(tmp_path / "tuning.json"))


def test_docstring_examples():
  assert doctest.testmod(tc).failed == 0


# -- keys ---------------------------------------------------------------------
def test_epilogue_names_round_trip():
  for parts in [
      (False, False, None),
      (True, False, "relu"),
      (True, True, "gelu_tanh"),
      (False, True, None),
  ]:
    assert tc.parse_epilogue(tc.epilogue_name(*parts)) == parts
  assert tc.parse_epilogue(None) == (False, False, None)


@pytest.mark.parametrize("bad", ["gelu", "relu+silu", "bias+bias", ""])
def test_bad_epilogue_names_are_rejected(bad):
  with pytest.raises(ValueError, match="epilogue"):
    tc.parse_epilogue(bad)


def test_key_separates_device_jax_shape_layout_dtype_and_epilogue():
  variants = [
      dataclasses.replace(KEY, device_kind="NVIDIA H200"),
      dataclasses.replace(KEY, jax_version="0.10.2"),
      dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, k=4000)),
      dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, batch=2)),
      dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, transpose_b=True)),
      dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, out_dtype="float32")),
      dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, has_bias=True)),
      dataclasses.replace(KEY, activation="relu"),
  ]
  tokens = {key.token() for key in [KEY, *variants]}
  assert len(tokens) == len(variants) + 1
  assert tc.TuningKey.from_json(json.loads(json.dumps(KEY.to_json()))) == KEY


def test_current_key_uses_this_device_and_jax():
  import jax

  key = tc.TuningKey.current(PROBLEM, "silu")
  assert (key.device_kind, key.jax_version) == (jax.devices()[0].device_kind, jax.__version__)


# -- location -----------------------------------------------------------------
def test_cache_path_follows_platform_conventions():
  home = os.path.expanduser("~")
  assert tc.cache_path({}, "linux") == os.path.join(home, ".cache", "pallas_gemm", "tuning.json")
  assert tc.cache_path({"XDG_CACHE_HOME": "/x"}, "linux") == os.path.join(
      "/x", "pallas_gemm", "tuning.json"
  )
  assert tc.cache_path({}, "darwin") == os.path.join(
      home, "Library", "Caches", "pallas_gemm", "tuning.json"
  )
  assert tc.cache_path({"LOCALAPPDATA": "/L"}, "win32") == os.path.join(
      "/L", "pallas_gemm", "Cache", "tuning.json"
  )
  assert tc.cache_path({}, "win32").startswith(os.path.join(home, "AppData", "Local"))
  for platform in ("linux", "darwin", "win32"):
    assert tc.cache_path({"PALLAS_GEMM_CACHE": "/c.json"}, platform) == "/c.json"


def test_lookup_config_reads_the_file_named_by_the_environment(tmp_path, monkeypatch):
  path = tmp_path / "env.json"
  monkeypatch.setenv("PALLAS_GEMM_CACHE", str(path))
  assert tc.lookup_config(PROBLEM) is None
  tc.TuningCache(str(path)).store(tc.TuningKey.current(PROBLEM, "relu"), CONFIG, 1.0)
  assert tc.lookup_config(PROBLEM, "relu") == CONFIG
  assert tc.lookup_config(PROBLEM) is None  # no activation: another key


# -- the shipped table ---------------------------------------------------------
H100 = "NVIDIA H100 80GB HBM3"


def test_shipped_table_parses_cleanly_and_every_entry_validates():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    records = tc.TuningCache(tc.PACKAGED_PATH).records()
  assert len(records) >= 21 and {r.key.device_kind for r in records.values()} == {H100}
  for record in records.values():
    record.config.validate(record.key.problem)


def test_packaged_config_takes_the_smallest_tuned_m_within_reach(tmp_path):
  shipped = tc.TuningCache(str(tmp_path / "shipped.json"))
  small, large = GemmConfig(tile_m=64, tile_n=128, wg_split="n"), CONFIG
  for m, config in ((16, small), (256, large)):
    shipped.store(tc.TuningKey(H100, "0.11.2", dataclasses.replace(PROBLEM, m=m)), config, 1.0)
  at = lambda m, **kw: tc.packaged_config(
      dataclasses.replace(PROBLEM, m=m),
      device_kind=kw.pop("device_kind", H100),
      path=shipped.path,
      **kw,
  )
  assert at(1) == small and at(16) == small  # 1 <= 16 <= max(16, 4)
  assert at(17) is None  # 256 > 4 * 17: out of reach
  assert at(64) == large and at(256) == large
  assert at(257) is None  # nothing tuned at M >= 257
  assert at(64, device_kind="NVIDIA A100-SXM4-80GB") is None  # not a Hopper board
  assert at(64, activation="relu") is None  # the activation is part of the key
  other = dataclasses.replace(PROBLEM, m=64, transpose_b=True)
  assert tc.packaged_config(other, device_kind=H100, path=shipped.path) is None


def test_other_hopper_boards_use_the_h100_table_unless_an_entry_names_them(tmp_path):
  shipped = tc.TuningCache(str(tmp_path / "shipped.json"))
  h200_config = GemmConfig(tile_m=64, tile_n=128, wg_split="n")
  shipped.store(tc.TuningKey(H100, "0.11.2", PROBLEM), CONFIG, 1.0)
  at = lambda kind: tc.packaged_config(PROBLEM, device_kind=kind, path=shipped.path)
  for kind in ("NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA H800", "NVIDIA GH200 480GB"):
    assert at(kind) == CONFIG, kind
  shipped.store(tc.TuningKey("NVIDIA H200", "0.11.2", PROBLEM), h200_config, 1.0)
  assert at("NVIDIA H200") == h200_config and at(H100) == CONFIG
  assert at("NVIDIA H20") in (CONFIG, h200_config)  # another board of the family
  assert at("NVIDIA A100-SXM4-80GB") is None and at("cpu") is None


def test_the_users_cache_comes_before_the_shipped_table(tmp_path, monkeypatch):
  problem = GemmProblem(m=16, n=4096, k=4096)
  shipped = tc.TuningCache(str(tmp_path / "shipped.json"))
  shipped.store(tc.TuningKey.current(problem), CONFIG, 1.0)
  monkeypatch.setattr(tc, "PACKAGED_PATH", shipped.path)
  monkeypatch.setattr(tc.packaged_config, "__defaults__", (None, None, shipped.path))
  monkeypatch.setenv("PALLAS_GEMM_CACHE", str(tmp_path / "user.json"))
  assert tc.lookup_config(problem) == CONFIG
  mine = dataclasses.replace(CONFIG, stages=4)
  tc.TuningCache(str(tmp_path / "user.json")).store(tc.TuningKey.current(problem), mine, 1.0)
  assert tc.lookup_config(problem) == mine


# -- load and store -----------------------------------------------------------
def test_store_then_lookup_round_trips_tuples_and_none(cache):
  cache.store(KEY, CONFIG, 0.25)
  fresh = tc.TuningCache(cache.path)
  assert fresh.lookup(KEY) == CONFIG
  assert fresh.record(KEY).time_ms == 0.25
  assert fresh.lookup(dataclasses.replace(KEY, jax_version="0.10.2")) is None


def test_store_replaces_the_entry_of_the_same_key(cache):
  cache.store(KEY, CONFIG, 0.3)
  cache.store(KEY, GemmConfig(), 0.2)
  assert tc.TuningCache(cache.path).lookup(KEY) == GemmConfig()
  assert len(json.load(open(cache.path))["entries"]) == 1


def test_lookups_stay_in_memory_until_the_file_changes(cache, monkeypatch):
  cache.store(KEY, CONFIG, 0.3)
  reads = []
  real_read = tc._read_records
  monkeypatch.setattr(tc, "_read_records", lambda path: reads.append(path) or real_read(path))
  reader = tc.TuningCache(cache.path)
  for _ in range(5):
    assert reader.lookup(KEY) == CONFIG
  assert len(reads) == 1
  other = dataclasses.replace(KEY, activation="relu")
  tc.TuningCache(cache.path).store(other, GemmConfig(), 0.1)  # another writer
  assert reader.lookup(other) == GemmConfig()
  assert len(reads) == 3  # the writer's merge, then the reader's reload


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '{"schema": 99, "entries": {}}',
        '{"schema": 1, "entries": []}',
        "\x00\x01",
        "[" * 100_000 + "]" * 100_000,  # json.load's RecursionError
    ],
)
def test_an_unusable_file_is_ignored_with_a_warning_then_replaced(cache, content):
  with open(cache.path, "w") as f:
    f.write(content)
  with pytest.warns(tc.TuningCacheWarning, match="ignoring the tuning cache"):
    assert cache.lookup(KEY) is None
  with pytest.warns(tc.TuningCacheWarning):
    cache.store(KEY, CONFIG, 0.5)
  data = json.load(open(cache.path))
  assert data["schema"] == tc.SCHEMA_VERSION and len(data["entries"]) == 1


def test_stale_entries_are_dropped_with_a_warning_and_the_rest_kept(cache):
  cache.store(KEY, CONFIG, 0.5)
  data = json.load(open(cache.path))
  good = next(iter(data["entries"].values()))
  too_deep = json.loads(json.dumps(good))
  too_deep["config"]["stages"] = 9  # no longer fits in shared memory
  too_deep["key"]["activation"] = "relu"
  renamed_field = json.loads(json.dumps(good))
  renamed_field["config"]["tile_q"] = renamed_field["config"].pop("tile_m")
  renamed_field["key"]["activation"] = "silu"
  data["entries"].update({"a": too_deep, "b": renamed_field, "c": "garbage"})
  with open(cache.path, "w") as f:
    json.dump(data, f)
  with pytest.warns(tc.TuningCacheWarning, match="3 stale entries"):
    records = tc.TuningCache(cache.path).records()
  assert list(records.values()) == [tc.TuningRecord(KEY, CONFIG, 0.5)]


def test_an_unwritable_location_warns_instead_of_raising(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  cache = tc.TuningCache(str(blocker / "sub" / "tuning.json"))
  with pytest.warns(tc.TuningCacheWarning, match="could not write"):
    cache.store(KEY, CONFIG, 0.5)
  assert cache.lookup(KEY) is None


def test_writes_leave_no_temporary_files(cache, tmp_path):
  for i in range(3):
    cache.store(dataclasses.replace(KEY, jax_version=f"0.{i}"), CONFIG, 0.5)
  assert sorted(os.listdir(tmp_path)) == ["tuning.json", "tuning.json.lock"]


_WRITER = textwrap.dedent("""
    import os, sys, time
    from pallas_gemm import tuning_cache as tc
    from pallas_gemm.config import GemmConfig, GemmProblem
    path, writer, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    open(go + f".ready{writer}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    cache = tc.TuningCache(path)
    for i in range(count):
        key = tc.TuningKey("dev", "1", GemmProblem(m=64 * (writer + 1), n=64, k=64 * (i + 1)))
        cache.store(key, GemmConfig(stages=2 + i % 3), 0.1 * (i + 1))
""")


@pytest.mark.slow
def test_concurrent_writers_lose_nothing_and_never_tear_the_file(cache, tmp_path):
  writers, count = 3, 20
  go = str(tmp_path / "go")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = [
      subprocess.Popen([sys.executable, "-c", _WRITER, cache.path, str(w), str(count), go], env=env)
      for w in range(writers)
  ]
  deadline = time.monotonic() + 60
  while not all(os.path.exists(f"{go}.ready{w}") for w in range(writers)):
    assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.01)
  open(go, "w").close()
  snapshots = 0
  while any(p.poll() is None for p in procs):  # every version readers see is whole
    if os.path.exists(cache.path):
      with open(cache.path) as f:
        json.load(f)
      snapshots += 1
    time.sleep(0.002)
  assert [p.wait() for p in procs] == [0] * writers
  records = tc.TuningCache(cache.path).records()
  assert len(records) == writers * count
  assert snapshots > 0
  assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
