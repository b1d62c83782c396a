"""Speech to text over sherpa-onnx: the model families sniffed from a folder (and checked), and the
service that transcribes and translates on N workers, each owning its recognizers."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.errors import InvalidRequest, ModelLoadError
from engine.speech.audio import ASR_RATE
from engine.speech.modelfiles import check_metadata, metadata_int, model_dir, one_file, onnx_info, truthy
from engine.speech.pool import WorkerPool
from engine.speech.vad import VadService


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
    if kind == "whisper" and truthy(meta.get("is_multilingual", "0")):
        required += ("all_language_tokens", "all_language_codes")
    check_metadata(kind, meta, path, required)
    if kind == "whisper" and truthy(meta["is_multilingual"]):
        if len(meta["all_language_tokens"].split(",")) != len(meta["all_language_codes"].split(",")):
            raise ModelLoadError(f"{path}: all_language_tokens and all_language_codes differ in length")


def _token_ids(path: Path) -> dict[str, int | None]:
    """tokens.txt as {symbol: id} (None where the id is not a number)."""
    ids: dict[str, int | None] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").rsplit(" ", 1)
            if len(parts) == 2:
                ids[parts[0]] = int(parts[1]) if parts[1].strip().isdigit() else None
    return ids



def sniff_asr(path: Path) -> AsrModel:
    """Recognise the model type from the files in a directory (or beside a file), and check what
    sherpa-onnx would otherwise end the process over: the metadata it reads, the special tokens it needs."""
    model = _sniff_asr_files(path)
    for role, f in model.files.items():
        if f is None:
            raise ModelLoadError(f"{model.path} is missing the {role} file of a {model.kind} model")
    if model.kind not in _ASR_REQUIRED:  # Moonshine: no metadata read
        return model
    checked = Path(model.files[_ASR_REQUIRED[model.kind][0]])
    meta = onnx_info(checked, "ASR").metadata
    _check_asr_metadata(model.kind, meta, checked)
    tokens_path = model.files["tokens"]
    tokens = _token_ids(Path(tokens_path))
    if model.kind == "whisper":
        model.multilingual = truthy(meta["is_multilingual"])
    elif model.kind == "nemo_ctc" and not tokens.keys() & set(_CTC_BLANKS):
        raise ModelLoadError(f"{tokens_path} has no CTC blank symbol ({', '.join(_CTC_BLANKS)})")
    elif model.kind == "nemo_transducer":  # NeMo counts its vocabulary without the blank, which comes last
        vocab = metadata_int(meta, "vocab_size", checked) + 1
        if tokens.get("<blk>") != vocab - 1 or len(tokens) != vocab:
            raise ModelLoadError(f"{tokens_path} must list {vocab} tokens with the blank <blk> last "
                                 f"(it has {len(tokens)}, <blk> at {tokens.get('<blk>')})")
    elif model.kind == "paraformer" and "</s>" not in tokens:
        raise ModelLoadError(f"{tokens_path} has no </s> (a Paraformer's decoding ends there)")
    if model.kind in ("paraformer", "sense_voice"):
        _check_cmvn(meta, checked)
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
    """The family and files of an ASR folder, from its file layout (and, for one-file models, metadata)."""
    d = model_dir(path, "ASR")
    tokens = one_file(d, "*tokens.txt")
    enc, dec, joiner = one_file(d, "*encoder*.onnx"), one_file(d, "*decoder*.onnx"), one_file(d, "*joiner*.onnx")
    if one_file(d, "preprocess*.onnx") and tokens:
        return AsrModel(d.name, "moonshine", d, {"preprocess": one_file(d, "preprocess*.onnx"),
                                                 "encode": one_file(d, "encode*.onnx"),
                                                 "uncached": one_file(d, "uncached_decode*.onnx"),
                                                 "cached": one_file(d, "cached_decode*.onnx"), "tokens": tokens})
    v2_enc = one_file(d, "encoder_model*.ort") or one_file(d, "encoder_model*.onnx")
    v2_dec = one_file(d, "decoder_model_merged*.ort") or one_file(d, "decoder_model_merged*.onnx")
    if v2_enc and v2_dec and tokens:  # Moonshine v2: an encoder and one merged decoder (ORT format)
        return AsrModel(d.name, "moonshine_v2", d, {"encoder": v2_enc, "decoder": v2_dec, "tokens": tokens})
    if enc and dec and joiner and tokens:  # NeMo's encoder carries its prediction network's shape; icefall's does not
        kind = "nemo_transducer" if "pred_rnn_layers" in onnx_info(Path(enc), "ASR").metadata else "transducer"
        return AsrModel(d.name, kind, d, {"encoder": enc, "decoder": dec, "joiner": joiner, "tokens": tokens})
    if enc and dec and tokens:  # sherpa-onnx's whisper export: <name>-encoder/-decoder.onnx, <name>-tokens.txt
        multilingual = not Path(enc).name.split("-encoder")[0].endswith(".en")
        return AsrModel(d.name, "whisper", d, {"encoder": enc, "decoder": dec, "tokens": tokens}, multilingual)
    model = one_file(d, "model*.onnx")
    if model and tokens:  # one model file: its metadata tells SenseVoice, Paraformer and NeMo CTC apart
        meta, name = onnx_info(Path(model), "ASR").metadata, d.name.lower()
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
        self.pool = WorkerPool("asr", max(1, workers), 32, make)

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
