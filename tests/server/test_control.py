"""llamadesk's control routes: Prometheus metrics, roster load/unload/activate, /config."""
from __future__ import annotations

import re

import openai
import pytest

from engine.config import load
from tests.http import call


def test_metrics_match_stats(tiny_server):
    tiny_server.client().chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3)
    status, text = call(tiny_server, "GET", "/metrics")
    stats = tiny_server.get("/v1/stats")
    assert status == 200 and "# TYPE llamadesk_gen_tokens_total counter" in text
    gen = int(re.search(r'^llamadesk_gen_tokens_total\{model="tiny-random-llama"\} (\d+)$', text, re.M).group(1))
    assert 0 < gen <= stats["gen_tokens"]
    assert re.search(r'^llamadesk_ttft_ms\{model="tiny-random-llama",stat="p95"\} [\d.]+$', text, re.M)
    assert re.search(r"^llamadesk_rss_bytes \d+$", text, re.M)


def test_load_activate_unload_in_process(tiny_server, assets):
    status, body = call(tiny_server, "POST", "/v1/models/load", {"path": str(assets["minilm"]), "name": "mini"})
    assert status == 200 and body["id"] == "mini" and body["kind"] == "embedding"
    client = tiny_server.client()
    assert len(client.embeddings.create(model="mini", input="hello").data[0].embedding) == 384
    assert call(tiny_server, "POST", "/v1/models/load", {"path": str(assets["minilm"]), "name": "mini"})[0] == 409
    status, body = call(tiny_server, "POST", "/v1/models/activate", {"model": "mini"})
    assert status == 200 and next(m for m in client.models.list().data if m.id == "mini").model_extra["default"]
    call(tiny_server, "POST", "/v1/models/activate", {"model": "tiny-random-llama"})
    assert call(tiny_server, "POST", "/v1/models/unload", {"model": "mini"}) == (200, {"unloaded": "mini"})
    assert "mini" not in {m.id for m in client.models.list().data}
    status, body = call(tiny_server, "POST", "/v1/models/unload", {"model": "mini"})
    assert status == 404 and body["error"]["param"] == "model"
    status, body = call(tiny_server, "POST", "/v1/models/load", {"path": "/nonexistent/x.gguf"})
    assert status == 400 and "not found" in body["error"]["message"]
    assert client.chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_config_report_validate_and_save(tiny_server):
    status, body = call(tiny_server, "GET", "/config")
    assert status == 200 and body["keys"]["streams"] == {"value": 4, "source": "cli",
                                                         "help": body["keys"]["streams"]["help"]}
    assert body["keys"]["port"]["source"] == "cli" and body["models"][0]["name"] == "tiny-random-llama"
    status, body = call(tiny_server, "POST", "/config", {"values": {"kv_dtype": "f8"}})
    assert status == 400 and body["error"]["param"] == "kv_dtype" and "q8_0" in body["error"]["message"]
    status, body = call(tiny_server, "POST", "/config", {"values": {"colour": 1}})
    assert status == 400 and "unknown config key" in body["error"]["message"]
    status, body = call(tiny_server, "POST", "/config", {"values": {"chunk": 256}, "save": True})
    assert status == 200 and body["saved"]
    saved = load(["--config", body["path"]])
    assert (saved.chunk, saved.sources["chunk"]) == (256, "toml")


def test_control_errors_are_openai_shaped(tiny_server):
    status, body = call(tiny_server, "POST", "/v1/models/load", {})
    assert status == 400 and body["error"]["param"] == "path"
    with pytest.raises(openai.NotFoundError) as e:
        tiny_server.client().models.retrieve("nope")
    assert e.value.body["param"] == "model"
