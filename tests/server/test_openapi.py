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

