"""/v1/rerank (and llama-server's /rerank) on a real reranker: SmolLM2 made a Qwen3-style reranker by the test
pipeline (tests/assets/reranker_gguf.py), rank pooling in llama.cpp, its yes/no head scoring each pair."""
from __future__ import annotations

import pytest

from tests.assets.reranker_gguf import RERANK_TEMPLATE
from tests.http import call

# (query, the document that answers it, documents on other subjects): written before the reranker's prompt and
# head were picked (on another dozen such sets; these were looked at as the check)
SETS = [
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by Leonardo da Vinci.",
     ["Volcanoes erupt molten rock.", "Penguins cannot fly.", "The train to Berlin is delayed."]),
    ("What gas do humans breathe out?", "Humans breathe out carbon dioxide.",
     ["The Amazon is a rainforest in South America.", "A square has four equal sides.", "Jazz began in New Orleans."]),
    ("How do you make tea?", "To make tea, pour boiling water over tea leaves and let it steep for a few minutes.",
     ["Saturn has beautiful rings.", "Sharks have rows of teeth.", "The election is held in November."]),
    ("What is the freezing point of water?", "Water freezes at zero degrees Celsius.",
     ["Horses can sleep standing up.", "The printer is out of paper.", "Mars is called the red planet."]),
    ("Where do kangaroos live?", "Kangaroos live in Australia.",
     ["Steel is made from iron and carbon.", "Bach composed many cantatas.", "The bakery sells fresh bread."]),
    ("What is the tallest mountain in the world?", "Mount Everest is the tallest mountain in the world.",
     ["Milk contains calcium.", "The meeting starts at ten.", "Dolphins use echolocation."]),
    ("How do I cancel my subscription?",
     "You can cancel your subscription at any time from the Billing section of your account settings.",
     ["The museum has a large dinosaur collection.", "Tomatoes grow best in full sun.",
      "The river flooded last spring."]),
    ("What do cows eat?", "Cows eat grass and hay.",
     ["The telescope was pointed at Venus.", "Football is popular in Spain.", "The laptop needs a new charger."]),
]


def placed(n: int) -> tuple[str, list[str], int]:
    """Set n with its relevant document moved to position n % 4 (so that no position is favoured)."""
    query, relevant, others = SETS[n]
    at = n % 4
    return query, [*others[:at], relevant, *others[at:]], at


def rerank(server, body: dict, path: str = "/v1/rerank") -> tuple[int, dict]:
    return call(server, "POST", path, {"model": "reranker", **body})


@pytest.mark.parametrize("n", range(len(SETS)))
def test_the_relevant_document_ranks_first(smol_server, n):
    query, docs, relevant = placed(n)
    status, out = rerank(smol_server, {"query": query, "documents": docs})
    assert status == 200, out
    assert out["model"] == "reranker" and out["object"] == "list"
    results = out["results"]
    assert sorted(r["index"] for r in results) == list(range(len(docs)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0.0 < s < 1.0 for s in scores)  # P(yes), best first
    assert results[0]["index"] == relevant, (query, results)
    assert "document" not in results[0]


def test_top_n_return_documents_and_document_objects(smol_server):
    query, docs, _ = placed(1)
    docs = docs[:3]
    status, full = rerank(smol_server, {"query": query, "documents": docs, "return_documents": False})
    assert status == 200 and all("document" not in r for r in full["results"])
    full = full["results"]
    status, top = rerank(smol_server, {"query": query, "documents": docs, "top_n": 2, "return_documents": True})
    assert status == 200
    assert [r["index"] for r in top["results"]] == [r["index"] for r in full[:2]]
    assert [r["document"]["text"] for r in top["results"]] == [docs[r["index"]] for r in full[:2]]
    status, objects = rerank(smol_server, {"query": query, "documents": [{"text": d} for d in docs], "top_n": 10})
    assert status == 200  # top_n past the count: all of them
    assert [(r["index"], r["relevance_score"]) for r in objects["results"]] == \
        [(r["index"], r["relevance_score"]) for r in full]


def test_usage_counts_the_pairs_in_the_models_rerank_prompt(smol_server):
    query, docs, _ = placed(2)
    docs = docs[:2]
    status, out = rerank(smol_server, {"query": query, "documents": docs})
    assert status == 200
    expected = 0
    for d in docs:  # llama-server's layout: the GGUF's rerank prompt with {query} and {document} filled in
        prompt = RERANK_TEMPLATE.replace("{query}", query).replace("{document}", d)
        expected += len(call(smol_server, "POST", "/tokenize", {"content": prompt, "model": "reranker"})[1]["tokens"])
    assert out["usage"] == {"prompt_tokens": expected, "total_tokens": expected}


def test_the_rerank_alias_answers_the_same(smol_server):
    query, docs, _ = placed(3)
    docs = docs[2:]
    v1 = rerank(smol_server, {"query": query, "documents": docs})
    bare = rerank(smol_server, {"query": query, "documents": docs}, "/rerank")
    assert v1[0] == bare[0] == 200 and v1[1] == bare[1]


def test_a_query_holding_the_placeholder_text_stays_as_written(smol_server):
    query = "What does {document} mean in a template?"
    status, out = rerank(smol_server, {"query": query, "documents": ["Paris is in France."]})
    assert status == 200
    prompt = RERANK_TEMPLATE.replace("{document}", "Paris is in France.").replace("{query}", query)
    tokens = call(smol_server, "POST", "/tokenize", {"content": prompt, "model": "reranker"})[1]["tokens"]
    assert out["usage"]["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize("model", ["smollm2", "minilm", None])
def test_a_model_that_is_no_reranker_is_a_400(smol_server, model):
    body = {"query": "q", "documents": ["d"], **({"model": model} if model else {})}  # none: the default, smollm2
    status, out = call(smol_server, "POST", "/v1/rerank", body)
    assert status == 400
    assert out["error"]["param"] == "model" and "not a reranker" in out["error"]["message"]


def test_the_reranker_refuses_chat_saying_what_it_serves(smol_server):
    status, out = call(smol_server, "POST", "/v1/chat/completions",
                       {"model": "reranker", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "/v1/rerank" in out["error"]["message"]


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": 5, "documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": "a"}, "documents"),
    ({"query": "q", "documents": ["a", 3]}, "documents"),
    ({"query": "q", "documents": ["a", ""]}, "documents"),
    ({"query": "q", "documents": [{"txt": "a"}]}, "documents"),
    ({"query": "q", "documents": [{"text": None}]}, "documents"),
    ({"query": "q", "documents": ["a"] * 1001}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ({"query": "q", "documents": ["a"], "model": 5}, "model"),
])
def test_malformed_bodies_are_400s_naming_the_field(smol_server, body, param):
    status, out = call(smol_server, "POST", "/v1/rerank", body)
    assert status == 400, out
    assert out["error"]["param"] == param, out
    assert call(smol_server, "GET", "/health")[0] == 200  # still serving


def test_a_pair_over_the_context_is_a_400(smol_server):
    status, out = rerank(smol_server, {"query": "q", "documents": ["short", "word " * 3000]})
    assert status == 400
    assert out["error"]["code"] == "context_length_exceeded" and out["error"]["param"] == "documents"
    assert "documents[1]" in out["error"]["message"]
    status, out = rerank(smol_server, {"query": "word " * 3000, "documents": ["short"]})
    assert status == 400 and out["error"]["param"] == "query"
    status, out = call(smol_server, "POST", "/v1/rerank", {"model": "nope", "query": "q", "documents": ["a"]})
    assert status == 404 and out["error"]["param"] == "model"
