"""The browser threat model: a web page in the user's own browser (on loopback) must not be able to drive
the server (CSRF with "simple" requests) or read it (DNS rebinding). Requests here are sent exactly as
Chromium sends them: an Origin header, a text/plain body, no preflight, Sec-Fetch-* headers."""
from __future__ import annotations

import http.client
import json
import logging
import socket
from urllib.parse import urlsplit

import pytest

from tests.conftest import LiveServer

# What Chromium sends for fetch(url, {method: "POST", mode: "no-cors", body: JSON.stringify(...)}) from a page
# on http://evil.example: a CORS-safelisted content type, so no preflight asks first.
EVIL = {"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8", "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}


def raw(server, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None,
        host: str | None = None) -> tuple[int, object, http.client.HTTPMessage]:
    """One request with exactly these headers (Host too); (status, parsed JSON or text, headers)."""
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    data = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host or u.netloc)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    parsed = json.loads(text) if r.getheader("Content-Type", "").startswith("application/json") else text
    return r.status, parsed, r.headers


@pytest.fixture(scope="module")
def server(assets, tmp_path_factory):
    srv = LiveServer(["--model", str(assets["tiny"]), "--allowed-hosts", "mybox.example,.lan.example"], "",
                     tmp_path_factory.mktemp("security"))
    yield srv
    srv.stop()


def _chat(max_tokens: int = 2) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


@pytest.mark.parametrize("path, body", [
    ("/config", {"values": {"host": "0.0.0.0"}, "save": True}),
    ("/config", {"values": {"streams": 1}, "save": True}),
    ("/restart", {}),
    ("/shutdown", {}),
    ("/v1/models/load", {"path": "/etc/hostname"}),
    ("/v1/models/unload", {"model": "tiny-random-llama"}),
    ("/catalog/download", {"name": "whatever"}),
    ("/bench", {}),
    ("/v1/chat/completions", _chat()),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
])
def test_a_foreign_page_cannot_drive_the_server(server, path, body):
    cfg = server.config.path
    before = cfg.read_text()
    status, out, headers = raw(server, "POST", path, body, EVIL)
    assert status == 403, (path, status, out)
    assert out["error"]["type"] == "permission_error" and "evil.example" in out["error"]["message"]
    assert "Access-Control-Allow-Origin" not in headers
    assert cfg.read_text() == before  # nothing written
    assert server.get("/health")["status"] == "ok"
    assert [m["id"] for m in server.get("/v1/models")["data"]] == ["tiny-random-llama"]


def test_a_foreign_page_cannot_read_with_cors_either(server):
    # a CORS GET (mode: "cors") and its preflight from the foreign page: refused, no Allow-Origin
    status, _, headers = raw(server, "GET", "/config", headers={"Origin": "http://evil.example",
                                                                 "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, _, headers = raw(server, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert status == 403 and "Access-Control-Allow-Origin" not in headers


def test_sandboxed_pages_and_cross_site_posts_without_origin_are_refused(server):
    # a sandboxed iframe or a file:// page sends Origin: null
    assert raw(server, "POST", "/v1/chat/completions", _chat(), {"Origin": "null",
                                                                  "Content-Type": "application/json"})[0] == 403
    assert raw(server, "POST", "/v1/chat/completions", _chat(), {"Sec-Fetch-Site": "cross-site",
                                                                  "Content-Type": "application/json"})[0] == 403


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "localhost.evil.example", "mybox.example.evil"])
def test_dns_rebinding_is_refused_by_the_host_check(server, host):
    # the rebound page's requests are same-origin for the browser: no Origin problem, only a foreign Host
    for method, path in (("GET", "/config"), ("GET", "/v1/models"), ("GET", "/v1/streams")):
        status, out, _ = raw(server, method, path, host=host)
        assert status == 403, (host, path)
        assert out["error"]["code"] == "host_not_allowed" and host.split(":")[0] in out["error"]["message"]
    status, out, _ = raw(server, "POST", "/v1/chat/completions", _chat(), {"Content-Type": "application/json"},
                         host=host)
    assert status == 403


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}",
                                  "app.localhost:{port}", "mybox.example:{port}", "a.lan.example", "10.1.2.3"])
