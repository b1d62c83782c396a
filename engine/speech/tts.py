"""Text to speech over sherpa-onnx: Piper/VITS, Kokoro, Kitten and Matcha sniffed from a folder (and
checked), phonemized with piper-phonemize (espeak-ng), synthesized sentence by sentence on one worker."""
from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidRequest, ModelLoadError, UnsupportedByModel
from engine.speech import onnxinfo
from engine.speech.modelfiles import check_metadata, metadata_int, model_dir, onnx_info
from engine.speech.pool import WorkerPool

log = logging.getLogger("llamadesk.speech")
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")
MAX_TTS_CHARS = 4096


# What sherpa-onnx's loaders read without a default (it exits the process when one is missing).
_TTS_REQUIRED = {
    "vits": ("sample_rate", "n_speakers", "language", "comment"),
    "kokoro": ("sample_rate", "n_speakers", "has_espeak", "style_dim"),
    "kitten": ("sample_rate", "n_speakers", "has_espeak", "style_dim"),
    "matcha": ("sample_rate", "n_speakers", "use_eos_bos", "pad_id"),
}
_TTS_TYPES = {"vits": "vits", "kokoro": "kokoro", "kitten-tts": "kitten", "matcha-tts": "matcha"}
_VOCODER_TYPES = ("hifigan", "vocos", "matcha-tts vocos")
# Kokoro's speaker names start with a language letter (af_heart: American English, female)
_KOKORO_LANGUAGES = {"a": "en-us", "b": "en", "e": "es", "f": "fr", "h": "hi", "i": "it", "j": "ja",
                     "p": "pt-br", "z": "cmn"}


@dataclass
class TtsModel:
    """A text-to-speech model directory: Piper/VITS, Kokoro, Kitten or Matcha (+ its vocoder)."""

    id: str
    kind: str
    path: Path
    files: dict[str, str]
    voices: list[str]
    espeak: list[str]          # the espeak-ng voice that phonemizes text for each of `voices`
    sample_rate: int
    phonemes: bool = True      # phonemized here (espeak-ng), or the text itself goes in (character models)

    def sherpa_config(self):
        import sherpa_onnx as so
        f = self.files
        if self.kind == "kokoro":
            family = {"kokoro": so.OfflineTtsKokoroModelConfig(model=f["model"], voices=f["voices"], tokens=f["tokens"])}
        elif self.kind == "kitten":
            family = {"kitten": so.OfflineTtsKittenModelConfig(model=f["model"], voices=f["voices"], tokens=f["tokens"])}
        elif self.kind == "matcha":
            family = {"matcha": so.OfflineTtsMatchaModelConfig(acoustic_model=f["model"], vocoder=f.get("vocoder", ""),
                                                               tokens=f["tokens"])}
        else:
            family = {"vits": so.OfflineTtsVitsModelConfig(model=f["model"], tokens=f["tokens"])}
        return so.OfflineTtsConfig(model=so.OfflineTtsModelConfig(num_threads=1, **family))


def _check_styles(kind: str, meta: dict[str, str], model: Path, voices: Path) -> None:
    """voices.bin must hold n_speakers x the style_dim in the metadata (sherpa-onnx exits otherwise)."""
    try:
        dims = [int(x) for x in meta["style_dim"].split(",")]
    except ValueError:
        raise ModelLoadError(f"{model}: metadata style_dim {meta['style_dim']!r} is not a list of integers") from None
    if (kind == "kokoro" and (len(dims) != 3 or dims[1] != 1)) or (kind == "kitten" and len(dims) != 2) \
            or any(d <= 0 for d in dims):
        raise ModelLoadError(f"{model}: metadata style_dim {meta['style_dim']!r} does not fit a {kind} model")
    speakers = metadata_int(meta, "n_speakers", model)
    expected = speakers * int(np.prod(dims)) * 4
    if voices.stat().st_size != expected:
        raise ModelLoadError(f"{voices} holds {voices.stat().st_size} bytes; {speakers} voices of style {dims} "
                             f"need {expected} (a truncated or mismatched voices.bin)")
    if kind == "kitten" and meta.get("model_type") != "kitten-tts":
        raise ModelLoadError(f"{model}: a kitten model needs model_type=kitten-tts in its metadata")


