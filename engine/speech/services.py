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
from engine.speech import onnxinfo
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
        if self.kind == "moonshine_v2":
            return R.from_moonshine_v2(encoder=f["encoder"], decoder=f["decoder"], tokens=f["tokens"], num_threads=1)
        if self.kind in ("transducer", "nemo_transducer"):
            return R.from_transducer(encoder=f["encoder"], decoder=f["decoder"], joiner=f["joiner"],
                                     tokens=f["tokens"], num_threads=1, model_type=self.kind)
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


# The file whose metadata sherpa-onnx reads for each ASR type, and the keys it reads without a default
# (from its model loaders; a missing one ends the process).
_ASR_REQUIRED = {
    "whisper": ("encoder", ("n_mels", "n_text_layer", "n_text_ctx", "n_text_state", "n_vocab", "sot", "eot",
                            "blank_id", "translate", "transcribe", "is_multilingual", "no_timestamps", "no_speech",
                            "sot_sequence")),
    "nemo_transducer": ("encoder", ("vocab_size", "subsampling_factor", "pred_rnn_layers", "pred_hidden")),
    "transducer": ("decoder", ("vocab_size", "context_size")),
    "nemo_ctc": ("model", ("vocab_size", "subsampling_factor")),
    "sense_voice": ("model", ("vocab_size", "lfr_window_size", "lfr_window_shift", "normalize_samples")),
    "paraformer": ("model", ("vocab_size", "lfr_window_size", "lfr_window_shift", "neg_mean", "inv_stddev")),
}
_SENSE_VOICE_TAGS = ("with_itn", "without_itn", "lang_auto", "lang_zh", "lang_en", "lang_ja", "lang_ko", "lang_yue",
                     "neg_mean", "inv_stddev")  # all but FunASR Nano exports
_CTC_BLANKS = ("<blk>", "<eps>", "<blank>")


def _check_asr_metadata(kind: str, meta: dict[str, str], path: Path) -> None:
    required = _ASR_REQUIRED[kind][1]
    if kind == "sense_voice" and "Nano" not in meta.get("comment", ""):
        required += _SENSE_VOICE_TAGS
    if kind == "whisper" and _truthy(meta.get("is_multilingual", "0")):
        required += ("all_language_tokens", "all_language_codes")
    _check_metadata(kind, meta, path, required)
    if kind == "whisper" and _truthy(meta["is_multilingual"]):
        if len(meta["all_language_tokens"].split(",")) != len(meta["all_language_codes"].split(",")):
            raise ModelLoadError(f"{path}: all_language_tokens and all_language_codes differ in length")


def _truthy(value: str) -> bool:
    return value.strip() not in ("", "0", "false", "False")


def _token_symbols(path: Path) -> set[str]:
    symbols = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").rsplit(" ", 1)
            if len(parts) == 2:
                symbols.add(parts[0])
    return symbols


def sniff_asr(path: Path) -> AsrModel:
    """Recognise the model type from the files in a directory (or beside a file), and check what
    sherpa-onnx would otherwise end the process over: the metadata it reads, a CTC blank in tokens.txt."""
    model = _sniff_asr_files(path)
    for role, f in model.files.items():
        if f is None:
            raise ModelLoadError(f"{model.path} is missing the {role} file of a {model.kind} model")
        if f.endswith(".onnx") and role == _ASR_REQUIRED.get(model.kind, ("",))[0]:
            meta = _onnx_info(Path(f), "ASR").metadata
            _check_asr_metadata(model.kind, meta, Path(f))
            if model.kind == "whisper":
                model.multilingual = _truthy(meta["is_multilingual"])
    if model.kind == "nemo_ctc" and not _token_symbols(Path(model.files["tokens"])) & set(_CTC_BLANKS):
        raise ModelLoadError(f"{model.files['tokens']} has no CTC blank symbol ({', '.join(_CTC_BLANKS)})")
    if model.kind == "paraformer" and "</s>" not in _token_symbols(Path(model.files["tokens"])):
        raise ModelLoadError(f"{model.files['tokens']} has no </s> (a Paraformer's decoding ends there)")
    if model.kind in ("paraformer", "sense_voice"):
        _check_cmvn(_onnx_info(Path(model.files["model"]), "ASR").metadata, Path(model.files["model"]))
    return model


def _check_cmvn(meta: dict[str, str], path: Path) -> None:
    """SenseVoice/Paraformer normalise 80 fbank bins x the LFR window with these vectors, read unchecked."""
    if "neg_mean" not in meta:  # FunASR Nano exports carry none
        return
    need = 80 * int(meta["lfr_window_size"]) if meta["lfr_window_size"].strip().isdigit() else -1
    for key in ("neg_mean", "inv_stddev"):
        have = len([v for v in meta[key].split(",") if v.strip()])
        if have != need:
            raise ModelLoadError(f"{path}: metadata {key} holds {have} values; 80 x lfr_window_size = {need} needed")


