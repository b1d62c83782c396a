"""/v1/models lists the roster's remote models too, and every model's capabilities; /v1/stats and /metrics count
the remote models' requests per replica. A llamadesk serving SmolLM2 with a vision tower relays remote entries to
the stand-in upstream of test_remote.py (one that answers, one that fails) and to a port nobody listens on."""
from __future__ import annotations

from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LiveServer
from tests.http import request
from tests.server.test_remote import STANDIN_TEXT, _closed_port, _remote
from tests.server.test_remote import standin  # noqa: F401 (a fixture: the stand-in upstream)

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def front(assets, standin, tmp_path_factory):
    toml = "".join([
        _remote("far", url=standin.url("ok"), remote_model="upstream-id"),
        _remote("pair", urls=[standin.url("broken"), standin.url("ok")]),
        _remote("bad", url=standin.url("broken")),
        _remote("refused", url=f"http://127.0.0.1:{_closed_port()}/v1"),
        f'[[models]]\nname = "later"\npath = "{assets["smollm2"]}"\npreload = false\n',
    ])
    srv = LiveServer(["--model", str(assets["smollm2"]), "--image-mmproj", str(assets["mmproj"]), "--ctx", "1024",
                      "--streams", "1"], toml, tmp_path_factory.mktemp("listing"))
    srv.own = Path(assets["smollm2"]).stem
    yield srv
    srv.stop()


def _listed(srv: LiveServer) -> dict[str, dict]:
    return {m.id: m.model_dump() for m in srv.client().models.list()}


def test_remote_models_are_listed_with_their_replicas(front, standin):
    listed = _listed(front)
    assert {"far", "pair", "refused", front.own, "later"} <= listed.keys()
    far = listed["far"]
    assert (far["owned_by"], far["backend"], far["remote_model"]) == ("remote", "remote", "upstream-id")
    assert [r["url"] for r in far["replicas"]] == [standin.url("ok")]
    assert listed["refused"]["healthy"] is False
    assert listed["far"]["capabilities"] == []  # the upstream's to say
    one = front.client().models.retrieve("pair").model_dump()
    assert [r["url"] for r in one["replicas"]] == [standin.url("broken"), standin.url("ok")]
    with pytest.raises(openai.NotFoundError):
        front.client().models.retrieve("nobody")


def test_capabilities_say_what_each_model_is_known_to_do(front, smol_server):
    listed = _listed(front)
    assert "vision" in listed[front.own]["capabilities"] and listed[front.own]["vision"] is True
    assert listed["later"]["state"] == "unloaded" and listed["later"]["capabilities"] == ["completion"]
    assert front.client().models.retrieve(front.own).model_dump()["capabilities"] == listed[front.own]["capabilities"]
    smol = _listed(smol_server)
    assert "vision" not in smol["smollm2"]["capabilities"] and smol["smollm2"]["capabilities"][0] == "completion"
    assert "tools" in smol["smollm2-hermes"]["capabilities"]
    assert "thinking" in smol["smollm2-think"]["capabilities"] and "thinking" not in smol["smollm2"]["capabilities"]
    assert smol["minilm"]["capabilities"] == ["embedding"]
    assert smol["reranker"]["capabilities"] == ["rerank"]


def _remote_stats(srv: LiveServer) -> dict[str, dict]:
    return {m["id"]: m for m in srv.get("/v1/stats")["remote"]}


def _samples(srv: LiveServer) -> dict[tuple, float]:
    status, text = request(srv.url + "/metrics")
    assert status == 200
    return {(s.name, s.labels.get("model"), s.labels.get("replica"), s.labels.get("stat")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_stats_and_metrics_count_remote_requests_per_replica(front, standin):
    before = _remote_stats(front)
    for _ in range(2):
        reply = front.client().chat.completions.create(model="far", messages=HI, max_tokens=4)
        assert reply.choices[0].message.content == STANDIN_TEXT
    after = _remote_stats(front)
    far = after["far"]["replicas"][0]
    assert far["requests"] == before["far"]["replicas"][0]["requests"] + 2 and far["outstanding"] == 0
    assert far["errors"] == 0 and far["latency_ms"]["p50"] > 0
    assert after["far"]["requests"] == far["requests"]
    samples = _samples(front)
    url = standin.url("ok")
    assert samples[("llamadesk_remote_requests_total", "far", url, None)] == far["requests"]
    assert samples[("llamadesk_remote_outstanding", "far", url, None)] == 0
    assert samples[("llamadesk_remote_healthy", "refused", after["refused"]["replicas"][0]["url"], None)] == 0
    assert samples[("llamadesk_remote_latency_ms", "far", url, "p50")] == far["latency_ms"]["p50"]


def test_a_failing_replica_counts_its_errors(front, standin):
    before = _remote_stats(front)["bad"]["errors"]
    with pytest.raises(openai.APIStatusError):
        front.client().chat.completions.create(model="bad", messages=HI, max_tokens=4)
    bad = _remote_stats(front)["bad"]
    assert bad["errors"] == before + 1 and bad["outstanding"] == 0
    assert _samples(front)[("llamadesk_remote_errors_total", "bad", standin.url("broken"), None)] == bad["errors"]
