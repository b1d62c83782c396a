"""/v1/embeddings on a dedicated BERT GGUF (all-MiniLM-L6-v2) and on a chat GGUF."""
from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import openai
import pytest
from openai.types import CreateEmbeddingResponse


def cos(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_minilm_similarity_and_unit_norm(smol_server):
    client = smol_server.client()
    r = client.embeddings.create(model="minilm", input=["man eating food", "man eating bread", "a car drives fast"])
    food, bread, car = (d.embedding for d in r.data)
    assert cos(food, bread) > cos(food, car)
    for v in (food, bread, car):
        assert abs(np.linalg.norm(v) - 1.0) < 1e-4
    assert [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens > 3 * 3  # [CLS] + words + [SEP] each


def test_float_and_base64_agree(smol_server):
    """The SDK asks for base64 by default; a plain float request must give the same vector."""
    def post(fmt: str) -> dict:
        req = urllib.request.Request(smol_server.url + "/v1/embeddings", method="POST",
                                     data=json.dumps({"model": "minilm", "input": "hello there",
                                                      "encoding_format": fmt}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            body = json.loads(r.read())
        if fmt == "float":
            CreateEmbeddingResponse.model_validate(body)  # the SDK's own type
        return body
    as_float = np.array(post("float")["data"][0]["embedding"], dtype=np.float32)
    as_b64 = np.frombuffer(base64.b64decode(post("base64")["data"][0]["embedding"]), dtype="<f4")
    assert as_float.shape == (384,)
    np.testing.assert_allclose(as_float, as_b64, rtol=1e-6)


def test_several_inputs_share_one_decode(smol_server):
    before = smol_server.get("/v1/stats")["models"]
    smol_server.client().embeddings.create(model="minilm", input=["one", "two two", "three three three"])
    after = smol_server.get("/v1/stats")["models"]
    minilm = lambda entries: next(m for m in entries if m["id"] == "minilm")  # noqa: E731
    assert minilm(after)["embedding_decodes"] - minilm(before)["embedding_decodes"] == 1
    assert minilm(after)["embedding_inputs"] - minilm(before)["embedding_inputs"] == 3


def test_chat_model_embeds_too(smol_server):
    r = smol_server.client().embeddings.create(model="smollm2", input=["The cat sat.", "The cat sat."])
    a, b = r.data[0].embedding, r.data[1].embedding
    assert len(a) == 576
    assert abs(np.linalg.norm(a) - 1) < 1e-4
    assert cos(a, b) > 0.9999  # same text, batched as two sequences: same vector


def test_bad_embedding_inputs(smol_server):
    client = smol_server.client()
    for bad in ("", [], [""], [1.5]):
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model="minilm", input=bad)
        assert e.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="minilm", input="word " * 600)
    assert e.value.body["code"] == "context_length_exceeded"