def _sniff_asr_files(path: Path) -> AsrModel:
    d = _model_dir(path, "ASR")
    tokens = _one(d, "*tokens.txt")
    enc, dec, joiner = _one(d, "*encoder*.onnx"), _one(d, "*decoder*.onnx"), _one(d, "*joiner*.onnx")
    if _one(d, "preprocess*.onnx") and tokens:
        return AsrModel(d.name, "moonshine", d, {"preprocess": _one(d, "preprocess*.onnx"),
                                                 "encode": _one(d, "encode*.onnx"),
                                                 "uncached": _one(d, "uncached_decode*.onnx"),
                                                 "cached": _one(d, "cached_decode*.onnx"), "tokens": tokens})
    v2_enc = _one(d, "encoder_model*.ort") or _one(d, "encoder_model*.onnx")
    v2_dec = _one(d, "decoder_model_merged*.ort") or _one(d, "decoder_model_merged*.onnx")
    if v2_enc and v2_dec and tokens:  # Moonshine v2: an encoder and one merged decoder (ORT format)
        return AsrModel(d.name, "moonshine_v2", d, {"encoder": v2_enc, "decoder": v2_dec, "tokens": tokens})
    if enc and dec and joiner and tokens:  # NeMo's encoder carries its prediction network's shape; icefall's does not
        kind = "nemo_transducer" if "pred_rnn_layers" in _onnx_info(Path(enc), "ASR").metadata else "transducer"
        return AsrModel(d.name, kind, d, {"encoder": enc, "decoder": dec, "joiner": joiner, "tokens": tokens})
    if enc and dec and tokens:  # sherpa-onnx's whisper export: <name>-encoder/-decoder.onnx, <name>-tokens.txt
        multilingual = not Path(enc).name.split("-encoder")[0].endswith(".en")
        return AsrModel(d.name, "whisper", d, {"encoder": enc, "decoder": dec, "tokens": tokens}, multilingual)
    model = _one(d, "model*.onnx")
    if model and tokens:  # one model file: its metadata tells SenseVoice, Paraformer and NeMo CTC apart
        meta, name = _onnx_info(Path(model), "ASR").metadata, d.name.lower()
        if "with_itn" in meta or "lang_auto" in meta or ("sense" in name and "lfr_window_size" not in meta):
            kind = "sense_voice"
        elif "lfr_window_size" in meta or "paraformer" in name:
            kind = "paraformer"
        else:
            kind = "nemo_ctc"
        return AsrModel(d.name, kind, d, {"model": model, "tokens": tokens})
    raise ModelLoadError(f"{d} does not look like a sherpa-onnx ASR model (whisper, moonshine v1/v2, NeMo or icefall "
                         "transducer, NeMo CTC, SenseVoice or Paraformer)")


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
        pieces = await self._pieces(samples, task, segments)
        texts = await self.pool.run(self._job(samples, pieces, task, language, len(samples) / ASR_RATE))
        found = [{"id": i, "start": round(s, 3), "end": round(e, 3), "text": t}
                 for i, ((s, e), t) in enumerate(zip(pieces, texts)) if t]
        return Transcript(" ".join(s["text"] for s in found), found, round(len(samples) / ASR_RATE, 3),
                          language or "en")

    async def transcribe_stream(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                                spans: list[tuple[float, float]] | None = None):
        """The segments of transcribe(), each yielded as soon as it is decoded (one job per speech span);
        spans: the VAD's spans of samples when the caller has them already."""
        pieces = await self._pieces(samples, task, True, spans)
        for i, (start, end) in enumerate(pieces):
            (text,) = await self.pool.run(self._job(samples, [(start, end)], task, language, end - start))
            if text:
                yield {"id": i, "start": round(start, 3), "end": round(end, 3), "text": text}

    async def _pieces(self, samples: np.ndarray, task: str, segments: bool,
                      spans: list[tuple[float, float]] | None = None) -> list[tuple[float, float]]:
        """The (start, end) windows to decode: the VAD's speech spans (merged up to 28 s without segments)."""
        if task == "translate" and not self.model.can_translate:
            raise InvalidRequest(f"model '{self.id}' cannot translate: it is an English-only "
                                 f"{self.model.kind} model; translation needs a multilingual whisper model", "model")
        total = len(samples) / ASR_RATE
        if spans is not None:
            pass
        elif self.vad is not None and (segments or total > self.MAX_CHUNK_S):
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
        return pieces

    def _job(self, samples: np.ndarray, pieces: list[tuple[float, float]], task: str, language: str | None,
             audio_s: float) -> Callable[[dict], tuple[list[str], float]]:
        """A worker job decoding pieces of samples in one batch; audio_s is what it counts towards the RTF."""
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
            return [st.result.text.strip() for st in streams], audio_s
        return job


# ---- TTS --------------------------------------------------------------------------------------

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


def _onnx_info(path: Path, what: str) -> onnxinfo.OnnxInfo:
    try:
        return onnxinfo.read(path)
    except (OSError, onnxinfo.OnnxFormatError) as e:
        raise ModelLoadError(f"{path} is not a readable ONNX {what} model ({e})") from None


