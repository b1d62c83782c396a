"""Any GGUF from Hugging Face, against a local stand-in of the hub's API (tests/hubstandin.py): search, a repo's
files with quant / size / fit, pull (default quant, :QUANT, /file.gguf), resumable and verified against the LFS
sha256, split sets, the vision tower, gated repos and tokens; the pulled model is served by name."""
from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.conftest import LiveServer
from tests.fileserver import Faults
from tests.http import call
from tests.hubstandin import HubStandIn, Repo, split_gguf

TINY = "standin/Tiny-GGUF"
PB = 2 ** 50  # a size no box has memory for


@pytest.fixture(scope="module")
def hub(assets, tmp_path_factory):
    tiny = assets["tiny"].read_bytes()
    parts = split_gguf(assets["tiny"], tmp_path_factory.mktemp("split") / "tiny-split-Q4_0.gguf")
    vision = hashlib.sha256(b"a vision tower").digest() * 128
    repos = {
        TINY: Repo(files={"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": tiny, "README.md": b"# tiny\n",
                          "mmproj-F16.gguf": vision, "mmproj-Q8_0.gguf": vision[:2048],
                          "split/tiny-split-Q4_0-00001-of-00002.gguf": parts[0].read_bytes(),
                          "split/tiny-split-Q4_0-00002-of-00002.gguf": parts[1].read_bytes(),
                          "broken/broken-Q2_K-00001-of-00003.gguf": b"only the first part"},
                   downloads=900, likes=7),
        "standin/tiny-safetensors": Repo(files={"model.safetensors": b"x"}, tags=["safetensors"], downloads=5000),
        "standin/TinyLlama-GGUF": Repo(files={"tinyllama-Q2_K.gguf": tiny, "tinyllama-Q4_K_M.gguf": tiny},
                                       reported_size={"tinyllama-Q4_K_M.gguf": PB}, downloads=30),
        "standin/Huge-GGUF": Repo(files={"huge-Q4_K_M.gguf": tiny}, reported_size={"huge-Q4_K_M.gguf": PB}),
        "standin/Gated-GGUF": Repo(files={"gated-Q4_K_M.gguf": tiny}, gated=True, downloads=3),
        "standin/Gated2-GGUF": Repo(files={"gated2-Q4_K_M.gguf": tiny}, gated=True),
        "standin/Bad-GGUF": Repo(files={"bad-Q4_K_M.gguf": tiny}, reported_sha256={"bad-Q4_K_M.gguf": "0" * 64}),
        "standin/Resume-GGUF": Repo(files={"resume-Q4_K_M.gguf": tiny}),
        "standin/Slow-GGUF": Repo(files={"slow-Q4_K_M.gguf": tiny}),
        "standin/Paged-GGUF": Repo(files={f"paged-{q}.gguf": tiny[:1000] for q in
                                          ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K")}, page_size=2),
    }
    srv = HubStandIn(repos)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def server(hub, assets, tmp_path_factory):
    env = pytest.MonkeyPatch()
    env.setenv("HF_ENDPOINT", hub.url)
    env.delenv("HF_TOKEN", raising=False)
    env.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))  # no token file of this machine's user
    tmp = tmp_path_factory.mktemp("hub-server")
    srv = LiveServer(["--model", str(assets["tiny"]), "--models-dir", str(tmp / "models"), "--ctx", "512",
                      "--streams", "2"], "", tmp)
    srv.models_dir = tmp / "models"
    yield srv
    srv.stop()
    env.undo()


