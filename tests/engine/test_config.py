"""The declarative config schema: CLI flags, TOML keys, precedence and source reporting."""
from __future__ import annotations

import subprocess
import sys

import pytest

from engine.config import SCHEMA, ConfigError, build_parser, load


def write(tmp_path, text: str):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


def test_every_schema_key_is_a_flag():
    help_text = build_parser().format_help()
    for opt in SCHEMA:
        assert opt.flag in help_text


def test_precedence_defaults_toml_cli(tmp_path):
    path = write(tmp_path, "ctx = 1024\nstreams = 2\n")
    cfg = load(["--config", path, "--streams", "8"])
    assert (cfg.ctx, cfg.sources["ctx"]) == (1024, "toml")
    assert (cfg.streams, cfg.sources["streams"]) == (8, "cli")
    assert (cfg.port, cfg.sources["port"]) == (8080, "default")


def test_authoritative_toml_wins_over_cli(tmp_path):
    path = write(tmp_path, "authoritative = true\nstreams = 2\n")
    cfg = load(["--config", path, "--streams", "8", "--ctx", "512"])
    assert (cfg.streams, cfg.sources["streams"]) == (2, "toml")
    assert (cfg.ctx, cfg.sources["ctx"]) == (512, "cli")
    assert cfg.report()["streams"] == {"value": 2, "source": "toml", "help": cfg.report()["streams"]["help"]}


def test_roster_and_model_flag(tmp_path):
    path = write(tmp_path, '[[models]]\nname = "a"\npath = "/m/a.gguf"\nstreams = 2\n'
                           '[[models]]\npath = "/m/b.gguf"\ndefault = true\n')
    cfg = load(["--config", path])
    assert [(m.name, m.default, m.streams) for m in cfg.models] == [("a", False, 2), ("b", True, None)]
    cfg = load(["--config", path, "-m", "/m/c.gguf"])
    assert [m.name for m in cfg.models] == ["c", "a", "b"] and cfg.models[0].default
    assert not any(m.default for m in cfg.models[1:])


def test_per_model_cache_settings_parse_save_and_refuse_bad_values(tmp_path):
    path = write(tmp_path, '[[models]]\nname = "a"\npath = "/m/a.gguf"\nkv_unified = false\ncache_ram = 0\n'
                           'cache_disk = 16\n[[models]]\npath = "/m/b.gguf"\n')
    cfg = load(["--config", path])
    assert [(m.kv_unified, m.cache_ram, m.cache_disk) for m in cfg.models] == [(False, 0, 16), (None, None, None)]
    cfg.save()  # the roster is written back with the per-model keys
    again = load(["--config", path])
    assert [(m.kv_unified, m.cache_ram, m.cache_disk) for m in again.models] == [(False, 0, 16), (None, None, None)]
    with pytest.raises(ConfigError, match="cache_ram"):
        load(["--config", write(tmp_path, '[[models]]\npath = "/m/a.gguf"\ncache_ram = "big"\n')])
    with pytest.raises(ConfigError, match="kv_unified"):
        load(["--config", write(tmp_path, '[[models]]\npath = "/m/a.gguf"\nkv_unified = 3\n')])


@pytest.mark.parametrize("argv, words", [
    (["--ctx", "abc"], ["--ctx", "integer"]),
    (["--kv-dtype", "f8"], ["--kv-dtype", "f16, q8_0, q4_0"]),
    (["--port", "70000"], ["--port", "65535"]),
    (["--streams", "0"], ["--streams", ">= 1"]),
    (["--log-level", "loud"], ["--log-level", "debug, info"]),
])
def test_bad_cli_values_name_key_and_allowed(tmp_path, argv, words):
    with pytest.raises(ConfigError) as e:
        load(["--config", write(tmp_path, ""), *argv])
    for w in words:
        assert w in str(e.value)


def test_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="'streams'.*integer"):
        load(["--config", write(tmp_path, 'streams = "many"\n')])
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load(["--config", write(tmp_path, 'colour = "red"\n')])
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(["--config", write(tmp_path, "streams = = 2\n")])


def test_cli_bad_value_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app", "--config", write(tmp_path, ""), "--gpu", "maybe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--gpu" in r.stderr and "auto, off" in r.stderr
    assert "Traceback" not in r.stderr
