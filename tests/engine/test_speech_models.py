"""Speech model recognition: every TTS family sherpa-onnx runs (Piper/VITS, Kokoro, Kitten, Matcha) is
sniffed from its folder and synthesizes through the real sherpa-onnx, and a model sherpa-onnx would end
the process over (missing metadata, a short voices.bin, no vocoder, a truncated file) is refused with a
load error first. Kokoro, Kitten and Matcha are the stand-ins of tests/assets/tts_standins.py: their
audio is a tone whose length counts the phoneme tokens and whose pitch names the voice."""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from piper_phonemize import phonemize_espeak

from engine.errors import InvalidRequest, ModelLoadError
from engine.speech import onnxinfo
from engine.speech.asr import AsrService, sniff_asr
from engine.speech.tts import TtsService, sniff_tts
from tests.assets import tts_standins as st

TEXT = "The weather is nice today."


def pitch(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def synthesize(path: Path, voice: str | None = None, speed: float = 1.0, text: str = TEXT):
    async def go():
        svc = TtsService(path)
        try:
            return await svc.synthesize(text, voice, speed)
        finally:
            svc.pool.close()
    return asyncio.run(go())


def onnx_files(assets, tts_standins) -> list[Path]:
    return sorted([*Path(assets["whisper"]).glob("*.onnx"), *Path(assets["piper"]).glob("*.onnx"), assets["vad"],
                   *(p for d in tts_standins.values() for p in d.glob("*.onnx"))])


def test_onnx_info_reads_what_the_onnx_package_reads(assets, tts_standins):
    for path in onnx_files(assets, tts_standins):
        info = onnxinfo.read(path)
        model = onnx.load(str(path), load_external_data=False)
        initializers = {t.name for t in model.graph.initializer}
        assert info.metadata == {e.key: e.value for e in model.metadata_props}, path
        assert info.inputs == [i.name for i in model.graph.input if i.name not in initializers], path
        assert info.outputs == [o.name for o in model.graph.output], path


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_onnx_info_refuses_what_is_not_a_model(assets, tmp_path, damage):
    data = (Path(assets["piper"]) / "en_US-joe-medium.onnx").read_bytes()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes({"truncated": data[:len(data) // 2], "garbage": np.random.default_rng(1).bytes(4096),
                     "empty": b""}[damage])
    with pytest.raises(onnxinfo.OnnxFormatError):
        onnxinfo.read(bad)


@pytest.mark.parametrize("family, voices, rate", [
    ("kokoro", list(st.KOKORO_VOICES), st.RATE), ("kitten", list(st.KITTEN_VOICES), st.RATE),
    ("matcha", ["matcha-icefall-en_US-ljspeech"], st.MATCHA_RATE)])
def test_each_family_is_recognised_from_its_folder(tts_standins, family, voices, rate):
    m = sniff_tts(tts_standins[family])
    assert (m.kind, m.voices, m.sample_rate) == (family, voices, rate)
    if family == "matcha":
        assert Path(m.files["vocoder"]).name == "hifigan_v2.onnx"
    else:
        assert Path(m.files["voices"]).name == "voices.bin"


def test_piper_voice_is_still_a_vits_model(assets):
    m = sniff_tts(assets["piper"])
    assert (m.kind, m.voices, m.espeak, m.sample_rate) == ("vits", ["joe"], ["en-us"], 22050)


def test_kokoro_speakers_are_phonemized_in_their_own_language(tts_standins):
    m = sniff_tts(tts_standins["kokoro"])
    assert dict(zip(m.voices, m.espeak)) == {"af_heart": "en-us", "bf_emma": "en", "ef_dora": "es"}
    text = "Buenos días, mi amigo."
    for voice, lang in (("ef_dora", "es"), ("af_heart", "en-us")):
        samples, _ = synthesize(tts_standins["kokoro"], voice, text=text)
        phonemes = sum(len(s) for s in phonemize_espeak(text, lang))
        assert len(samples) == (phonemes + 2) * st.HOP, voice  # Kokoro pads the tokens at both ends


@pytest.mark.parametrize("family", ["kokoro", "kitten", "matcha"])
def test_each_family_synthesizes_the_chosen_voice_at_the_chosen_speed(tts_standins, family):
    path = tts_standins[family]
    voices = sniff_tts(path).voices
    for k, voice in enumerate(voices):
        samples, rate = synthesize(path, voice)
        assert rate == (st.MATCHA_RATE if family == "matcha" else st.RATE)
        assert abs(pitch(samples, rate) - st.VOICE_HZ[k]) < 5, (voice, pitch(samples, rate))
    normal, _ = synthesize(path, voices[0])
    fast, _ = synthesize(path, voices[0], speed=2.0)
    assert len(normal) > 20 * st.HOP and abs(len(fast) / len(normal) - 0.5) < 0.02
    longer, _ = synthesize(path, voices[0], text=TEXT + " " + TEXT)  # twice the phonemes, about twice the audio
    assert 1.8 < len(longer) / len(normal) < 2.2


def test_openai_voice_names_map_onto_the_models_voices(tts_standins):
    samples, rate = synthesize(tts_standins["kokoro"], "echo")  # OpenAI's voices in order, modulo the model's
    assert abs(pitch(samples, rate) - st.VOICE_HZ[("alloy", "ash", "ballad", "coral", "echo").index("echo") % 3]) < 5


def test_voices_can_be_chosen_by_speaker_id(tts_standins):
    for voice in (2, "2"):
        samples, rate = synthesize(tts_standins["kokoro"], voice)
        assert abs(pitch(samples, rate) - st.VOICE_HZ[2]) < 5
    with pytest.raises(InvalidRequest) as err:
        synthesize(tts_standins["kokoro"], "3")
    assert "out of range" in err.value.message and err.value.param == "voice"


def _strip_metadata(path: Path, *keys: str) -> None:
    model = onnx.load(str(path))
    kept = [(e.key, e.value) for e in model.metadata_props if e.key not in keys]
    del model.metadata_props[:]
    for k, v in kept:
        e = model.metadata_props.add()
        e.key, e.value = k, v
    onnx.save(model, str(path))


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("family, damage, says", [
    ("kokoro", lambda d: (d / "voices.bin").write_bytes((d / "voices.bin").read_bytes()[:-4]), "voices.bin"),
    ("kokoro", lambda d: (d / "voices.bin").unlink(), "no voices.bin"),
    ("kokoro", lambda d: _strip_metadata(d / "model.onnx", "style_dim"), "style_dim"),
    ("kokoro", lambda d: (d / "model.onnx").write_bytes((d / "model.onnx").read_bytes()[:300]), "not a readable ONNX"),
    ("kitten", lambda d: _strip_metadata(d / "model.fp16.onnx", "has_espeak"), "has_espeak"),
    ("kitten", lambda d: (d / "tokens.txt").unlink(), "no tokens.txt"),
    ("matcha", lambda d: (d / "hifigan_v2.onnx").unlink(), "no vocoder"),
    ("matcha", lambda d: _strip_metadata(d / "model-steps-3.onnx", "pad_id", "use_eos_bos"), "use_eos_bos"),
    ("paraformer", lambda d: (d / "tokens.txt").write_text(
        "".join(l for l in (d / "tokens.txt").read_text().splitlines(True) if not l.startswith("</s>"))), "</s>"),
    ("sense_voice", lambda d: _strip_metadata(d / "model.int8.onnx", "normalize_samples"), "normalize_samples"),
    ("nemo_ctc", lambda d: (d / "tokens.txt").write_text("a 0\nb 1\n"), "blank"),
    ("nemo_transducer", lambda d: (d / "tokens.txt").write_text("<blk> 0\n▁hel 1\nlo 2\n▁world 3\n<unk> 4\n"),
     "<blk> last"),
])
def test_a_model_sherpa_onnx_would_fail_on_is_refused_first(tts_standins, asr_standins, tmp_path, family, damage,
                                                             says):
    """sherpa-onnx ends the process over most of these (the rest raise an unclear IndexError)."""
    d = _copy({**tts_standins, **asr_standins}[family], tmp_path)
    damage(d)
    with pytest.raises(ModelLoadError) as err:
        TtsService(d) if family in tts_standins else sniff_asr(d)
    assert says in err.value.message


def test_a_whisper_export_without_its_metadata_is_refused_first(assets, tmp_path):
    d = _copy(Path(assets["whisper"]), tmp_path)
    _strip_metadata(next(d.glob("*-encoder.onnx")), "n_mels", "sot_sequence")
    with pytest.raises(ModelLoadError) as err:
        sniff_asr(d)
    assert "n_mels" in err.value.message and "sot_sequence" in err.value.message


def test_whisper_language_support_comes_from_its_metadata(assets):
    assert sniff_asr(assets["whisper"]).can_translate is False  # tiny.en: is_multilingual = 0


def _onnx_with(path: Path, **metadata) -> None:
    """A trivial ONNX graph carrying the metadata a sherpa-onnx export would."""
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for k, v in metadata.items():
        e = model.metadata_props.add()
        e.key, e.value = k, str(v)
    onnx.save(model, str(path))


CMVN = dict(neg_mean=",".join(["0"] * 560), inv_stddev=",".join(["1"] * 560))  # 80 fbank bins x LFR window 7
SENSE_VOICE = dict(model_type="sense_voice_ctc", vocab_size=25055, lfr_window_size=7, lfr_window_shift=6,
                   with_itn=14, without_itn=15, lang_auto=0, lang_zh=3, lang_en=4, lang_ja=11, lang_ko=12,
                   lang_yue=7, normalize_samples=0, **CMVN)
PARAFORMER = dict(model_type="paraformer", vocab_size=8404, lfr_window_size=7, lfr_window_shift=6, **CMVN)
NEMO_CTC = dict(model_type="EncDecCTCModelBPE", vocab_size=1024, subsampling_factor=8, normalize_type="per_feature")
NEMO_ENCODER = dict(model_type="EncDecRNNTBPEModel", vocab_size=1024, subsampling_factor=8, pred_rnn_layers=1,
                    pred_hidden=640, normalize_type="per_feature")


@pytest.mark.parametrize("folder, files, kind", [
    ("sherpa-onnx-model-a", {"model.int8.onnx": SENSE_VOICE}, "sense_voice"),
    ("sherpa-onnx-model-b", {"model.int8.onnx": PARAFORMER}, "paraformer"),
    ("sherpa-onnx-model-c", {"model.onnx": NEMO_CTC}, "nemo_ctc"),
    ("sherpa-onnx-model-d", {"encoder.onnx": NEMO_ENCODER, "decoder.onnx": {}, "joiner.onnx": {},
                             "tokens.txt": "".join(f"t{i} {i}\n" for i in range(1024)) + "<blk> 1024\n"},
     "nemo_transducer"),
    ("sherpa-onnx-model-f", {"preprocess.onnx": {}, "encode.int8.onnx": {}, "uncached_decode.int8.onnx": {},
                             "cached_decode.int8.onnx": {}}, "moonshine"),
    ("sherpa-onnx-model-g", {"encoder_model.ort": None, "decoder_model_merged.ort": None}, "moonshine_v2"),
    ("sherpa-onnx-model-e", {"encoder-epoch-99.onnx": {"model_type": "zipformer2"},
                             "decoder-epoch-99.onnx": {"vocab_size": 500, "context_size": 2},
                             "joiner-epoch-99.onnx": {}}, "transducer"),
])
def test_asr_families_are_told_apart_by_their_metadata(tmp_path, folder, files, kind):
    d = tmp_path / folder  # a name that says nothing: the metadata decides
    d.mkdir()
    (d / "tokens.txt").write_text("<blk> 0\n</s> 1\na 2\n")
    for name, meta in files.items():
        if meta is None:  # ONNX Runtime's own format, which llamadesk does not read
            (d / name).write_bytes(b"ORTM")
        elif isinstance(meta, str):
            (d / name).write_text(meta)
        else:
            _onnx_with(d / name, **meta)
    assert sniff_asr(d).kind == kind


@pytest.mark.parametrize("files, missing", [
    ({"model.onnx": {k: v for k, v in SENSE_VOICE.items() if k != "lang_yue"}}, "lang_yue"),
    ({"model.onnx": {k: v for k, v in NEMO_CTC.items() if k != "subsampling_factor"}}, "subsampling_factor"),
    ({"encoder.onnx": {}, "decoder.onnx": {"vocab_size": 500}, "joiner.onnx": {}}, "context_size"),
])
def test_asr_models_missing_what_sherpa_onnx_reads_are_refused(tmp_path, files, missing):
    (tmp_path / "tokens.txt").write_text("<blk> 0\n")
    for name, meta in files.items():
        _onnx_with(tmp_path / name, **meta)
    with pytest.raises(ModelLoadError) as err:
        sniff_asr(tmp_path)
    assert missing in err.value.message


@pytest.mark.parametrize("family", ["nemo_ctc", "sense_voice", "paraformer", "nemo_transducer", "transducer",
                                    "moonshine"])
def test_each_asr_family_decodes_through_sherpa_onnx(asr_standins, family):
    """The stand-ins spell PHRASE whatever they hear: the text coming back means sherpa-onnx ran the model with
    the configuration llamadesk built, several spans batched in one decode."""
    from tests.assets.asr_standins import PHRASE
    assert sniff_asr(asr_standins[family]).kind == family
    noise = (0.05 * np.random.default_rng(3).standard_normal(16000 * 40)).astype(np.float32)

    async def go():
        asr = AsrService(asr_standins[family], 1, None)
        try:
            return await asr.transcribe(noise, segments=False)  # 40 s: two windows of up to 28 s, one decode
        finally:
            asr.pool.close()
    t = asyncio.run(go())
    assert [s["text"] for s in t.segments] == [PHRASE, PHRASE] and t.text == f"{PHRASE} {PHRASE}"


def test_sense_voice_normalisation_vectors_must_fit_its_features(asr_standins, tmp_path):
    d = _copy(asr_standins["sense_voice"], tmp_path)
    _set_metadata(d / "model.int8.onnx", neg_mean=",".join(["0"] * 80))
    with pytest.raises(ModelLoadError) as err:
        sniff_asr(d)
    assert "neg_mean holds 80 values" in err.value.message


def test_a_vits_model_that_spells_letters_gets_the_text_itself(tts_standins):
    """MMS voices (frontend = characters) read letters, not espeak phonemes: the token count follows the text's
    letters (with blanks between them), whatever espeak would have made of it."""
    m = sniff_tts(tts_standins["mms"])
    assert (m.kind, m.phonemes, m.sample_rate, m.voices) == ("vits", False, st.RATE, ["vits-mms-eng"])
    short, _ = synthesize(tts_standins["mms"], text="abc")
    longer, _ = synthesize(tts_standins["mms"], text="abc abc abc")  # 11 letters and spaces instead of 3
    assert (len(longer) - len(short)) == 2 * 8 * st.HOP  # each extra character brings itself and a blank
    assert sum(len(p) for p in phonemize_espeak("abc", "en-us")) != 3  # espeak would have said "eɪ biː siː"


def _set_metadata(path: Path, **values: str) -> None:
    model = onnx.load(str(path))
    for e in model.metadata_props:
        if e.key in values:
            e.value = values[e.key]
    onnx.save(model, str(path))


@pytest.mark.parametrize("values, says", [
    ({"frontend": "", "comment": "icefall"}, "own lexicon"),  # a VITS voice reading text through lexicon.txt
    ({"comment": ""}, "comment"),  # sherpa-onnx treats an empty value as absent (and exits)
])
def test_vits_models_llamadesk_cannot_feed_are_refused_with_a_reason(tts_standins, tmp_path, values, says):
    d = _copy(tts_standins["mms"], tmp_path)
    _set_metadata(d / "model.onnx", **values)
    with pytest.raises(ModelLoadError) as err:
        sniff_tts(d)
    assert says in err.value.message
