"""Completions details, the API key, and the README staying true to the CLI."""
from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

from engine.config import SCHEMA
from tests.conftest import LiveServer


def test_completion_echo_buffered_and_streamed(smol_server):
    client = smol_server.client()
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0,
                                  echo=True)
    assert r.choices[0].text.startswith("The capital of France is")
    s = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0,
                                  echo=True, stream=True)
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


def test_token_id_prompt_matches_text_prompt(smol_server):
    client = smol_server.client()
    text = client.completions.create(model="smollm2", prompt="Hello, my name is", max_tokens=6, temperature=0)
    # SmolLM2's tokens for "Hello, my name is" (no BOS: add_bos_token is false in its GGUF)
    ids = [19556, 28, 957, 1462, 314]
    toks = client.completions.create(model="smollm2", prompt=ids, max_tokens=6, temperature=0)
    assert toks.usage.prompt_tokens == 5
    assert toks.choices[0].text == text.choices[0].text


def test_api_key_protects_every_route(assets, tmp_path):
    srv = LiveServer(["--model", str(assets["tiny"]), "--api-key", "s3cret"], "", tmp_path)
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            srv.client().models.list()
        assert e.value.body["code"] == "invalid_api_key"
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0) as ok:
            assert ok.models.list().data[0].id == "tiny-random-llama"
    finally:
        srv.stop()


def test_readme_documents_every_flag():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = set(re.findall(r"^\| `(--[a-z-]+)`", readme, re.M))
    assert table == {o.flag for o in SCHEMA}


def test_cors_allowlist(assets, tmp_path):
    import urllib.error
    import urllib.request
    srv = LiveServer(["--model", str(assets["tiny"]), "--cors-origins", "http://app.example, http://b.example",
                      "--api-key", "k"], "", tmp_path)
    try:
        pre = urllib.request.Request(srv.url + "/v1/chat/completions", method="OPTIONS", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        with urllib.request.urlopen(pre) as r:  # the preflight needs no API key
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert "DELETE" in r.headers["Access-Control-Allow-Methods"]  # DELETE /v1/responses/{id}
        ok = urllib.request.Request(srv.url + "/health", headers={"Origin": "http://b.example",
                                                                  "Authorization": "Bearer k"})
        with urllib.request.urlopen(ok) as r:
            assert r.headers["Access-Control-Allow-Origin"] == "http://b.example"
        other = urllib.request.Request(srv.url + "/health", headers={"Origin": "http://evil.example",
                                                                     "Authorization": "Bearer k"})
        with pytest.raises(urllib.error.HTTPError) as refused:  # any other web page: refused before any work
            urllib.request.urlopen(other)
        assert refused.value.code == 403 and "Access-Control-Allow-Origin" not in refused.value.headers
        refused.value.close()
    finally:
        srv.stop()
