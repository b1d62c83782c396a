"""Images in /v1/chat/completions, driven with the openai client: `--model` with `--image-mmproj` (SmolLM2 and
tests/assets/mmproj_gguf.py's projector), image_url parts with data: URIs, and the 4xx for bad ones."""
from __future__ import annotations

import base64

import openai
import pytest

from tests.assets import mmproj_gguf
from tests.conftest import LiveServer
from tests.engine.test_vision import data_url, gradient, image_part, noise, text_part


@pytest.fixture(scope="module")
def vsrv(assets, tmp_path_factory):
    toml = f"""
[[models]]
name = "text-only"
path = "{assets['smollm2']}"
ctx = 1024
streams = 1
"""
    # a body room for a 21 MB image: the image's own bound answers, not the body's
    s = LiveServer(["--model", str(assets["smollm2"]), "--image-mmproj", str(assets["mmproj"]), "--ctx", "1024",
                    "--streams", "2", "--max-json-mb", "64", "--threads", "1"], toml,
                   tmp_path_factory.mktemp("vision-route"))
    yield s
    s.stop()


def ask(srv: LiveServer, content, model: str | None = None, max_tokens: int = 8, **kw):
    return srv.client().chat.completions.create(model=model or srv.service.roster.default_id,
                                                messages=[{"role": "user", "content": content}],
                                                max_tokens=max_tokens, temperature=0, **kw)


def test_chat_completions_take_image_data_uris(vsrv):
    question = text_part("What is this?")
    out = ask(vsrv, [question, image_part(data_url(gradient()))])
    plain = ask(vsrv, [question])
    assert out.choices[0].message.content
    assert out.usage.prompt_tokens == plain.usage.prompt_tokens + mmproj_gguf.N_POS
    streamed = ask(vsrv, [question, image_part(data_url(noise(), "JPEG"))], stream=True,
                   stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens


BAD = {  # what is sent, the status, words of the message
    "remote": (lambda: "https://example.com/cat.png", 400, "never fetched"),
    "corrupt": (lambda: "data:image/png;base64," + base64.b64encode(b"no image here").decode(), 400, "image 1"),
    "21 MB": (lambda: "data:image/png;base64," + "A" * ((21 << 20) * 4 // 3), 413, "at most"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_images_are_4xx_naming_the_problem_and_the_server_keeps_serving(vsrv, kind):
    url, status, words = BAD[kind]
    with pytest.raises(openai.APIStatusError) as e:
        ask(vsrv, [text_part("Look."), image_part(url())])
    assert e.value.status_code == status and words in e.value.message
    assert e.value.body["param"] == "messages"
    assert ask(vsrv, [text_part("Still there?"), image_part(data_url(gradient()))]).choices[0].message.content


def test_an_image_to_a_model_without_vision_is_a_400(vsrv):
    with pytest.raises(openai.BadRequestError) as e:
        ask(vsrv, [text_part("Look."), image_part(data_url(gradient()))], model="text-only")
    assert "has no vision" in e.value.message


def test_images_decide_the_greedy_answer(vsrv):
    question = text_part("Describe the image in one sentence.")

    def answer(url: str) -> str:
        return ask(vsrv, [question, image_part(url)], max_tokens=12).choices[0].message.content
    first, other, again = answer(data_url(gradient())), answer(data_url(noise(5))), answer(data_url(gradient()))
    assert first != other
    assert again == first
