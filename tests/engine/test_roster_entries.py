"""ModelManager.add_entry / forget: roster entries added and removed without loading, saved to the config file."""
from __future__ import annotations

import asyncio

import pytest

from engine.config import ModelEntry, load
from engine.errors import Conflict, InvalidRequest
from engine.models.manager import ModelManager


@pytest.fixture
def roster(tmp_path):
    cfg_path = tmp_path / "llamadesk.toml"
    cfg_path.write_text('[[models]]\nname = "a"\npath = "/models/a.gguf"\ndefault = true\npreload = false\n')
    cfg = load(["--config", str(cfg_path), "--no-gui"])
    m = ModelManager(cfg, run=None, refuse_while_benching=lambda what: None)
    m.default_id = "a"
    return m, cfg_path


def _saved_names(path) -> list[str]:
    return [e.name for e in load(["--config", str(path), "--no-gui"]).models]


def test_add_entry_saves_without_loading_and_refuses_a_taken_name_or_a_bad_shape(roster):
    m, path = roster
    asyncio.run(m.add_entry(ModelEntry(name="b", path="/models/b.gguf", ctx=4096, preload=False)))
    assert _saved_names(path) == ["a", "b"] and not m.loaded and "b" in m.available()
    with pytest.raises(Conflict) as e:
        asyncio.run(m.add_entry(ModelEntry(name="a", path="/models/other.gguf")))
    assert "'a'" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(m.add_entry(ModelEntry(name="c", path="/models/c.gguf", streams=0)))
    assert e.value.param == "streams" and _saved_names(path) == ["a", "b"]


def test_forget_removes_the_entry_and_moves_the_default(roster):
    m, path = roster
    asyncio.run(m.add_entry(ModelEntry(name="b", path="/models/b.gguf", preload=False)))
    gone = asyncio.run(m.forget("a"))
    assert [e.name for e in gone] == ["a"] and m.default_id == "b" and _saved_names(path) == ["b"]
    assert asyncio.run(m.forget("nobody")) == [] and _saved_names(path) == ["b"]
