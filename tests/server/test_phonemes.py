"""/v1/audio/phonemes: the Piper voice's own G2P (piper-phonemize, espeak-ng) on what the TTS would read."""
from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.http import call


@pytest.fixture(scope="module")
def tts_server(assets, tmp_path_factory):
    srv = LiveServer(["--model", str(assets["tiny"]), "--tts", str(assets["piper"])], "",
                     tmp_path_factory.mktemp("phonemes"))
    yield srv
    srv.stop()


def phonemes(server, body: dict) -> tuple[int, dict]:
    return call(server, "POST", "/v1/audio/phonemes", body)


def test_two_sentences_give_two_with_their_ipa(tts_server):
    status, out = phonemes(tts_server, {"input": "  The weather is nice today.\n\n  I would like a cup of coffee.  "})
    assert status == 200, out
    assert out["language"] == "en-us"  # the Piper voice's espeak-ng voice
    assert out["text"] == "The weather is nice today. I would like a cup of coffee."
    assert [s["text"] for s in out["sentences"]] == ["The weather is nice today.", "I would like a cup of coffee."]
    first, second = (s["phonemes"] for s in out["sentences"])
    assert "wˈɛðɚ" in first and "tədˈeɪ" in first  # weather, today: IPA with espeak's stress marks
    assert "kˈʌp" in second and "kˈɔfi" in second  # cup, coffee: sounds, not the spelling


def test_voice_and_model_fields(tts_server):
    base = phonemes(tts_server, {"input": "Hello world."})[1]
    assert base["sentences"][0]["phonemes"] == "həlˈoʊ wˈɜːld."
    voices = call(tts_server, "GET", "/v1/audio/voices")[1]
    for voice in (voices["voices"][0], 0, "0", "alloy", {"id": voices["voices"][0]}):
        status, out = phonemes(tts_server, {"input": "Hello world.", "voice": voice, "model": "tts-1"})
        assert status == 200 and out == base, voice
    status, out = phonemes(tts_server, {"input": "Hello world.", "model": voices["model"]})
    assert status == 200 and out == base


def test_espeak_sentences_inside_one_of_ours_stay_together(tts_server):
    status, out = phonemes(tts_server, {"input": "Mr. Smith paid five dollars!"})
    assert status == 200
    # our split (the one synthesis uses) cuts after "Mr."; each piece is phonemized as synthesis does it
    assert [s["text"] for s in out["sentences"]] == ["Mr.", "Smith paid five dollars!"]
    assert all(s["phonemes"] for s in out["sentences"])


@pytest.mark.parametrize("body, param, code", [
    ({}, "input", 400),
    ({"input": ""}, "input", 400),
    ({"input": "   \n"}, "input", 400),
    ({"input": 5}, "input", 400),
    ({"input": "x" * 4097}, "input", 400),
    ({"input": "Hi.", "voice": "nobody"}, "voice", 400),
    ({"input": "Hi.", "voice": 7}, "voice", 400),
    ({"input": "Hi.", "voice": -1}, "voice", 400),
    ({"input": "Hi.", "voice": {"name": "x"}}, "voice", 400),
    ({"input": "Hi.", "voice": True}, "voice", 400),
    ({"input": "Hi.", "model": "whisper-1"}, "model", 404),
    ({"input": "Hi.", "model": 3}, "model", 400),
])
def test_bad_input_is_a_4xx_naming_the_field(tts_server, body, param, code):
    status, out = phonemes(tts_server, body)
    assert status == code, out
    assert out["error"]["param"] == param, out
    assert phonemes(tts_server, {"input": "Still here."})[0] == 200


def test_no_tts_model_is_a_503(tiny_server):
    status, out = phonemes(tiny_server, {"input": "Hello."})
    assert status == 503 and "text-to-speech" in out["error"]["message"]
