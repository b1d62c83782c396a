"""A broken catalog file (catalog_path): the routes that read it answer a clear error naming the file and the
problem in their protocol's shape, and the server keeps serving everything else."""
from __future__ import annotations

import logging

import ollama
import pytest

from tests.conftest import LiveServer
from tests.http import call
# fixtures: the hub stand-in serving standin/Tiny-GGUF, and the ollama client of `server`
from tests.server.test_ollama_models import TINY, client, hub, tiny  # noqa: F401

BROKEN = '[[model]]\nname = "half"\nkind = "llm"\n'  # an entry without file, url, sha256 and size


@pytest.fixture(scope="module")
def server(assets, hub, tmp_path_factory):
    env = pytest.MonkeyPatch()
    env.setenv("HF_ENDPOINT", hub.url)
    env.delenv("HF_TOKEN", raising=False)
    env.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    tmp = tmp_path_factory.mktemp("broken-catalog")
    catalog = tmp / "catalog.toml"
    catalog.write_text(BROKEN)
    toml = f'[[models]]\nname = "base"\npath = "{assets["tiny"]}"\ndefault = true\n'
    srv = LiveServer(["--models-dir", str(tmp / "models"), "--catalog-path", str(catalog), "--ctx", "512",
                      "--streams", "1"], toml, tmp)
    srv.catalog_path = catalog
    srv.models_dir = tmp / "models"
    yield srv
    srv.stop()
    env.undo()


def _names_the_problem(message: str, server) -> bool:
    return str(server.catalog_path) in message and "missing keys" in message


def test_ollama_pull_answers_the_catalog_problem_in_ollamas_shape(server, client, caplog):
    with caplog.at_level(logging.WARNING, logger="llamadesk"):
        with pytest.raises(ollama.ResponseError) as e:
            client.pull("half", stream=False)
    assert e.value.status_code == 500 and _names_the_problem(e.value.error, server)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING and str(server.catalog_path) in r.getMessage()]
    assert said and not any(r.exc_info for r in caplog.records)  # told in a line, no traceback


def test_models_pull_answers_the_catalog_problem_in_openais_shape(server, client):
    status, out = call(server, "POST", "/models/pull", {"model": TINY, "stream": False})
    assert status == 500 and _names_the_problem(out["error"]["message"], server)
    assert out["error"]["type"] == "server_error"
    assert not list((server.models_dir).glob("*.gguf"))  # refused before any byte moved
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("hf.co/" + TINY, stream=False)
    assert e.value.status_code == 500 and _names_the_problem(e.value.error, server)


def test_the_server_keeps_serving_with_a_broken_catalog(server, client):
    reply = server.client().completions.create(model="base", prompt="hi", max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert [m.model for m in client.list().models] == ["base"]
    assert [m.id for m in server.client().models.list()] == ["base"]
    for method, path, body in (("GET", "/catalog", None), ("POST", "/catalog/download", {"name": "half"}),
                               ("POST", "/catalog/serve", {"name": "half"})):
        status, out = call(server, method, path, body)
        assert status == 500 and _names_the_problem(out["error"]["message"], server), path
    status, out = call(server, "POST", "/catalog/download", {"name": ""})
    assert status == 400 and out["error"]["param"] == "name"