def get(srv, path: str, **query) -> tuple[int, dict]:
    return call(srv, "GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))


def pull(srv, body: dict) -> tuple[int, list[dict]]:
    """POST /models/pull, its NDJSON lines parsed (or the error body as the one line)."""
    req = urllib.request.Request(srv.url + "/models/pull", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            if not body.get("stream", True):
                return r.status, [json.loads(r.read())]
            assert r.headers.get_content_type() == "application/x-ndjson"
            return r.status, [json.loads(line) for line in r if line.strip()]
    except urllib.error.HTTPError as e:
        with e:
            return e.code, [json.loads(e.read())]


def chat(srv, model: str):
    # ignore_eos: the random tiny model may otherwise end its reply at the very first token
    return srv.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, extra_body={"ignore_eos": True})


def test_search_lists_gguf_repos_most_downloaded_first(server, hub):
    status, body = get(server, "/models/search", q="tiny")
    assert status == 200, body
    ids = [m["id"] for m in body["models"]]
    assert ids == [TINY, "standin/TinyLlama-GGUF"]  # the safetensors repo is no GGUF repo
    assert body["models"][0]["downloads"] == 900 and body["models"][0]["likes"] == 7
    assert "gguf" in body["models"][0]["tags"] and body["endpoint"] == hub.url
    asked = [r for r in hub.requests if r["path"] == "/api/models"][-1]["query"]
    assert asked["filter"] == "gguf" and asked["search"] == "tiny"
    status, body = get(server, "/models/search", q="GGUF", limit="2")
    assert status == 200 and len(body["models"]) == 2 and body["models"][0]["id"] == TINY


def test_files_lists_quants_sizes_fit_split_sets_and_the_vision_tower(server, hub):
    status, body = get(server, "/models/files", repo=TINY)
    assert status == 200, body
    models = {m["path"]: m for m in body["models"]}
    assert set(models) == {"tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "split/tiny-split-Q4_0-00001-of-00002.gguf"}
    split = models["split/tiny-split-Q4_0-00001-of-00002.gguf"]
    sizes = [len(hub.repos[TINY].files[p["path"]]) for p in split["parts"]]
    assert split["quant"] == "Q4_0" and len(sizes) == 2 and split["size"] == sum(sizes)
    assert split["pull"] == f"{TINY}:Q4_0"
    q4 = models["tiny-Q4_K_M.gguf"]
    assert (q4["quant"], q4["size"], q4["fit"], q4["default"]) == ("Q4_K_M", len(hub.repos[TINY].files[
        "tiny-Q4_K_M.gguf"]), "fits", True)
    assert q4["memory_needed"] > q4["size"] and not models["tiny-Q8_0.gguf"]["default"]
    assert [(t["path"], t["default"]) for t in body["vision"]] == [("mmproj-F16.gguf", True),
                                                                   ("mmproj-Q8_0.gguf", False)]
    assert body["incomplete"] == ["broken/broken-Q2_K (1 of 3 parts)"]

    # the quant a default pull takes is one that fits: here not Q4_K_M, which would need a petabyte
    status, body = get(server, "/models/files", repo="standin/TinyLlama-GGUF")
    fits = {m["quant"]: (m["fit"], m["default"]) for m in body["models"]}
    assert fits == {"Q2_K": ("fits", True), "Q4_K_M": ("too big", False)}

    status, body = get(server, "/models/files", repo="standin/Paged-GGUF")  # a tree of three pages
    assert status == 200 and len(body["models"]) == 5
    assert sum(r["path"] == "/api/models/standin/Paged-GGUF/tree/main" for r in hub.requests) == 3


def test_pull_default_quant_streams_progress_verifies_and_is_served_by_name(server, hub):
    assert not (server.models_dir / "tiny-Q4_K_M.gguf").exists()
    status, lines = pull(server, {"model": TINY})
    assert status == 200, lines
    sha = hub.sha256(TINY, "tiny-Q4_K_M.gguf")
    assert lines[0]["status"] == "pulling manifest" and lines[0]["files"] == ["tiny-Q4_K_M.gguf"]
    statuses = [line["status"] for line in lines]
    assert "pulling tiny-Q4_K_M.gguf" in statuses and "verifying sha256 digest" in statuses
    assert {line["digest"] for line in lines if "digest" in line} == {f"sha256:{sha}"}
    done = lines[-1]
    assert done["status"] == "success" and (done["model"], done["quant"]) == ("tiny-Q4_K_M", "Q4_K_M")
    path = server.models_dir / "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == hub.repos[TINY].files["tiny-Q4_K_M.gguf"]
    assert (server.models_dir / "tiny-Q4_K_M.gguf.sha256").read_text().split()[0] == sha
    pulls = {p["model"]: p for p in server.get("/catalog")["pulls"]}
    assert pulls["tiny-Q4_K_M"]["status"] == "done" and pulls["tiny-Q4_K_M"]["completed"] == path.stat().st_size

    listed = {m["id"]: m for m in server.get("/v1/models")["data"]}
    assert listed["tiny-Q4_K_M"]["state"] == "unloaded"
    r = chat(server, "tiny-Q4_K_M")  # loaded on demand by its name
    assert r.model == "tiny-Q4_K_M" and r.usage.completion_tokens == 4


def test_explicit_quant_and_file_forms(server, hub):
    status, lines = pull(server, {"model": f"hf.co/{TINY}:q8_0", "stream": False})
    assert status == 200, lines
    assert (lines[0]["status"], lines[0]["quant"], lines[0]["model"]) == ("success", "Q8_0", "tiny-Q8_0")
    assert (server.models_dir / "tiny-Q8_0.gguf").exists()

    fetched = len(hub.fetched(TINY, "tiny-Q8_0.gguf"))
    status, lines = pull(server, {"model": f"{TINY}/tiny-Q8_0.gguf"})  # already here and verified: no download
    assert status == 200 and lines[-1]["status"] == "success" and lines[-1]["quant"] == "Q8_0"
    assert len(hub.fetched(TINY, "tiny-Q8_0.gguf")) == fetched


def test_a_cut_download_resumes_with_a_range_request(server, hub):
    repo, path = "standin/Resume-GGUF", "resume-Q4_K_M.gguf"
    hub.faults[f"{repo}/{path}"] = Faults(cut_at=200_000)
    status, lines = pull(server, {"model": f"{repo}:Q4_K_M"})
    assert status == 200 and lines[-1]["status"] == "success", lines[-1]
    fetches = hub.fetched(repo, path)
    # the second fetch resumes from what reached the disk: at most the 200,000 bytes sent before the cut (aiohttp
    # may drop the last chunk it had not handed over yet), never from 0
    assert [(f["range"] is None, f["status"]) for f in fetches] == [(True, 200), (False, 206)]
    start = int(fetches[1]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= 200_000
    assert (server.models_dir / path).read_bytes() == hub.repos[repo].files[path]


def test_a_wrong_sha256_is_refused_and_the_file_not_kept(server):
    status, lines = pull(server, {"model": "standin/Bad-GGUF"})
    assert status == 200  # the failure came after the stream began: its last line says why
    err = lines[-1]["error"]
    assert "sha256 mismatch" in err["message"] and "bad-Q4_K_M.gguf" in err["message"]
    assert err["type"] == "server_error" and err["code"] == "upstream_error"
    assert not list(server.models_dir.glob("bad-Q4_K_M*"))  # neither the file, its .part nor a .sha256
    assert "bad-Q4_K_M" not in {m["id"] for m in server.get("/v1/models")["data"]}
    pulls = {p["spec"]: p for p in server.get("/catalog")["pulls"]}
    assert pulls["standin/Bad-GGUF"]["status"] == "failed" and "sha256" in pulls["standin/Bad-GGUF"]["error"]

    status, lines = pull(server, {"model": "standin/Bad-GGUF", "stream": False})
    assert status == 502 and "sha256 mismatch" in lines[0]["error"]["message"]


def test_a_gated_repo_needs_the_token(server, hub, monkeypatch):
    status, lines = pull(server, {"model": "standin/Gated-GGUF"})
    err = lines[0]["error"]
    assert status == 401 and err["code"] == "upstream_unauthorized", lines
    assert "HF_TOKEN" in err["message"] and "401" in err["message"] and "standin/Gated-GGUF" in err["message"]
    assert not list(server.models_dir.glob("gated-*"))
    assert get(server, "/models/files", repo="standin/Gated-GGUF")[0] == 200  # its file list is public

    monkeypatch.setenv("HF_TOKEN", "hf_not_the_token")
    status, lines = pull(server, {"model": "standin/Gated-GGUF"})
    assert status == 401 and "403" in lines[0]["error"]["message"] and "no access" in lines[0]["error"]["message"]

    monkeypatch.setenv("HF_TOKEN", hub.token)
    status, lines = pull(server, {"model": "standin/Gated-GGUF"})
    assert status == 200 and lines[-1]["status"] == "success", lines[-1]
    fetch = [r for r in hub.requests if r["path"] == "/standin/Gated-GGUF/resolve/main/gated-Q4_K_M.gguf"][-1]
    assert fetch["auth"] == f"Bearer {hub.token}"
    assert hub.fetched("standin/Gated-GGUF", "gated-Q4_K_M.gguf")[-1]["auth"] is None  # not sent on to the CDN
    assert chat(server, "gated-Q4_K_M").usage.completion_tokens == 4


def test_the_token_may_come_from_the_config_and_config_does_not_show_it(server, hub, assets, tmp_path):
    other = LiveServer(["--model", str(assets["tiny"]), "--models-dir", str(tmp_path / "models"),
                        "--hf-token", hub.token], "", tmp_path)
    try:
        status, lines = pull(other, {"model": "standin/Gated2-GGUF", "stream": False})
        assert status == 200 and lines[0]["model"] == "gated2-Q4_K_M", lines
        assert get(other, "/config")[1]["keys"]["hf_token"]["value"] == "***"
    finally:
        other.stop()


def test_a_split_gguf_is_pulled_as_a_set_and_served(server, hub):
    status, lines = pull(server, {"model": f"{TINY}/split/tiny-split-Q4_0-00002-of-00002.gguf"})  # any part names the set
    assert status == 200 and lines[-1]["status"] == "success", lines[-1]
    names = ["tiny-split-Q4_0-00001-of-00002.gguf", "tiny-split-Q4_0-00002-of-00002.gguf"]
    assert [f["file"] for f in lines[-1]["files"]] == names and lines[0]["files"] == names
    for n in names:
        assert (server.models_dir / n).read_bytes() == hub.repos[TINY].files[f"split/{n}"]
    model = lines[-1]["model"]
    assert model == "tiny-split-Q4_0-00001-of-00002"
    ids = {m["id"] for m in server.get("/v1/models")["data"]}
    assert model in ids and "tiny-split-Q4_0-00002-of-00002" not in ids
    assert chat(server, model).usage.completion_tokens == 4  # llama.cpp found the second part beside the first


def test_the_vision_tower_is_pulled_beside_the_model(server, hub):
    status, lines = pull(server, {"model": f"{TINY}:Q4_K_M", "vision": True, "stream": False})
    assert status == 200, lines
    tower = [f for f in lines[0]["files"] if f["kind"] == "mmproj"]
    assert [(f["file"], f["path"]) for f in tower] == [("mmproj-Tiny-F16.gguf", "mmproj-F16.gguf")]
    assert (server.models_dir / "mmproj-Tiny-F16.gguf").read_bytes() == hub.repos[TINY].files["mmproj-F16.gguf"]
    assert "mmproj-Tiny-F16" not in {m["id"] for m in server.get("/v1/models")["data"]}

    status, lines = pull(server, {"model": f"{TINY}/mmproj-F16.gguf"})
    assert status == 400 and lines[0]["error"]["param"] == "model" and "vision" in lines[0]["error"]["message"]
    status, lines = pull(server, {"model": "standin/Resume-GGUF", "vision": True})
    assert status == 400 and lines[0]["error"]["param"] == "vision"


def test_a_second_pull_of_the_same_file_is_a_409_and_cancel_ends_the_first(server, hub):
    repo, path = "standin/Slow-GGUF", "slow-Q4_K_M.gguf"
    hub.faults[f"{repo}/{path}"] = Faults(throttle_bps=64 * 1024)
    lines: list[dict] = []
    first = threading.Thread(target=lambda: lines.extend(pull(server, {"model": repo})[1]))
    first.start()
    deadline = time.monotonic() + 60
    while not any(p["spec"] == repo and p["completed"] for p in server.get("/catalog")["pulls"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status, body = pull(server, {"model": f"{repo}:Q4_K_M"})
    assert status == 409 and body[0]["error"]["code"] == "conflict"
    assert call(server, "POST", "/catalog/cancel", {"name": f"{repo}/{path}"})[1]["cancelled"]
    first.join(60)
    assert "cancelled" in lines[-1]["error"]["message"]
    assert not (server.models_dir / path).exists()


@pytest.mark.parametrize("path, query, param", [
    ("/models/search", {}, "q"),
    ("/models/search", {"q": ""}, "q"),
    ("/models/search", {"q": "tiny", "limit": "lots"}, "limit"),
    ("/models/search", {"q": "tiny", "limit": "0"}, "limit"),
    ("/models/search", {"q": "tiny", "limit": "101"}, "limit"),
    ("/models/files", {}, "repo"),
    ("/models/files", {"repo": "no-owner"}, "repo"),
    ("/models/files", {"repo": f"{TINY}:Q4_K_M"}, "repo"),
    ("/models/files", {"repo": "a/b c"}, "repo"),
])
def test_malformed_queries_are_400s_naming_the_field(server, path, query, param):
    status, body = get(server, path, **query)
    assert status == 400 and body["error"]["param"] == param, body
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({}, "model"),
    ({"model": 5}, "model"),
    ({"model": ""}, "model"),
    ({"model": "just-a-name"}, "model"),
    ({"model": f"{TINY}/notes.txt"}, "model"),
    ({"model": f"{TINY}/../x.gguf"}, "model"),
    ({"model": f"{TINY}:Q4 K"}, "model"),
    ({"model": TINY, "stream": "yes"}, "stream"),
    ({"model": TINY, "vision": 1}, "vision"),
])
def test_malformed_pulls_are_400s_naming_the_field(server, body, param):
    status, lines = pull(server, body)
    assert status == 400 and lines[0]["error"]["param"] == param, lines


def test_what_the_hub_does_not_have_is_a_404_naming_model(server):
    status, lines = pull(server, {"model": "standin/No-Such-GGUF"})
    assert status == 404 and lines[0]["error"]["param"] == "model" and "No-Such-GGUF" in lines[0]["error"]["message"]
    status, lines = pull(server, {"model": f"{TINY}:Q3_K_S"})
    assert status == 404 and "Q4_K_M" in lines[0]["error"]["message"]  # it says what the repo has
    status, lines = pull(server, {"model": f"{TINY}/nope-Q4_K_M.gguf"})
    assert status == 404 and lines[0]["error"]["param"] == "model"
    assert get(server, "/models/files", repo="standin/No-Such-GGUF")[0] == 404
    status, lines = pull(server, {"model": "standin/Huge-GGUF"})  # nothing in it fits: say so, name the way out
    assert status == 503 and "standin/Huge-GGUF:QUANT" in lines[0]["error"]["message"]
    assert server.get("/health")["status"] == "ok"


def test_a_pull_body_must_be_json(server):
    req = urllib.request.Request(server.url + "/models/pull", data=json.dumps({"model": TINY}).encode(),
                                 method="POST", headers={"Content-Type": "text/plain"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    with e.value:
        assert e.value.code == 415 and json.loads(e.value.read())["error"]["code"] == "unsupported_media_type"
