"""Ollama's model management (/api/pull, /api/copy, /api/create, /api/delete) on the roster, driven by the official
`ollama` client: pulls from a local stand-in of the Hugging Face hub (tests/hubstandin.py) and from the catalog
(a local mirror), then list, show and chat on what was pulled, copied and created, and delete."""
from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import ollama
import pytest

from engine.config import load
from tests.conftest import LiveServer
from tests.fileserver import FileServer
from tests.http import call
from tests.hubstandin import HubStandIn, Repo

TINY = "standin/Tiny-GGUF"
HI = [{"role": "user", "content": "hi"}]
FEW = {"num_predict": 3, "temperature": 0}
# a Jinja chat template whose rendering is easy to recognise
TEMPLATE = ("{% for m in messages %}<<{{ m.role }}>>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<<assistant>>{% endif %}")


@pytest.fixture(scope="module")
def tiny(assets) -> bytes:
    return assets["tiny"].read_bytes()


@pytest.fixture(scope="module")
def hub(tiny):
    srv = HubStandIn({TINY: Repo(files={"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": tiny}),
                      "standin/Gated-GGUF": Repo(files={"gated-Q4_K_M.gguf": tiny}, gated=True)})
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def mirror(tiny):
    srv = FileServer(files={"tiny-cat.gguf": tiny})
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def server(hub, mirror, tiny, assets, tmp_path_factory):
    """The tiny model as "base" (its file outside models_dir), the hub stand-in as HF_ENDPOINT, and a catalog of
    one language model ("tiny-cat", from the mirror) and one voice."""
    env = pytest.MonkeyPatch()
    env.setenv("HF_ENDPOINT", hub.url)
    env.delenv("HF_TOKEN", raising=False)
    env.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    tmp = tmp_path_factory.mktemp("ollama-models")
    catalog = tmp / "catalog.toml"
    catalog.write_text(f'''
[[model]]
name = "tiny-cat"
kind = "llm"
family = "test"
file = "tiny-cat.gguf"
url = "https://example.invalid/tiny-cat.gguf"
sha256 = "{hashlib.sha256(tiny).hexdigest()}"
size = {len(tiny)}
ctx = 8192
tool_format = "generic"
kv_bytes_per_token = 1024

[[model]]
name = "voice"
kind = "tts"
family = "piper"
file = "voice.tar.bz2"
archive = "tar.bz2"
url = "https://example.invalid/voice.tar.bz2"
sha256 = "{"0" * 64}"
size = 1000
''')
    toml = f'[[models]]\nname = "base"\npath = "{assets["tiny"]}"\ndefault = true\n'
    srv = LiveServer(["--models-dir", str(tmp / "models"), "--catalog-path", str(catalog), "--catalog-mirror",
                      mirror.url, "--ctx", "512", "--streams", "2"], toml, tmp)
    srv.models_dir = tmp / "models"
    srv.config_path = tmp / "llamadesk.toml"
    yield srv
    srv.stop()
    env.undo()


@pytest.fixture(scope="module")
def client(server):
    c = ollama.Client(host=server.url, timeout=120)
    yield c
    c._client.close()


def names(client) -> list[str]:
    return [m.model for m in client.list().models]


def roster(server) -> dict[str, dict]:
    """The roster as the saved config file holds it (name -> its keys)."""
    cfg = load(["--config", str(server.config_path)])
    return {m.name: {"path": m.path, "ctx": m.ctx, "chunk": m.chunk, "chat_template": m.chat_template}
            for m in cfg.models}


def refused(fn, *args, **kw) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as e:
        fn(*args, **kw)
    return e.value


def post_lines(server, path: str, body: dict) -> tuple[int, list[dict]]:
    """POST body; the NDJSON lines (or the one JSON object) of the answer."""
    status, out = call(server, "POST", path, body)
    if isinstance(out, str):
        return status, [json.loads(line) for line in out.splitlines() if line.strip()]
    return status, [out]


# ---- pull ----------------------------------------------------------------------------------------------------

def test_a_hugging_face_pull_streams_ollamas_progress_then_serves_the_name_it_was_pulled_by(client, server, hub):
    data = hub.repos[TINY].files["tiny-Q8_0.gguf"]
    parts = list(client.pull(f"hf.co/{TINY}:Q8_0", stream=True))
    statuses = [p.status for p in parts]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    downloading = [p for p in parts if p.status.startswith("downloading")]
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert downloading and all(p.digest == digest and p.total == len(data) for p in downloading), downloading
    assert downloading[-1].completed == len(data) and statuses.index("verifying sha256 digest") > statuses.index(
        downloading[-1].status)
    assert (server.models_dir / "tiny-Q8_0.gguf").read_bytes() == data

    listed = names(client)
    assert f"hf.co/{TINY}:Q8_0" in listed and "tiny-Q8_0" not in listed  # the file once, by the pulled name
    r = client.chat(model=f"hf.co/{TINY}:Q8_0", messages=HI, stream=False, options=FEW)
    assert r.done and r.model == f"hf.co/{TINY}:Q8_0" and r.eval_count >= 1
    assert client.show(f"hf.co/{TINY}:Q8_0").details.format == "gguf"
    assert roster(server)[f"hf.co/{TINY}:Q8_0"]["path"] == str(server.models_dir / "tiny-Q8_0.gguf")