def _kokoro_language(speaker: str, default: str) -> str:
    """The espeak-ng voice for a Kokoro speaker: its name starts with a language and a gender letter."""
    if re.match(r"^[a-z][fm](_|$)", speaker):
        return _KOKORO_LANGUAGES.get(speaker[0], default)
    return default


def _espeak_ok(voice: str) -> bool:
    from piper_phonemize import phonemize_espeak
    try:
        phonemize_espeak("a", voice)
        return True
    except Exception:  # piper-phonemize raises a bare RuntimeError for an unknown voice
        return False


def _find_vocoder(d: Path) -> Path | None:
    """A HiFi-GAN or Vocos vocoder in the model directory or beside it (sherpa-onnx ships them apart)."""
    for where in (d, d.parent):
        for p in sorted(where.glob("*.onnx")):
            if where != d and not any(k in p.name.lower() for k in ("vocos", "hifigan", "vocoder")):
                continue
            try:
                if onnxinfo.read(p).metadata.get("model_type") in _VOCODER_TYPES:
                    return p
            except (OSError, onnxinfo.OnnxFormatError):
                continue
    return None


def sniff_tts(path: Path) -> TtsModel:
    """Recognise a TTS model directory from its files and the metadata sherpa-onnx reads, and check
    everything sherpa-onnx would otherwise end the process over."""
    d = model_dir(path, "TTS")
    model, kind, info = _find_model(d, Path(path))
    meta = info.metadata
    tokens = d / "tokens.txt"
    if not tokens.is_file():
        raise ModelLoadError(f"{d} has no tokens.txt beside {model.name}")
    check_metadata(kind, meta, model, _TTS_REQUIRED[kind])
    spelled = kind == "vits" and meta.get("frontend") == "characters"  # MMS-style: text in, letter by letter
    if kind == "vits" and not spelled and meta.get("has_espeak") != "1" and "piper" not in meta.get("comment", ""):
        raise ModelLoadError(f"{model}: this VITS model reads text through its own lexicon (has_espeak is not 1); "
                             "llamadesk synthesizes VITS voices phonemized by espeak-ng (Piper, Coqui) or spelled "
                             "letter by letter (MMS)")
    files = {"model": str(model), "tokens": str(tokens)}
    if kind in ("kokoro", "kitten"):
        voices_bin = d / "voices.bin"
        if not voices_bin.is_file():
            raise ModelLoadError(f"{d} has no voices.bin (a {kind} model keeps its voices there)")
        _check_styles(kind, meta, model, voices_bin)
        files["voices"] = str(voices_bin)
    if kind == "matcha" and info.outputs[:1] != ["audio_output"]:
        vocoder = _find_vocoder(d)
        if vocoder is None:
            raise ModelLoadError(f"{d} holds a Matcha acoustic model but no vocoder: put vocos-22khz-univ.onnx or "
                                 f"hifigan_v2.onnx from sherpa-onnx's vocoder-models in {d}")
        files["vocoder"] = str(vocoder)
    names, espeak = _voices(d, model, kind, meta)
    return TtsModel(d.name, kind, d, files, names, espeak, metadata_int(meta, "sample_rate", model),
                    phonemes=not spelled)


