"""--rpc, --rpc-allow-lan and a roster entry's rpc: checked when the configuration loads."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import ConfigError, load


def _load(tmp_path: Path, argv: list[str], toml: str = "") -> object:
    path = tmp_path / "llamadesk.toml"
    path.write_text(toml)
    return load(["--config", str(path), *argv])


def test_loopback_rpc_servers_are_taken_and_split(tmp_path):
    cfg = _load(tmp_path, ["--model", "/m/a.gguf", "--rpc", "127.0.0.1:50052, localhost:50053,[::1]:7"])
    assert cfg.rpc_for(cfg.models[0]) == ("127.0.0.1:50052", "localhost:50053", "[::1]:7")


@pytest.mark.parametrize("address", ["192.168.1.20:50052", "gpu-box:50052", "10.0.0.2:1,127.0.0.1:2"])
def test_an_rpc_server_beyond_this_machine_is_refused_without_rpc_allow_lan(tmp_path, address):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, ["--rpc", address])
    assert "--rpc" in str(e.value) and "--rpc-allow-lan" in str(e.value) and "no authentication" in str(e.value)
    far = next(a for a in address.split(",") if not a.startswith("127."))
    assert far in str(e.value)


def test_rpc_allow_lan_accepts_them(tmp_path):
    cfg = _load(tmp_path, ["--model", "/m/a.gguf", "--rpc", "192.168.1.20:50052,gpu-box:1", "--rpc-allow-lan"])
    assert cfg.rpc_for(cfg.models[0]) == ("192.168.1.20:50052", "gpu-box:1")
    assert cfg.sources["rpc_allow_lan"] == "cli"


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:0", ":50052",
                                     "127.0.0.1:50052/x", "127.0.0.1:port", "127.0.0.1:1,,127.0.0.1:2"])
def test_a_malformed_address_is_a_clear_error(tmp_path, address):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, ["--rpc", address])
    assert "--rpc" in str(e.value) and ("host:port" in str(e.value) or "port" in str(e.value))


def test_a_roster_entry_takes_rpc_as_a_list_or_a_string_and_overrides_the_global_one(tmp_path):
    toml = """
[[models]]
name = "a"
path = "/m/a.gguf"
rpc = ["127.0.0.1:1", "127.0.0.1:2"]

[[models]]
name = "b"
path = "/m/b.gguf"
rpc = "127.0.0.1:3"

[[models]]
name = "c"
path = "/m/c.gguf"
rpc = []

[[models]]
name = "d"
path = "/m/d.gguf"
"""
    cfg = _load(tmp_path, ["--rpc", "127.0.0.1:9"], toml)
    assert [cfg.rpc_for(m) for m in cfg.models] == [("127.0.0.1:1", "127.0.0.1:2"), ("127.0.0.1:3",), (),
                                                    ("127.0.0.1:9",)]


@pytest.mark.parametrize("value, said", [('["10.1.1.1:5"]', "--rpc-allow-lan"), ('[5]', "host:port"),
                                         ('"nope"', "host:port"), ("5", "'rpc'")])
def test_a_roster_entry_rpc_is_checked_too(tmp_path, value, said):
    toml = f'[[models]]\nname = "a"\npath = "/m/a.gguf"\nrpc = {value}\n'
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, [], toml)
    assert said in str(e.value) and "[[models]] entry 1" in str(e.value)


def test_a_lan_roster_entry_is_taken_with_rpc_allow_lan_in_the_file(tmp_path):
    toml = 'rpc_allow_lan = true\n[[models]]\nname = "a"\npath = "/m/a.gguf"\nrpc = "10.1.1.1:5"\n'
    cfg = _load(tmp_path, [], toml)
    assert cfg.rpc_for(cfg.models[0]) == ("10.1.1.1:5",)


def test_rpc_is_no_key_of_a_remote_entry(tmp_path):
    toml = '[[models]]\nname = "r"\nbackend = "remote"\nurl = "http://127.0.0.1:1/v1"\nrpc = "127.0.0.1:5"\n'
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, [], toml)
    assert "'rpc' does not apply to a remote model" in str(e.value)


def test_the_rpc_option_checks_addresses_wherever_it_is_parsed():
    from engine.config import OPTIONS
    assert OPTIONS["rpc"].parse("127.0.0.1:5,10.0.0.1:6", "request") == "127.0.0.1:5,10.0.0.1:6"
    with pytest.raises(ConfigError) as e:
        OPTIONS["rpc"].parse("127.0.0.1", "request")
    assert "'rpc' (request)" in str(e.value) and "host:port" in str(e.value)