def test_a_pull_without_a_tag_takes_the_default_quant_as_latest(client, server):
    r = client.pull(f"hf.co/{TINY}", stream=False)
    assert r.status == "success"
    status, lines = post_lines(server, "/api/pull", {"model": f"hf.co/{TINY}", "stream": False})
    assert status == 200 and lines == [{"status": "success", "model": f"hf.co/{TINY}:latest"}]
    assert f"hf.co/{TINY}:latest" in names(client)
    assert (server.models_dir / "tiny-Q4_K_M.gguf").exists()  # Q4_K_M: the default pick
    r = client.chat(model=f"hf.co/{TINY}", messages=HI, stream=False, options=FEW)  # the tag is optional
    assert r.done and r.model == f"hf.co/{TINY}:latest"


def test_a_catalog_entry_is_pulled_by_its_name_through_the_catalogs_downloader(client, server, mirror, tiny):
    parts = list(client.pull("tiny-cat", stream=True))
    statuses = [p.status for p in parts]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    assert all(p.digest == f"sha256:{hashlib.sha256(tiny).hexdigest()}" for p in parts[1:-1])
    entry = next(e for e in server.get("/catalog")["entries"] if e["name"] == "tiny-cat")
    assert entry["local"]["state"] == "verified"
    fetched = len(mirror.requests)
    assert client.pull("tiny-cat:latest").status == "success"  # on disk already: nothing fetched again
    assert len(mirror.requests) == fetched
    r = client.chat(model="tiny-cat:latest", messages=HI, stream=False, options=FEW)
    assert r.done and r.model == "tiny-cat"


@pytest.mark.parametrize("name, status, words", [
    ("hf.co/standin/Nope-GGUF", 404, "standin/Nope-GGUF"),
    (f"hf.co/{TINY}:Q3_K_S", 404, "Q3_K_S"),
    ("hf.co/standin/Gated-GGUF", 401, "gated"),
    ("no-such-entry", 404, "no-such-entry"),
    ("voice", 400, "tts"),
    (f"{TINY}/notes.txt", 400, "repo/file.gguf"),
])
def test_a_pull_that_cannot_start_is_refused_in_ollamas_error_shape(client, name, status, words):
    e = refused(client.pull, name)
    assert e.status_code == status and words in e.error, e.error


@pytest.mark.parametrize("body, words", [({}, "'model' is required"), ({"model": 5}, "'model' must be a string"),
                                         ({"model": TINY, "stream": "yes"}, "stream"),
                                         ({"model": TINY, "insecure": 1}, "insecure")])
def test_a_malformed_pull_body_is_a_400(server, body, words):
    status, out = call(server, "POST", "/api/pull", body)
    assert status == 400 and words in out["error"], out


# ---- copy ----------------------------------------------------------------------------------------------------

def test_copy_adds_a_roster_name_for_the_same_model(client, server, assets):
    assert client.copy("base", "base-copy").status == "success"
    assert {"base", "base-copy"} <= set(names(client))
    saved = roster(server)
    assert saved["base-copy"]["path"] == saved["base"]["path"] == str(assets["tiny"])
    r = client.chat(model="base-copy", messages=HI, stream=False, options=FEW)
    assert r.done and r.model == "base-copy"
    assert refused(client.copy, "base", "base-copy").status_code == 409
    assert refused(client.copy, "nope", "other").status_code == 404
    e = refused(client.copy, "base", "bad name")
    assert e.status_code == 400 and "destination" in e.error


# ---- create --------------------------------------------------------------------------------------------------

def test_create_makes_a_model_with_its_own_template_and_context(client, server):
    r = client.create(model="base-custom", from_="base", template=TEMPLATE, parameters={"num_ctx": 256,
                                                                                       "num_batch": 64})
    assert r.status == "success" and "base-custom" in names(client)
    shown = client.show("base-custom")  # loads it
    assert shown.template == TEMPLATE and "num_ctx 256" in shown.parameters and "num_batch 64" in shown.parameters
    status, out = call(server, "POST", "/apply-template", {"model": "base-custom", "messages": HI})
    assert status == 200 and out["prompt"] == "<<user>>hi\n<<assistant>>"
    listed = {m["id"]: m for m in server.get("/v1/models")["data"]}
    assert listed["base-custom"]["ctx"] == 256 and listed["base-custom"]["chunk"] == 64
    assert client.chat(model="base-custom", messages=HI, stream=False, options=FEW).done
    saved = roster(server)["base-custom"]
    assert (saved["ctx"], saved["chunk"]) == (256, 64)
    assert saved["chat_template"].startswith(str(server.models_dir / "templates"))
    streamed = list(client.create(model="base-streamed", from_="base-custom", stream=True))
    assert [p.status for p in streamed] == ["success"]
    assert client.show("base-streamed").template == TEMPLATE  # what it came from, kept