def _find_model(d: Path, given: Path) -> tuple[Path, str, onnxinfo.OnnxInfo]:
    """The model file (the one given, or the first .onnx in d whose metadata names a TTS family), its family
    and what sherpa-onnx will read from it."""
    for p in [given] if given.is_file() else sorted(d.glob("*.onnx")):
        if not p.name.endswith(".onnx"):
            continue
        info = onnx_info(p, "TTS")
        kind = _TTS_TYPES.get(info.metadata.get("model_type", ""))
        if kind is None and info.metadata.get("comment") == "piper":
            kind = "vits"
        if kind:
            return p, kind, info
    raise ModelLoadError(f"{d} does not look like a sherpa-onnx TTS model (an .onnx file whose metadata names "
                         "vits, kokoro, kitten-tts or matcha-tts, and tokens.txt)")


def _voices(d: Path, model: Path, kind: str, meta: dict[str, str]) -> tuple[list[str], list[str]]:
    """The voices in speaker-id order, and the espeak-ng voice that phonemizes text for each."""
    speakers = metadata_int(meta, "n_speakers", model)
    default_voice = meta.get("voice") or "en-us"
    names = [n.strip() for n in meta.get("speaker_names", "").split(",") if n.strip()]
    cfg_path = Path(str(model) + ".json")  # a Piper voice's own config
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        default_voice = cfg.get("espeak", {}).get("voice", default_voice)
        ids = cfg.get("speaker_id_map") or {}
        names = sorted(ids, key=ids.get) if ids else [cfg.get("dataset") or model.stem]
    if len(names) != max(1, speakers):
        single = model.stem if kind == "vits" and not model.stem.startswith("model") else d.name
        names = [single] if speakers <= 1 else [f"speaker-{i}" for i in range(speakers)]
    espeak = [_kokoro_language(n, default_voice) if kind == "kokoro" else default_voice for n in names]
    for voice in set(espeak):  # an espeak-ng voice piper-phonemize lacks falls back to American English
        if not _espeak_ok(voice):
            log.warning("%s: espeak-ng has no voice %r; its speakers are phonemized as en-us", d.name, voice)
            espeak = ["en-us" if v == voice else v for v in espeak]
    return names, espeak


_SENTENCE = re.compile(r"(?<=[.!?;:])\s+")