def test_loopback_names_addresses_and_allowed_hosts_are_answered(server, host):
    port = urlsplit(server.url).port
    status, out, _ = raw(server, "GET", "/v1/models", host=host.format(port=port))
    assert status == 200 and out["data"][0]["id"] == "tiny-random-llama"


def test_same_origin_and_clients_without_origin_keep_working(server):
    port = urlsplit(server.url).port
    own = {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json", "Sec-Fetch-Site": "same-origin"}
    status, out, headers = raw(server, "POST", "/v1/chat/completions", _chat(), own)
    assert status == 200 and out["choices"][0]["message"]["role"] == "assistant"
    # the openai SDK (no Origin) and curl-like raw requests
    reply = server.client().chat.completions.create(model="tiny-random-llama", max_tokens=2,
                                                     messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.role == "assistant"
    status, out, _ = raw(server, "POST", "/v1/embeddings", {"input": "hi"}, {"Content-Type": "application/json"})
    assert status == 200 and len(out["data"][0]["embedding"]) == 64


@pytest.mark.parametrize("content_type", [None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/config", "/v1/models/load", "/catalog/download"])
def test_json_routes_take_only_application_json(server, path, content_type):
    body = json.dumps(_chat() if path == "/v1/chat/completions" else {"values": {}}).encode()
    status, out, _ = raw(server, "POST", path, body, {"Content-Type": content_type} if content_type else {})
    assert status == 415, (path, content_type, out)
    assert out["error"]["code"] == "unsupported_media_type" and "application/json" in out["error"]["message"]
    assert raw(server, "POST", "/v1/chat/completions", _chat(),
               {"Content-Type": "application/json; charset=utf-8"})[0] == 200


def test_network_settings_cannot_change_over_http_without_a_key(server):
    before = server.config.path.read_text()
    for key, value in (("host", "0.0.0.0"), ("api_key", "mine"), ("cors_origins", "*"), ("allowed_hosts", "*"),
                       ("insecure_no_key", True)):
        status, out, _ = raw(server, "POST", "/config", {"values": {key: value}, "save": True},
                             {"Content-Type": "application/json"})
        assert status == 403 and out["error"]["param"] == key, (key, out)
        assert "API key" in out["error"]["message"]
    assert server.config.path.read_text() == before
    # other keys still validate (and would save) over HTTP
    status, out, _ = raw(server, "POST", "/config", {"values": {"streams": 2}}, {"Content-Type": "application/json"})
    assert status == 200 and out["values"] == {"streams": 2}


def test_every_request_leaves_an_access_log_line(server, caplog):
    with caplog.at_level(logging.INFO, logger="llamadesk.access"):
        raw(server, "POST", "/v1/chat/completions", _chat(), EVIL)
        raw(server, "GET", "/v1/models")
    lines = [r.getMessage() for r in caplog.records if r.name == "llamadesk.access"]
    assert any(ln.startswith("POST /v1/chat/completions 403 ") and "origin=http://evil.example" in ln for ln in lines)
    assert any(ln.startswith("GET /v1/models 200 ") and "ms" in ln for ln in lines)
    assert not any("messages" in ln or "content" in ln for ln in lines)  # never a body


@pytest.fixture(scope="module")
def keyed(assets, tmp_path_factory):
    srv = LiveServer(["--model", str(assets["tiny"]), "--api-key", "s3cret"], "", tmp_path_factory.mktemp("keyed"))
    yield srv
    srv.stop()


def test_with_a_key_control_routes_need_it_and_health_stays_open(keyed):
    json_ct = {"Content-Type": "application/json"}
    assert raw(keyed, "GET", "/health")[0] == 200  # supervisors and load balancers probe it without the key
    for path, body in (("/v1/models/unload", {"model": "tiny-random-llama"}), ("/config", {"values": {}}),
                       ("/restart", {}), ("/catalog/download", {"name": "x"})):
        status, out, _ = raw(keyed, "POST", path, body, json_ct)
        assert status == 401 and out["error"]["code"] == "invalid_api_key", path
    authed = {**json_ct, "Authorization": "Bearer s3cret"}
    # with the key, the network settings can be validated (and saved) over HTTP
    status, out, _ = raw(keyed, "POST", "/config", {"values": {"host": "0.0.0.0"}}, authed)
    assert status == 200 and out["values"] == {"host": "0.0.0.0"}
    status, out, _ = raw(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert status == 200 and [m["id"] for m in out["data"]] == ["tiny-random-llama"]


def test_an_undecodable_authorization_header_is_a_401(keyed):
    u = urlsplit(keyed.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: " + u.netloc.encode() +
                  b"\r\nAuthorization: Bearer \xff\xfe\xc3(\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"invalid_api_key" in reply
    assert raw(keyed, "GET", "/health")[0] == 200


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"model": "tiny-random-llama", "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": "tiny-random-llama", "prompt": "hi"}),
    ("/api/pull", {"model": "hf.co/owner/repo:Q4_K_M"}), ("/api/copy", {"source": "tiny-random-llama",
                                                                         "destination": "copied"}),
    ("/api/create", {"model": "made", "from": "tiny-random-llama"}),
    ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/tokenize", {"content": "hi"}), ("/infill", {"input_prefix": "a"})])
def test_the_other_protocols_refuse_foreign_pages_and_hosts_in_their_own_shape(server, path, body):
    status, out, _ = raw(server, "POST", path, body, EVIL)
    assert status == 403
    status2, out2, _ = raw(server, "POST", path, body, {"Content-Type": "application/json"}, host="evil.example")
    assert status2 == 403
    if path.startswith("/api/"):  # Ollama's {"error": "..."}
        assert isinstance(out["error"], str) and "evil.example" in out["error"] and isinstance(out2["error"], str)
        status3, out3, _ = raw(server, "POST", path, json.dumps(body).encode(), {"Content-Type": "text/plain"})
        assert status3 == 415 and isinstance(out3["error"], str)
    else:
        assert out["error"]["code"] == "origin_not_allowed" and out2["error"]["code"] == "host_not_allowed"


def test_access_log_off_writes_no_line(assets, tmp_path, caplog):
    srv = LiveServer(["--model", str(assets["tiny"]), "--access-log", "off"], "", tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="llamadesk.access"):
            assert raw(srv, "GET", "/v1/models")[0] == 200
            assert raw(srv, "POST", "/v1/chat/completions", _chat(), EVIL)[0] == 403  # still refused
        assert not [r for r in caplog.records if r.name == "llamadesk.access"]
    finally:
        srv.stop()


def test_the_key_may_come_as_x_api_key(keyed):
    """What Anthropic's clients send; for every route, and wrong is as refused as missing."""
    status, out, _ = raw(keyed, "GET", "/v1/models", headers={"x-api-key": "s3cret"})
    assert status == 200 and [m["id"] for m in out["data"]] == ["tiny-random-llama"]
    status, out, _ = raw(keyed, "POST", "/v1/chat/completions", _chat(), {"Content-Type": "application/json",
                                                                         "x-api-key": "s3cret"})
    assert status == 200
    for headers in ({"x-api-key": "s3cre"}, {"x-api-key": "s3cret2"}, {"x-api-key": ""},
                    {"x-api-key": "Bearer s3cret"}, {"Authorization": "s3cret"}):
        status, out, _ = raw(keyed, "GET", "/v1/models", headers=headers)
        assert status == 401 and out["error"]["code"] == "invalid_api_key", headers
        assert "x-api-key" in out["error"]["message"]


def test_anthropic_routes_refuse_in_anthropics_shape(server, keyed):
    body = {"model": "tiny-random-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, out, _ = raw(keyed, "POST", path, body, {"Content-Type": "application/json", "x-api-key": "nope"})
        assert status == 401 and out["type"] == "error" and out["error"]["type"] == "authentication_error", out
        status, out, headers = raw(server, "POST", path, body, EVIL)
        assert status == 403 and out["error"]["type"] == "permission_error"
        assert "evil.example" in out["error"]["message"]
        assert "Access-Control-Allow-Origin" not in headers
        status, out, _ = raw(server, "POST", path, body, {"Content-Type": "application/json"}, host="evil.example")
        assert status == 403 and out == {"type": "error", "error": {"type": "permission_error",
                                                                   "message": out["error"]["message"]}}
    status, out, _ = raw(keyed, "POST", "/v1/messages", body, {"Content-Type": "application/json",
                                                               "x-api-key": "s3cret"})
    assert status == 200 and out["type"] == "message"
