"""Reranking as llama-server, Jina and Cohere serve it: /v1/rerank (and llama-server's /rerank) scores each document
against a query with a reranker GGUF's classifier head, best first."""
from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import Field, field_validator

from server.keys import SERVICE
from server.schemas import read_json
from server.shapes import Shape, documents, parse

routes = web.RouteTableDef()
MAX_DOCUMENTS = 1000  # Cohere's and Jina's limit per request


class TextDocument(Shape):
    """A document as an object (Cohere's and Jina's form): its text is what is ranked."""

    text: str


class RerankRequest(Shape):
    """A query and the documents to rank by their relevance to it."""

    model: str | None = None
    query: Annotated[str, Field(min_length=1)]
    documents: Annotated[list[str | TextDocument], Field(min_length=1, max_length=MAX_DOCUMENTS)]
    top_n: Annotated[int, Field(ge=1)] | None = None  # the best n only (all by default)
    return_documents: bool = False  # each result carries its document's text

    @field_validator("documents")
    @classmethod
    def _none_empty(cls, docs: list[str | TextDocument]) -> list[str | TextDocument]:
        for i, d in enumerate(docs):
            if not (d if isinstance(d, str) else d.text):
                raise ValueError(f"documents[{i}] is empty: there is nothing to rank")
        return docs

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


def ranked(scores: list[float], texts: list[str], top_n: int | None, with_documents: bool) -> list[dict]:
    """The results best first (ties in the order sent), cut to top_n."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    return [{"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}} if with_documents else {})}
            for i in order]


@documents("POST", "/v1/rerank", "Rank documents by their relevance to a query with a reranker model", RerankRequest)
@documents("POST", "/rerank", "Rank documents by their relevance to a query (llama-server's path)", RerankRequest)
@routes.post("/v1/rerank")
@routes.post("/rerank")
async def rerank(request: web.Request) -> web.Response:
    """{model?, query, documents, top_n?, return_documents?} -> {model, object, results: [{index,
    relevance_score, document?}] best first, usage}."""
    body = parse(RerankRequest, await read_json(request), "rerank")
    texts = body.texts()
    model, scores, tokens = await request.app[SERVICE].rerank(body.model, body.query, texts)
    return web.json_response({"model": model, "object": "list",
                              "results": ranked(scores, texts, body.top_n, body.return_documents),
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