class TtsService:
    """Speech from text, one worker; long input is synthesized sentence by sentence."""

    def __init__(self, path: Path):
        self.model = sniff_tts(path)
        m = self.model

        def make():
            import sherpa_onnx
            return sherpa_onnx.OfflineTts(m.sherpa_config())
        self.pool = WorkerPool("tts", 1, 16, make)
        self.sample_rate = m.sample_rate
        # VITS samples its durations, so the same text never comes out the same twice; recent results
        # are kept so that asking again (another format, a replay, a save) gives the very same audio
        self._recent: OrderedDict[tuple, tuple[np.ndarray, int]] = OrderedDict()

    @property
    def id(self) -> str:
        return self.model.id

    def voice_id(self, voice: str | int | None) -> int:
        """A voice name (the model's own, or one of OpenAI's) or a speaker id (an int or digits) as a speaker id."""
        if voice is None or voice == "":
            return 0
        count = len(self.model.voices)
        sid = None
        if isinstance(voice, int):
            sid = voice
        elif voice.isascii() and voice.isdigit():  # ASCII only: "²".isdigit() holds, yet int("²") fails
            sid = int(voice) if len(voice) < 10 else count  # longer is out of range (int() stops at 4300 digits)
        if sid is not None:
            if 0 <= sid < count:
                return int(sid)
            raise InvalidRequest(f"speaker id {_shown(str(voice))} is out of range: this model has {count} "
                                 f"voices (0-{count - 1})", "voice")
        if voice in self.model.voices:
            return self.model.voices.index(voice)
        if voice in OPENAI_VOICES:
            return OPENAI_VOICES.index(voice) % count
        raise InvalidRequest(f"unknown voice {_shown(voice)!r}; this model's voices: {', '.join(self.model.voices)} "
                             f"(OpenAI's names map onto them)", "voice")

    @staticmethod
    def sentences(text: str) -> list[str]:
        return [s for s in (p.strip() for p in _SENTENCE.split(text)) if s]

    async def phonemes(self, text: str, voice: str | int | None = None) -> tuple[str, list[tuple[str, str]]]:
        """What synthesis reads, without synthesizing: the espeak-ng voice (language) and each sentence with its
        IPA phonemes, from the same piper-phonemize call and sentence split. On the TTS worker: espeak-ng is one
        process-wide state, not to be entered from two threads."""
        m = self.model
        sid = self.voice_id(voice)
        if not m.phonemes:
            raise UnsupportedByModel(f"TTS model '{m.id}' reads text letter by letter: it has no phonemes", "model")
        language = m.espeak[sid]
        sentences = self.sentences(text)

        def job(_tts):
            from piper_phonemize import phonemize_espeak
            # espeak-ng may end a sentence where ours goes on (after "Mr."): its pieces, a space apart
            return [(s, " ".join("".join(p) for p in phonemize_espeak(s, language))) for s in sentences], 0.0
        return language, await self.pool.run(job)

    PAUSE_S = 0.25  # between sentences: VITS ends a sentence with almost no silence

    async def sentences_audio(self, text: str, voice: str | None = None, speed: float = 1.0):
        """(samples, rate) per sentence of text, each but the last followed by a short pause."""
        parts = self.sentences(text)
        for i, sentence in enumerate(parts):
            samples, rate = await self.synthesize(sentence, voice, speed)
            if i < len(parts) - 1:
                samples = np.concatenate([samples, np.zeros(int(self.PAUSE_S * rate / speed), np.float32)])
            yield samples, rate

    async def speak(self, text: str, voice: str | None = None, speed: float = 1.0) -> tuple[np.ndarray, int]:
        """The whole text as one clip: its sentences with short pauses between them."""
        parts = [part async for part in self.sentences_audio(text, voice, speed)]
        return np.concatenate([samples for samples, _ in parts]), parts[0][1]

    async def synthesize(self, text: str, voice: str | None = None, speed: float = 1.0) -> tuple[np.ndarray, int]:
        """Samples and rate for text (one job, or the recent result for the same request)."""
        sid = self.voice_id(voice)
        m = self.model
        key = (text, sid, float(speed))
        if key in self._recent:
            self._recent.move_to_end(key)
            return self._recent[key]

        def job(tts):
            import sherpa_onnx
            from piper_phonemize import phonemize_espeak
            g = sherpa_onnx.GenerationConfig()
            g.sid, g.speed = sid, speed
            if m.phonemes:
                g.phoneme_codepoints = [[ord(c) for c in p] for p in phonemize_espeak(text, m.espeak[sid])]
            audio = tts.generate(text, g)
            samples = np.asarray(audio.samples, dtype=np.float32)
            return (samples, audio.sample_rate), len(samples) / audio.sample_rate
        samples, rate = await self.pool.run(job)
        self.sample_rate = rate
        self._recent[key] = (samples, rate)
        while len(self._recent) > 32:
            self._recent.popitem(last=False)
        return samples, rate


def _shown(text: str, most: int = 40) -> str:
    """text cut short for an error message."""
    return text if len(text) <= most else text[:most] + "…"


def check_tts_input(text: Any, speed: Any) -> None:
    """400s for text and speed the API does not accept."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("'input' must be a non-empty string", "input")
    if len(text) > MAX_TTS_CHARS:
        raise InvalidRequest(f"'input' is {len(text)} characters; the limit is {MAX_TTS_CHARS}", "input")
    try:
        text.encode("utf-8")  # the phonemizer and sherpa-onnx take UTF-8; a lone surrogate has none
    except UnicodeEncodeError as e:
        raise InvalidRequest(f"'input' holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}), "
                             "which is not Unicode text", "input") from None
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        raise InvalidRequest(f"'speed' must be a number between 0.25 and 4.0, got {speed!r}", "speed")
