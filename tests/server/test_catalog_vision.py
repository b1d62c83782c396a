"""Vision towers wired on serve: a catalog entry whose mmproj tower is downloaded, and a Hugging Face pull with
its `mmproj-*.gguf` (tests/hubstandin.py), each serve SmolLM2 with tests/assets/mmproj_gguf.py's projector, and
an image request then answers through the openai client."""
from __future__ import annotations

import hashlib
import time

import openai
import pytest

from engine.config import load
from tests.assets import mmproj_gguf
from tests.conftest import LiveServer
from tests.engine.test_vision import data_url, gradient, image_part, text_part
from tests.fileserver import FileServer
from tests.http import call
from tests.hubstandin import HubStandIn, Repo

SMOL_REPO = "standin/SmolVision-GGUF"


def ask(srv: LiveServer, model: str, content):
    return srv.client().chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                                max_tokens=4, temperature=0)


def with_image(text: str = "What is this?") -> list[dict]:
    return [text_part(text), image_part(data_url(gradient()))]


@pytest.fixture()
def catalog_server(assets, tmp_path):
    model, tower = assets["smollm2"].read_bytes(), assets["mmproj"].read_bytes()
    files = FileServer(files={"mmproj-smol.gguf": tower})
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f'''
[[model]]
name = "smol"
kind = "llm"
family = "smollm2"
file = "smol.gguf"
url = "https://example.invalid/smol.gguf"
sha256 = "{hashlib.sha256(model).hexdigest()}"
size = {len(model)}
ctx = 2048
tool_format = "generic"
kv_bytes_per_token = 1024
towers = ["smol-mmproj"]

[[model]]
name = "smol-mmproj"
kind = "mmproj"
family = "smollm2"
file = "mmproj-smol.gguf"
url = "https://example.invalid/mmproj-smol.gguf"
sha256 = "{hashlib.sha256(tower).hexdigest()}"
size = {len(tower)}
''')
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(assets["smollm2"])  # downloaded earlier (present, not verified)
    srv = LiveServer(["--catalog-path", str(catalog), "--catalog-mirror", files.url, "--models-dir", str(models),
                      "--ctx", "1024", "--streams", "1", "--threads", "1"], "", tmp_path)
    srv.models_dir = models
    yield srv
    srv.stop()
    files.close()


def wait_for_download(srv: LiveServer, name: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        d = next(e for e in srv.get("/catalog")["entries"] if e["name"] == name)["download"]
        if d and d["status"] in ("done", "failed"):
            return d
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_serving_a_catalog_entry_wires_its_downloaded_vision_tower(catalog_server, tmp_path):
    srv = catalog_server
    status, body = call(srv, "POST", "/catalog/serve", {"name": "smol"})
    assert status == 200, body
    assert body["towers"] == [{"name": "smol-mmproj", "kind": "mmproj", "local": "absent", "wired": False}]
    with pytest.raises(openai.BadRequestError) as e:
        ask(srv, "smol", with_image())
    assert "has no vision" in e.value.message

    status, body = call(srv, "POST", "/catalog/download", {"name": "smol", "tower": "smol-mmproj"})
    assert status == 202, body
    assert wait_for_download(srv, "smol-mmproj")["status"] == "done"
    status, body = call(srv, "POST", "/catalog/serve", {"name": "smol"})  # loaded again, with the tower
    assert status == 200, body
    assert body["towers"] == [{"name": "smol-mmproj", "kind": "mmproj", "local": "verified", "wired": True}]
    out = ask(srv, "smol", with_image())
    plain = ask(srv, "smol", [text_part("What is this?")])
    assert out.choices[0].message.content
    assert out.usage.prompt_tokens == plain.usage.prompt_tokens + mmproj_gguf.N_POS

    saved = load(["--config", str(tmp_path / "llamadesk.toml")])  # the next start serves it with the tower too
    assert [(m.name, m.image_mmproj) for m in saved.models] == [("smol", str(srv.models_dir / "mmproj-smol.gguf"))]


@pytest.fixture(scope="module")
def hub_server(assets, tmp_path_factory):
    hub = HubStandIn({SMOL_REPO: Repo(files={"SmolVision-Q4_1.gguf": assets["smollm2"].read_bytes(),
                                             "mmproj-F16.gguf": assets["mmproj"].read_bytes()})})
    env = pytest.MonkeyPatch()
    env.setenv("HF_ENDPOINT", hub.url)
    env.delenv("HF_TOKEN", raising=False)
    env.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    tmp = tmp_path_factory.mktemp("hub-vision")
    srv = LiveServer(["--model", str(assets["tiny"]), "--models-dir", str(tmp / "models"), "--ctx", "1024",
                      "--streams", "1", "--threads", "1"], "", tmp)
    srv.models_dir = tmp / "models"
    yield srv
    srv.stop()
    hub.close()
    env.undo()


def pull(srv: LiveServer, spec: str, vision: bool) -> dict:
    status, body = call(srv, "POST", "/models/pull", {"model": spec, "vision": vision, "stream": False})
    assert status == 200, body
    return body


def test_serving_a_pulled_model_wires_the_tower_pulled_beside_it(hub_server):
    srv = hub_server
    done = pull(srv, SMOL_REPO, vision=True)
    assert done["model"] == "SmolVision-Q4_1"
    out = ask(srv, done["model"], with_image())  # loaded on demand, with its tower
    assert out.choices[0].message.content and out.usage.prompt_tokens > mmproj_gguf.N_POS
    listed = {p["model"]: p for p in srv.get("/catalog")["pulls"]}
    assert listed["SmolVision-Q4_1"]["vision"] == {"file": "mmproj-SmolVision-F16.gguf", "wired": True}
    assert "mmproj-SmolVision-F16" not in {m["id"] for m in srv.get("/v1/models")["data"]}


def test_a_model_pulled_without_its_tower_has_no_vision(hub_server):
    srv = hub_server
    (srv.models_dir / "Plain-Q4_1.gguf").symlink_to(srv.models_dir / "SmolVision-Q4_1.gguf")  # no pairing file
    with pytest.raises(openai.BadRequestError) as e:
        ask(srv, "Plain-Q4_1", with_image())
    assert "has no vision" in e.value.message
    status, body = call(srv, "POST", "/models/pull", {"model": SMOL_REPO, "stream": False})
    assert status == 200 and next(p for p in srv.get("/catalog")["pulls"] if p["spec"] == SMOL_REPO)["vision"] is None
