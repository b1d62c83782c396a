"""Images in the Responses, Messages and Ollama APIs' own shapes (input_image, image blocks, images lists), driven
with the official openai, anthropic and ollama clients on a vision-capable SmolLM2 (tests/assets/mmproj_gguf.py's
projector, as in test_vision_route.py): the same image gives the same greedy reply, another image another one,
the prompt grows by the image's positions, and a bad image is a 400 in the protocol's error shape."""
from __future__ import annotations

import base64

import anthropic
import ollama
import openai
import pytest

from tests.assets import mmproj_gguf
from tests.engine.test_vision import data_url, gradient, noise
from tests.http import call
from tests.server import test_vision_route

QUESTION = "What is this?"
CORRUPT = base64.b64encode(b"no image here").decode()

vsrv = test_vision_route.vsrv  # SmolLM2 with the test projector, and a text-only entry: a module's own


@pytest.fixture(scope="module")
def model(vsrv) -> str:
    return vsrv.service.roster.default_id


def b64(url: str) -> str:
    """The base64 of a data: URI."""
    return url.partition(",")[2]


# ---- Responses -------------------------------------------------------------------------------------------


def respond(vsrv, model, content, **kw):
    return vsrv.client().responses.create(model=model, input=[{"role": "user", "content": content}],
                                          max_output_tokens=8, temperature=0, **kw)


def image(url: str, **kw) -> dict:
    return {"type": "input_image", "image_url": url, **kw}


def test_responses_read_input_images(vsrv, model):
    text = {"type": "input_text", "text": QUESTION}
    plain = respond(vsrv, model, [text])
    first = respond(vsrv, model, [text, image(data_url(gradient()), detail="low")])
    again = respond(vsrv, model, [text, image(data_url(gradient()))])
    other = respond(vsrv, model, [text, image(data_url(noise(7), "JPEG"))])
    assert first.output_text and again.output_text == first.output_text
    assert other.output_text != first.output_text
    assert first.usage.input_tokens == plain.usage.input_tokens + mmproj_gguf.N_POS
    # the image on an earlier turn, kept with the stored response, is still in the prompt
    follow = vsrv.client().responses.create(model=model, input="And its colors?", previous_response_id=first.id,
                                            max_output_tokens=4, temperature=0)
    follow_plain = vsrv.client().responses.create(model=model, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [text]}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And its colors?"}])
    assert follow.usage.input_tokens == follow_plain.usage.input_tokens + mmproj_gguf.N_POS
    kept = vsrv.client().responses.input_items.list(first.id).data[0]
    assert kept.content[1].type == "input_image" and kept.content[1].image_url == data_url(gradient())


@pytest.mark.parametrize("part, status, words", [
    (image("data:image/png;base64," + CORRUPT), 400, "image 1"),
    (image("https://example.com/cat.png"), 400, "never fetched"),
    ({"type": "input_image", "file_id": "file-123"}, 400, "files are not supported"),
    ({"type": "input_image", "image_url": 5}, 400, "image_url"),
])
def test_bad_input_images_are_400s_in_the_openai_shape(vsrv, model, part, status, words):
    with pytest.raises(openai.APIStatusError) as e:
        respond(vsrv, model, [{"type": "input_text", "text": "Look."}, part])
    assert e.value.status_code == status and words in e.value.message
    assert e.value.body["param"] == "input" and e.value.body["type"] == "invalid_request_error"
    assert respond(vsrv, model, [image(data_url(gradient())), {"type": "input_text", "text": "Still?"}]).output_text


def test_an_input_image_to_a_text_only_model_is_a_400(vsrv):
    with pytest.raises(openai.BadRequestError) as e:
        respond(vsrv, "text-only", [{"type": "input_text", "text": "Look."}, image(data_url(gradient()))])
    assert "has no vision" in e.value.message


# ---- Messages --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claude(vsrv):
    c = anthropic.Anthropic(base_url=vsrv.url, api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


def block(url: str, **kw) -> dict:
    kind, _, data = url.partition(",")
    return {"type": "image", "source": {"type": "base64", "media_type": kind[5:].removesuffix(";base64"),
                                        "data": data}, **kw}


def message(claude, model, content, stream=False, **kw):
    ask = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}],
           "extra_body": {"temperature": 0}, **kw}
    if not stream:
        return claude.messages.create(**ask)
    with claude.messages.stream(**ask) as s:
        return s.get_final_message()


