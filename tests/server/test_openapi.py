"""GET /openapi.json: a valid OpenAPI document that lists every served route with what it reads."""
from __future__ import annotations

from openapi_spec_validator import validate

from tests.http import call


def test_the_document_is_valid_openapi_and_lists_every_route(tiny_server):
    status, doc = call(tiny_server, "GET", "/openapi.json")
    assert status == 200
    validate(doc)  # raises on an invalid document (refs that do not resolve included)
    served = {(r.method, r.resource.canonical) for r in tiny_server.server.runner.app.router.routes()
              if r.method not in ("HEAD", "*")}
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert served == listed
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert all(op["summary"] for ops in doc["paths"].values() for op in ops.values())


def test_routes_with_a_request_shape_reference_its_schema(tiny_server):
    from server.shapes import DOCUMENTED
    doc = call(tiny_server, "GET", "/openapi.json")[1]
    shaped = [(m, p, s) for (m, p), (s, _) in DOCUMENTED.items() if s is not None]
    assert shaped, "no route declares a request shape"
    for method, path, shape in shaped:
        ref = doc["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{shape.__name__}" and shape.__name__ in doc["components"]["schemas"]


def _body_schema(doc: dict, method: str, path: str) -> dict:
    ref = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_the_openai_and_ollama_routes_show_their_real_request_bodies(tiny_server):
    doc = call(tiny_server, "GET", "/openapi.json")[1]
    chat = _body_schema(doc, "post", "/v1/chat/completions")
    assert {"messages", "temperature", "tools", "tool_choice", "response_format", "stream", "logit_bias",
            "chat_template_kwargs", "keep_alive"} <= set(chat["properties"]) and chat["required"] == ["messages"]
    temperature = next(s for s in chat["properties"]["temperature"]["anyOf"] if s.get("type") == "number")
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)  # the bounds the 400 checks
    assert _body_schema(doc, "post", "/v1/completions")["required"] == ["prompt"]
    assert _body_schema(doc, "post", "/v1/embeddings")["required"] == ["input"]
    assert _body_schema(doc, "post", "/apply-template") == chat
    assert {"input_prefix", "input_suffix", "n_predict", "temperature"} <= set(
        _body_schema(doc, "post", "/infill")["properties"])
    assert {"model", "messages", "options", "format", "tools", "think"} <= set(
        _body_schema(doc, "post", "/api/chat")["properties"])
    assert _body_schema(doc, "post", "/api/pull")["required"] == ["model"]
    assert set(_body_schema(doc, "post", "/api/create")["required"]) == {"model", "from"}
    assert _body_schema(doc, "post", "/api/copy")["required"] == ["source", "destination"]