@pytest.mark.parametrize("extra, status, words", [
    ({"system": "Be brief."}, 400, "'system'"),
    ({"parameters": {"temperature": 0.2}}, 400, "parameters.temperature"),
    ({"parameters": {"num_ctx": 10}}, 400, "parameters.num_ctx"),
    ({"parameters": {"num_ctx": "big"}}, 400, "parameters.num_ctx"),
    ({"template": "{{ .System }} {{ .Prompt }}"}, 400, "Jinja"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "'messages'"),
    ({"files": {"model.gguf": "sha256:00"}}, 400, "'files'"),
    ({"adapters": {"lora.gguf": "sha256:00"}}, 400, "'adapters'"),
    ({"quantize": "q4_K_M"}, 400, "'quantize'"),
    ({"from": "nope"}, 404, "nope"),
    ({"model": "base"}, 409, "already exists"),
    ({"model": "two words"}, 400, "'model'"),
])
def test_create_refuses_what_no_roster_key_holds(server, extra, status, words):
    body = {"model": "refused", "from": "base", "stream": False, **extra}
    got, out = call(server, "POST", "/api/create", body)
    assert got == status and words in out["error"], out
    assert "refused" not in roster(server)


# ---- delete --------------------------------------------------------------------------------------------------

def test_delete_removes_the_roster_entry_and_only_the_files_that_were_ours(client, server, assets):
    models = server.models_dir
    client.copy("base", "doomed-copy")
    client.create(model="doomed-custom", from_="base", template=TEMPLATE)
    template = roster(server)["doomed-custom"]["chat_template"]
    client.pull(f"hf.co/{TINY}:Q8_0")
    client.chat(model=f"hf.co/{TINY}:Q8_0", messages=HI, stream=False, options=FEW)  # loaded when deleted
    assert (models / "tiny-Q8_0.gguf.sha256").exists()

    assert client.delete("doomed-copy").status == "success"
    assert "doomed-copy" not in names(client) and "doomed-copy" not in roster(server)
    assert assets["tiny"].exists() and client.chat(model="base", messages=HI, stream=False, options=FEW).done

    client.delete("doomed-custom")
    assert "doomed-custom" not in roster(server) and not Path(template).exists()

    status, out = call(server, "DELETE", "/api/delete", {"model": f"hf.co/{TINY}:Q8_0"})
    assert status == 200 and out["files_removed"] == [str((models / "tiny-Q8_0.gguf").resolve())], out
    assert not (models / "tiny-Q8_0.gguf").exists() and not (models / "tiny-Q8_0.gguf.sha256").exists()
    assert refused(client.chat, model=f"hf.co/{TINY}:Q8_0", messages=HI, stream=False).status_code == 404

    client.pull("tiny-cat")
    client.delete("tiny-cat:latest")
    assert not (models / "tiny-cat.gguf").exists()
    assert next(e for e in server.get("/catalog")["entries"] if e["name"] == "tiny-cat")["local"]["state"] == "absent"

    assert refused(client.delete, "nope").status_code == 404
    client.pull(f"hf.co/{TINY}")  # tiny-Q4_K_M.gguf, served as hf.co/standin/Tiny-GGUF:latest
    e = refused(client.delete, "tiny-Q4_K_M")  # its file is that entry's: not deleted under it
    assert e.status_code == 409 and f"hf.co/{TINY}:latest" in e.error
    assert (models / "tiny-Q4_K_M.gguf").exists()


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/api/pull", {"model": f"hf.co/{TINY}:Q8_0"}),
    ("POST", "/api/copy", {"source": "base", "destination": "x"}),
    ("POST", "/api/create", {"model": "x", "from": "base"}), ("DELETE", "/api/delete", {"model": "base"})])
def test_a_web_page_cannot_manage_models(server, method, path, body):
    """The routes that change the roster or the disk pass the Host/Origin guard first (and are loopback-only)."""
    before = roster(server)
    req = urllib.request.Request(server.url + path, method=method, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Origin": "http://evil.example"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    with e.value as r:
        assert r.code == 403 and "evil.example" in json.loads(r.read())["error"]
    assert roster(server) == before
