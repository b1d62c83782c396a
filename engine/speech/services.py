"""Speech services over sherpa-onnx: ASR (N workers, each owning its recognizers), TTS (one worker)
and VAD (one worker). Each worker thread owns its sherpa-onnx objects and takes jobs from a bounded
queue; callers on the event loop await a future. Nothing here blocks the loop or the LLM scheduler."""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.errors import InvalidRequest, ModelLoadError, QueueFull
from engine.threads import compute, lower_priority

log = logging.getLogger("llamadesk.speech")
ASR_RATE = 16000
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")
MAX_TTS_CHARS = 4096


class _Pool:
    """Worker threads, each owning what `make()` builds, fed from one bounded queue."""

    def __init__(self, name: str, threads: int, max_queue: int, make: Callable[[], Any]):
        self.name = name
        self.queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.jobs = 0
        self.busy = 0
        self.audio_s = 0.0  # seconds of audio processed (for the real-time factor)
        self.compute_s = 0.0
        self.busy_intervals: list[tuple[float, float]] = []  # recent (start, end), monotonic
        self.error: str | None = None
        self._threads = []
        ready = []
        for i in range(threads):
            t = threading.Thread(target=self._run, args=(make, ready), name=f"llamadesk-{name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        for t in self._threads:  # wait until every worker built its objects (or failed)
            while t.is_alive() and len(ready) < len(self._threads):
                time.sleep(0.005)
        failed = [r for r in ready if isinstance(r, BaseException)]
        if failed:
            self.close()
            raise failed[0]

    def _run(self, make: Callable[[], Any], ready: list) -> None:
        lower_priority()  # compete with the LLM scheduler as an equal; the event loop comes first
        try:
            owned = make()
        except BaseException as e:  # reported by __init__
            ready.append(e)
            return
        ready.append(True)
        while True:
            job = self.queue.get()
            if job is None:
                return
            fn, fut, loop = job
            self.busy += 1
            t0 = time.monotonic()
            try:
                with compute.speech_job():
                    result, audio_s = fn(owned)
                err = None
            except BaseException as e:  # delivered to the awaiting caller
                result, audio_s, err = None, 0.0, e
            t1 = time.monotonic()
            self.busy -= 1
            self.jobs += 1
            self.audio_s += audio_s
            self.compute_s += t1 - t0
            self.busy_intervals = (self.busy_intervals + [(t0, t1)])[-64:]
            loop.call_soon_threadsafe(_settle, fut, result, err)

    async def run(self, fn: Callable[[Any], tuple[Any, float]]) -> Any:
        """Run fn(owned) on a worker; fn returns (result, seconds of audio it handled)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        try:
            self.queue.put_nowait((fn, fut, loop))
        except queue.Full:
            raise QueueFull(f"the {self.name} queue is full ({self.queue.maxsize} waiting); retry later") from None
        return await fut

    def stats(self) -> dict[str, Any]:
        return {"state": "busy" if self.busy else "idle", "queued": self.queue.qsize(), "jobs": self.jobs,
                "workers": len(self._threads),
                "rtf": round(self.compute_s / self.audio_s, 4) if self.audio_s else None}

    def close(self) -> None:
        for _ in self._threads:
            try:
                self.queue.put_nowait(None)
            except queue.Full:
                pass


def _settle(fut: asyncio.Future, result: Any, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(result)


# ---- VAD --------------------------------------------------------------------------------------

class VadService:
    """Speech spans of a clip (Silero VAD), one worker."""

    def __init__(self, model: Path):
        import sherpa_onnx
        self.path = Path(model)
        if not self.path.is_file():
            raise ModelLoadError(f"VAD model not found: {self.path}")

        def config():
            cfg = sherpa_onnx.VadModelConfig()
            cfg.silero_vad.model = str(self.path)
            cfg.silero_vad.threshold = 0.5
            cfg.silero_vad.min_silence_duration = 0.3
            cfg.silero_vad.min_speech_duration = 0.2
            cfg.silero_vad.window_size = 512
            cfg.sample_rate = ASR_RATE
            cfg.num_threads = 1
            if not cfg.validate():
                raise ModelLoadError(f"{self.path} is not a Silero VAD model sherpa-onnx accepts")
            return cfg
        self.pool = _Pool("vad", 1, 32, config)

    async def spans(self, samples: np.ndarray) -> list[tuple[float, float]]:
        """[(start, end)] in seconds of the speech in 16 kHz samples."""
        def job(cfg):
            import sherpa_onnx
            vad = sherpa_onnx.VoiceActivityDetector(cfg, buffer_size_in_seconds=max(30, len(samples) / ASR_RATE + 1))
            out: list[tuple[float, float]] = []
            window = cfg.silero_vad.window_size

            def drain():
                while not vad.empty():
                    seg = vad.front
                    out.append((seg.start / ASR_RATE, (seg.start + len(seg.samples)) / ASR_RATE))
                    vad.pop()
            for i in range(0, len(samples), window):
                vad.accept_waveform(samples[i:i + window])
                drain()
            vad.flush()
            drain()
            return out, len(samples) / ASR_RATE
        return await self.pool.run(job)


# ---- ASR --------------------------------------------------------------------------------------

@dataclass
class AsrModel:
    """What an ASR model directory holds and how to build its recognizer."""

    id: str
    kind: str
    path: Path
    files: dict[str, str]
    multilingual: bool = False

    @property
    def can_translate(self) -> bool:
        return self.kind == "whisper" and self.multilingual

    def recognizer(self, task: str, language: str | None):
        import sherpa_onnx
        R = sherpa_onnx.OfflineRecognizer
        f = self.files
        if self.kind == "whisper":
            return R.from_whisper(encoder=f["encoder"], decoder=f["decoder"], tokens=f["tokens"],
                                  language=language or ("" if self.multilingual else "en"), task=task, num_threads=1)
        if self.kind == "moonshine":
            return R.from_moonshine(preprocessor=f["preprocess"], encoder=f["encode"], uncached_decoder=f["uncached"],
                                    cached_decoder=f["cached"], tokens=f["tokens"], num_threads=1)
        if self.kind == "transducer":
            return R.from_transducer(encoder=f["encoder"], decoder=f["decoder"], joiner=f["joiner"],
                                     tokens=f["tokens"], num_threads=1, model_type="nemo_transducer")
        if self.kind == "sense_voice":
            return R.from_sense_voice(model=f["model"], tokens=f["tokens"], num_threads=1, use_itn=True)
        if self.kind == "paraformer":
            return R.from_paraformer(paraformer=f["model"], tokens=f["tokens"], num_threads=1)
        if self.kind == "nemo_ctc":
            return R.from_nemo_ctc(model=f["model"], tokens=f["tokens"], num_threads=1)
        raise ModelLoadError(f"unsupported ASR model type {self.kind}")


def _one(d: Path, pattern: str) -> str | None:
    hits = sorted(d.glob(pattern))
    hits = [h for h in hits if "int8" in h.name] or hits  # prefer the int8 export when both ship
    return str(hits[0]) if hits else None


def _model_dir(path: Path, what: str) -> Path:
    """The directory holding a model (the one given, or the one around a given file)."""
    d = Path(path)
    if d.is_file():
        d = d.parent
    if not d.is_dir():
        raise ModelLoadError(f"{what} model not found: {path}")
    return d


def sniff_asr(path: Path) -> AsrModel:
    """Recognise the model type from the files in a directory (or beside a file)."""
    d = _model_dir(path, "ASR")
    tokens = _one(d, "*tokens.txt")
    enc, dec, joiner = _one(d, "*encoder*.onnx"), _one(d, "*decoder*.onnx"), _one(d, "*joiner*.onnx")
    if _one(d, "preprocess*.onnx") and tokens:
        return AsrModel(d.name, "moonshine", d, {"preprocess": _one(d, "preprocess*.onnx"),
                                                 "encode": _one(d, "encode*.onnx"),
                                                 "uncached": _one(d, "uncached_decode*.onnx"),
                                                 "cached": _one(d, "cached_decode*.onnx"), "tokens": tokens})
    if enc and dec and joiner and tokens:
        return AsrModel(d.name, "transducer", d, {"encoder": enc, "decoder": dec, "joiner": joiner, "tokens": tokens})
    if enc and dec and tokens:  # sherpa-onnx's whisper export: <name>-encoder/-decoder.onnx, <name>-tokens.txt
        multilingual = not Path(enc).name.split("-encoder")[0].endswith(".en")
        return AsrModel(d.name, "whisper", d, {"encoder": enc, "decoder": dec, "tokens": tokens}, multilingual)
    model = _one(d, "model*.onnx")
    if model and tokens:
        name = d.name.lower()
        kind = "sense_voice" if "sense" in name else "paraformer" if "paraformer" in name else "nemo_ctc"
        return AsrModel(d.name, kind, d, {"model": model, "tokens": tokens})
    raise ModelLoadError(f"{d} does not look like a sherpa-onnx ASR model (whisper, moonshine, NeMo transducer/CTC, "
                         "SenseVoice or Paraformer)")


@dataclass
class Transcript:
    """What a transcription found."""

    text: str
    segments: list[dict[str, Any]] = field(default_factory=list)  # {"id", "start", "end", "text"}
    duration: float = 0.0
    language: str = "en"


class AsrService:
    """Transcription and translation; long audio is split at the VAD's speech spans."""

    MAX_CHUNK_S = 28.0  # whisper reads 30 s windows

    def __init__(self, path: Path, workers: int, vad: VadService | None):
        self.model = sniff_asr(path)
        self.vad = vad
        model = self.model
        model.recognizer("transcribe", None)  # fail now, on the caller's thread, if it cannot load

        def make() -> dict:
            return {("transcribe", None): model.recognizer("transcribe", None)}
        self.pool = _Pool("asr", max(1, workers), 32, make)

    @property
    def id(self) -> str:
        return self.model.id

    async def transcribe(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                         segments: bool = True) -> Transcript:
        """Text and timed segments of 16 kHz mono samples. With segments, every speech span is decoded on
        its own (its own timestamps); without, spans are merged into windows of up to 28 s — whisper pads
        every input to a 30 s window, so fewer, fuller windows cost less."""
        if task == "translate" and not self.model.can_translate:
            raise InvalidRequest(f"model '{self.id}' cannot translate: it is an English-only "
                                 f"{self.model.kind} model; translation needs a multilingual whisper model", "model")
        total = len(samples) / ASR_RATE
        if self.vad is not None and (segments or total > self.MAX_CHUNK_S):
            spans = await self.vad.spans(samples)
        else:  # short audio and plain text: one window, no VAD pass needed
            spans = [(0.0, total)]
        if not segments and spans:
            merged = [spans[0]]
            for start, end in spans[1:]:
                if end - merged[-1][0] <= self.MAX_CHUNK_S:
                    merged[-1] = (merged[-1][0], end)
                else:
                    merged.append((start, end))
            spans = merged
        pieces: list[tuple[float, float]] = []
        for start, end in spans:  # whisper reads at most 30 s at a time
            while end - start > self.MAX_CHUNK_S:
                pieces.append((start, start + self.MAX_CHUNK_S))
                start += self.MAX_CHUNK_S
            pieces.append((start, end))
        model = self.model

        def job(owned: dict):
            key = (task, language if model.kind == "whisper" else None)
            if key not in owned:
                owned[key] = model.recognizer(task, key[1])
            rec = owned[key]
            streams = []
            for start, end in pieces:
                st = rec.create_stream()
                pad = int(0.1 * ASR_RATE)  # a little context around each span
                a, b = max(0, int(start * ASR_RATE) - pad), min(len(samples), int(end * ASR_RATE) + pad)
                st.accept_waveform(ASR_RATE, samples[a:b])
                streams.append(st)
            if streams:
                rec.decode_streams(streams)
            texts = [st.result.text.strip() for st in streams]
            return texts, total
        texts = await self.pool.run(job)
        segments = [{"id": i, "start": round(s, 3), "end": round(e, 3), "text": t}
                    for i, ((s, e), t) in enumerate(zip(pieces, texts)) if t]
        return Transcript(" ".join(s["text"] for s in segments), segments, round(total, 3), language or "en")


# ---- TTS --------------------------------------------------------------------------------------

@dataclass
class TtsModel:
    """A text-to-speech model directory."""

    id: str
    kind: str
    path: Path
    files: dict[str, str]
    voices: list[str]
    espeak_voice: str = "en-us"


def sniff_tts(path: Path) -> TtsModel:
    """Recognise a Piper/VITS voice (the types that take phonemes from piper-phonemize here)."""
    d = _model_dir(path, "TTS")
    tokens = _one(d, "tokens.txt")
    if _one(d, "voices.bin"):
        kind = "kokoro" if "kokoro" in d.name.lower() else "kitten"
        raise ModelLoadError(f"{d} is a {kind} model: llamadesk synthesizes with Piper/VITS voices so far "
                             "(kitten, kokoro and matcha need a phonemizer that is not wired in yet)")
    onnx_files = [p for p in sorted(d.glob("*.onnx"))]
    if not onnx_files or not tokens:
        raise ModelLoadError(f"{d} does not look like a sherpa-onnx TTS model (a .onnx voice and tokens.txt)")
    model = onnx_files[0]
    voices, espeak = [], "en-us"
    cfg_path = Path(str(model) + ".json")
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        espeak = cfg.get("espeak", {}).get("voice", espeak)
        ids = cfg.get("speaker_id_map") or {}
        voices = sorted(ids, key=ids.get) if ids else [cfg.get("dataset") or model.stem]
    return TtsModel(d.name, "vits", d, {"model": str(model), "tokens": tokens, "data_dir": ""},
                    voices or [model.stem], espeak)


_SENTENCE = re.compile(r"(?<=[.!?;:])\s+")


class TtsService:
    """Speech from text, one worker; long input is synthesized sentence by sentence."""

    def __init__(self, path: Path):
        self.model = sniff_tts(path)
        m = self.model

        def make():
            import sherpa_onnx
            tts = sherpa_onnx.OfflineTts(sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(
                vits=sherpa_onnx.OfflineTtsVitsModelConfig(model=m.files["model"], tokens=m.files["tokens"]),
                num_threads=1)))
            return tts
        self.pool = _Pool("tts", 1, 16, make)
        self.sample_rate = 22050
        self.speakers = len(m.voices)
        # VITS samples its durations, so the same text never comes out the same twice; recent results
        # are kept so that asking again (another format, a replay, a save) gives the very same audio
        self._recent: OrderedDict[tuple, tuple[np.ndarray, int]] = OrderedDict()

    @property
    def id(self) -> str:
        return self.model.id

    def voice_id(self, voice: str | None) -> int:
        """A voice name (the model's own, or one of OpenAI's) as a speaker id."""
        if not voice:
            return 0
        if voice in self.model.voices:
            return self.model.voices.index(voice)
        if voice in OPENAI_VOICES:
            return OPENAI_VOICES.index(voice) % max(1, self.speakers)
        raise InvalidRequest(f"unknown voice {voice!r}; this model's voices: {', '.join(self.model.voices)} "
                             f"(OpenAI's names map onto them)", "voice")

    @staticmethod
    def sentences(text: str) -> list[str]:
        return [s for s in (p.strip() for p in _SENTENCE.split(text)) if s]

    PAUSE_S = 0.25  # between sentences: VITS ends a sentence with almost no silence

    async def sentences_audio(self, text: str, voice: str | None = None, speed: float = 1.0):
        """(samples, rate) per sentence of text, each but the last followed by a short pause."""
        parts = self.sentences(text)
        for i, sentence in enumerate(parts):
            samples, rate = await self.synthesize(sentence, voice, speed)
            if i < len(parts) - 1:
                samples = np.concatenate([samples, np.zeros(int(self.PAUSE_S * rate / speed), np.float32)])
            yield samples, rate

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
            g.phoneme_codepoints = [[ord(c) for c in p] for p in phonemize_espeak(text, m.espeak_voice)]
            audio = tts.generate(text, g)
            samples = np.asarray(audio.samples, dtype=np.float32)
            return (samples, audio.sample_rate), len(samples) / audio.sample_rate
        samples, rate = await self.pool.run(job)
        self.sample_rate = rate
        self._recent[key] = (samples, rate)
        while len(self._recent) > 32:
            self._recent.popitem(last=False)
        return samples, rate


def check_tts_input(text: Any, speed: Any) -> None:
    """400s for text and speed the API does not accept."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("'input' must be a non-empty string", "input")
    if len(text) > MAX_TTS_CHARS:
        raise InvalidRequest(f"'input' is {len(text)} characters; the limit is {MAX_TTS_CHARS}", "input")
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        raise InvalidRequest(f"'speed' must be a number between 0.25 and 4.0, got {speed!r}", "speed")