def prompt_tokens(m) -> int:
    return m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_messages_read_image_blocks(claude, model):
    text = {"type": "text", "text": QUESTION}
    plain = message(claude, model, [text])
    first = message(claude, model, [block(data_url(gradient()), cache_control={"type": "ephemeral"}), text])
    again = message(claude, model, [block(data_url(gradient())), text], stream=True)
    other = message(claude, model, [block(data_url(noise(3), "WEBP")), text])
    assert first.content[0].text and again.content[0].text == first.content[0].text
    assert other.content[0].text != first.content[0].text
    assert prompt_tokens(first) == prompt_tokens(plain) + mmproj_gguf.N_POS
    earlier = claude.messages.create(model=model, max_tokens=4, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [block(data_url(gradient())), text]},
        {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And its colors?"}])
    earlier_plain = claude.messages.create(model=model, max_tokens=4, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [text]},
        {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And its colors?"}])
    assert prompt_tokens(earlier) == prompt_tokens(earlier_plain) + mmproj_gguf.N_POS


@pytest.mark.parametrize("bad, words", [
    (lambda: block("data:image/png;base64," + CORRUPT), "image 1"),
    (lambda: {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}, "never fetched"),
    (lambda: {"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": "AA=="}},
     "media_type"),
])
def test_bad_image_blocks_are_400s_in_anthropics_shape(claude, model, bad, words):
    with pytest.raises(anthropic.BadRequestError) as e:
        message(claude, model, [bad(), {"type": "text", "text": "Look."}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert words in e.value.body["error"]["message"]
    assert message(claude, model, [block(data_url(gradient())), {"type": "text", "text": "Still?"}]).content


def test_an_image_block_to_a_text_only_model_is_a_400(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        message(claude, "text-only", [block(data_url(gradient())), {"type": "text", "text": "Look."}])
    assert "has no vision" in e.value.body["error"]["message"]


# ---- Ollama ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def olla(vsrv):
    c = ollama.Client(host=vsrv.url, timeout=120)
    yield c
    c._client.close()


OPTIONS = {"temperature": 0, "num_predict": 8}


def test_ollama_chat_and_generate_read_images(olla, model):
    def chat(images, stream=False):
        out = olla.chat(model=model, messages=[{"role": "user", "content": QUESTION, "images": images}],
                        options=OPTIONS, stream=stream)
        return "".join(p.message.content for p in out) if stream else out
    first = chat([b64(data_url(gradient()))])
    assert first.message.content and chat([b64(data_url(gradient()))], stream=True) == first.message.content
    assert chat([b64(data_url(noise(5), "JPEG"))]).message.content != first.message.content
    fresh = chat([b64(data_url(noise(11)))])  # an image never sent: its rows are prefilled, none reused
    assert fresh.prompt_eval_count >= mmproj_gguf.N_POS

    said = olla.generate(model=model, prompt=QUESTION, images=[b64(data_url(gradient()))], options=OPTIONS)
    assert said.response and said.response == olla.generate(model=model, prompt=QUESTION, options=OPTIONS,
                                                             images=[b64(data_url(gradient()))]).response
    assert olla.generate(model=model, prompt=QUESTION, images=[b64(data_url(noise(5), "JPEG"))],
                         options=OPTIONS).response != said.response
    streamed = olla.generate(model=model, prompt=QUESTION, images=[b64(data_url(gradient()))], options=OPTIONS,
                             stream=True)
    assert "".join(p.response for p in streamed) == said.response
    # an image on an earlier turn stays in the prompt
    turns = [{"role": "user", "content": QUESTION, "images": [b64(data_url(noise(13)))]},
             {"role": "assistant", "content": first.message.content}, {"role": "user", "content": "And its colors?"}]
    assert olla.chat(model=model, messages=turns, options=OPTIONS).prompt_eval_count >= mmproj_gguf.N_POS


@pytest.mark.parametrize("route, body, words", [
    ("/api/chat", {"messages": [{"role": "user", "content": "Look.", "images": [CORRUPT]}]}, "image 1"),
    ("/api/generate", {"prompt": "Look.", "images": [CORRUPT]}, "image 1"),
    ("/api/generate", {"prompt": "Look.", "images": ["https://example.com/cat.png"]}, "base64"),
    ("/api/generate", {"prompt": "Look.", "images": [5]}, "images"),
    ("/api/generate", {"prompt": "Look.", "raw": True, "images": [CORRUPT]}, "raw"),
])
def test_bad_ollama_images_are_400s_in_ollamas_shape(vsrv, model, route, body, words):
    status, out = call(vsrv, "POST", route, {"model": model, "stream": False, **body})
    assert status == 400 and list(out) == ["error"] and words in out["error"], out
    status, out = call(vsrv, "POST", "/api/generate", {"model": model, "stream": False, "prompt": "Still?",
                                                       "images": [b64(data_url(gradient()))]})
    assert status == 200 and out["done"]


def test_ollama_images_to_a_text_only_model_are_a_400(olla):
    with pytest.raises(ollama.ResponseError) as e:
        olla.chat(model="text-only", messages=[{"role": "user", "content": "Look.",
                                                "images": [b64(data_url(gradient()))]}])
    assert e.value.status_code == 400 and "has no vision" in e.value.error
