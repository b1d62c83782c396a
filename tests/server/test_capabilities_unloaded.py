"""/v1/models for roster entries not loaded yet, driven with the openai client: one whose entry names a vision
projector (image_mmproj) says "vision" before its first load, one without says only "completion"; a chat with an
image then loads the first on demand and is answered with the image's positions counted."""
from __future__ import annotations

import pytest

from tests.assets import mmproj_gguf
from tests.conftest import LiveServer
from tests.engine.test_vision import data_url, gradient, image_part, text_part


@pytest.fixture(scope="module")
def srv(assets, tmp_path_factory):
    entries = {"eyes": f'image_mmproj = "{assets["mmproj"]}"\n', "plain": ""}
    toml = "".join(f'[[models]]\nname = "{name}"\npath = "{assets["smollm2"]}"\nctx = 1024\nstreams = 1\n'
                   f'preload = false\n{extra}' for name, extra in entries.items())
    s = LiveServer(["--threads", "1"], toml, tmp_path_factory.mktemp("capabilities-unloaded"))
    yield s
    s.stop()


def _listed(srv: LiveServer) -> dict[str, dict]:
    return {m.id: m.model_dump() for m in srv.client().models.list()}


def test_an_unloaded_entry_with_a_projector_says_vision_and_one_without_does_not(srv):
    listed = _listed(srv)
    eyes, plain = listed["eyes"], listed["plain"]
    assert eyes["state"] == plain["state"] == "unloaded"
    assert eyes["capabilities"] == ["completion", "vision"] and eyes["vision"] is True
    assert plain["capabilities"] == ["completion"] and "vision" not in plain
    assert srv.client().models.retrieve("eyes").model_dump()["capabilities"] == eyes["capabilities"]


def test_an_image_sent_to_the_unloaded_vision_entry_loads_it_and_is_seen(srv):
    content = [text_part("What is this?"), image_part(data_url(gradient()))]
    out = srv.client().chat.completions.create(model="eyes", messages=[{"role": "user", "content": content}],
                                               max_tokens=4, temperature=0)
    assert out.usage.prompt_tokens >= mmproj_gguf.N_POS
    eyes = _listed(srv)["eyes"]
    assert eyes["state"] == "loaded" and "vision" in eyes["capabilities"]
