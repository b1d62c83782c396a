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
        (media, body), = doc["paths"][path][method.lower()]["requestBody"]["content"].items()
        assert media == ("multipart/form-data" if path in UPLOADS else "application/json")
        ref = body["schema"]["$ref"]
        assert ref == f"#/components/schemas/{shape.__name__}" and shape.__name__ in doc["components"]["schemas"]
    names = [s.__name__ for _, _, s in shaped]
    assert len({s for _, _, s in shaped}) == len(set(names))  # no two shapes share a component's name


def test_every_route_that_reads_a_body_declares_its_shape(tiny_server):
    from server.shapes import DOCUMENTED
    doc = call(tiny_server, "GET", "/openapi.json")[1]
    generic = sorted(f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m, op in ops.items()
                     if "requestBody" in op and (m.upper(), p) not in DOCUMENTED)
    # these read no body at all (the rest read theirs through a shape)
    assert generic == ["POST /restart", "POST /shutdown"]


UPLOADS = {"/v1/audio/transcriptions", "/v1/audio/translations", "/vad"}


def _body_schema(doc: dict, method: str, path: str) -> dict:
    (_, body), = doc["paths"][path][method]["requestBody"]["content"].items()
    return doc["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]


def test_the_control_catalog_and_audio_routes_show_their_bodies(tiny_server):
    doc = call(tiny_server, "GET", "/openapi.json")[1]
    load = _body_schema(doc, "post", "/v1/models/load")
    assert load["required"] == ["path"] and {"name", "ctx", "streams", "chunk", "kv_dtype", "chat_template",
                                             "default"} <= set(load["properties"])
    assert _body_schema(doc, "post", "/v1/models/reload")["required"] == ["model"]
    assert set(_body_schema(doc, "post", "/config")["properties"]) == {"values", "save"}
    assert _body_schema(doc, "post", "/catalog/download")["required"] == ["name"]
    assert "tower" in _body_schema(doc, "post", "/catalog/download")["properties"]
    assert _body_schema(doc, "post", "/catalog/import")["required"] == ["path"]
    form = _body_schema(doc, "post", "/v1/audio/transcriptions")
    assert form["required"] == ["file"] and form["properties"]["file"]["format"] == "binary"
    assert {"type": "boolean"} in form["properties"]["stream"]["anyOf"]
    assert set(form["properties"]["response_format"]["enum"]) == {"json", "text", "srt", "vtt", "verbose_json"}
    speech = _body_schema(doc, "post", "/v1/audio/speech")
    assert {"input", "voice", "speed", "response_format", "stream_format", "instructions"} <= set(speech["properties"])
    assert _body_schema(doc, "post", "/vad")["required"] == ["file"]


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