def _metadata_int(meta: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(meta[key])
    except (KeyError, ValueError):
        raise ModelLoadError(f"{path}: metadata '{key}' must be an integer, got {meta.get(key)!r}") from None


def _check_metadata(kind: str, meta: dict[str, str], path: Path, required: tuple[str, ...]) -> None:
    missing = [k for k in required if not meta.get(k, "").strip()]  # sherpa-onnx reads "" as absent
    if missing:
        raise ModelLoadError(f"{path} lacks the metadata sherpa-onnx needs for a {kind} model: "
                             f"{', '.join(missing)} (use the sherpa-onnx release of this model)")


def _check_styles(kind: str, meta: dict[str, str], model: Path, voices: Path) -> None:
    """voices.bin must hold n_speakers x the style_dim in the metadata (sherpa-onnx exits otherwise)."""
    try:
        dims = [int(x) for x in meta["style_dim"].split(",")]
    except ValueError:
        raise ModelLoadError(f"{model}: metadata style_dim {meta['style_dim']!r} is not a list of integers") from None
    if (kind == "kokoro" and (len(dims) != 3 or dims[1] != 1)) or (kind == "kitten" and len(dims) != 2) \
            or any(d <= 0 for d in dims):
        raise ModelLoadError(f"{model}: metadata style_dim {meta['style_dim']!r} does not fit a {kind} model")
    speakers = _metadata_int(meta, "n_speakers", model)
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
    d = _model_dir(path, "TTS")
    tokens = d / "tokens.txt"
    candidates = [Path(path)] if Path(path).is_file() else sorted(d.glob("*.onnx"))
    found = None
    for p in candidates:
        if not p.name.endswith(".onnx"):
            continue
        meta = _onnx_info(p, "TTS").metadata
        kind = _TTS_TYPES.get(meta.get("model_type", ""))
        if kind is None and meta.get("comment") == "piper":
            kind = "vits"
        if kind:
            found = (p, kind, meta)
            break
    if found is None:
        raise ModelLoadError(f"{d} does not look like a sherpa-onnx TTS model (an .onnx file whose metadata names "
                             "vits, kokoro, kitten-tts or matcha-tts, and tokens.txt)")
    model, kind, meta = found
    if not tokens.is_file():
        raise ModelLoadError(f"{d} has no tokens.txt beside {model.name}")
    _check_metadata(kind, meta, model, _TTS_REQUIRED[kind])
    files = {"model": str(model), "tokens": str(tokens)}
    if kind in ("kokoro", "kitten"):
        voices_bin = d / "voices.bin"
        if not voices_bin.is_file():
            raise ModelLoadError(f"{d} has no voices.bin (a {kind} model keeps its voices there)")
        _check_styles(kind, meta, model, voices_bin)
        files["voices"] = str(voices_bin)
    if kind == "matcha" and _onnx_info(model, "TTS").outputs[:1] != ["audio_output"]:
        vocoder = _find_vocoder(d)
        if vocoder is None:
            raise ModelLoadError(f"{d} holds a Matcha acoustic model but no vocoder: put vocos-22khz-univ.onnx or "
                                 f"hifigan_v2.onnx from sherpa-onnx's vocoder-models in {d}")
        files["vocoder"] = str(vocoder)
    speakers = _metadata_int(meta, "n_speakers", model)
    sample_rate = _metadata_int(meta, "sample_rate", model)
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
    spelled = kind == "vits" and meta.get("frontend") == "characters"  # MMS-style: text in, letter by letter
    if kind == "vits" and not spelled and meta.get("has_espeak") != "1" and "piper" not in meta.get("comment", ""):
        raise ModelLoadError(f"{model}: this VITS model reads text through its own lexicon (has_espeak is not 1); "
                             "llamadesk synthesizes VITS voices phonemized by espeak-ng (Piper, Coqui) or spelled "
                             "letter by letter (MMS)")
    return TtsModel(d.name, kind, d, files, names, espeak, sample_rate, phonemes=not spelled)


_SENTENCE = re.compile(r"(?<=[.!?;:])\s+")


class TtsService:
    """Speech from text, one worker; long input is synthesized sentence by sentence."""

    def __init__(self, path: Path):
        self.model = sniff_tts(path)
        m = self.model

        def make():
            import sherpa_onnx
            return sherpa_onnx.OfflineTts(m.sherpa_config())
        self.pool = _Pool("tts", 1, 16, make)
        self.sample_rate = m.sample_rate
        self.speakers = len(m.voices)
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
        if isinstance(voice, int) or voice.isdigit():
            if int(voice) < len(self.model.voices):
                return int(voice)
            raise InvalidRequest(f"speaker id {voice} is out of range: this model has {len(self.model.voices)} "
                                 f"voices (0-{len(self.model.voices) - 1})", "voice")
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


def check_tts_input(text: Any, speed: Any) -> None:
    """400s for text and speed the API does not accept."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("'input' must be a non-empty string", "input")
    if len(text) > MAX_TTS_CHARS:
        raise InvalidRequest(f"'input' is {len(text)} characters; the limit is {MAX_TTS_CHARS}", "input")
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        raise InvalidRequest(f"'speed' must be a number between 0.25 and 4.0, got {speed!r}", "speed")
