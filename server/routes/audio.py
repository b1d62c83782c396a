"""Speech routes: transcriptions, translations, speech, phonemes, voices, and /vad."""
from __future__ import annotations

import asyncio
import base64
import math
from typing import Annotated, Any, Literal, Union

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam, BodyPartReader, MultipartReader
from pydantic import AfterValidator, Field, WithJsonSchema

from engine.errors import InvalidRequest, ModelNotFound, PayloadTooLarge, UnsupportedMediaType
from engine.speech import audio
from engine.speech.audio import ASR_RATE
from engine.speech.tts import OPENAI_VOICES, check_tts_input
from engine.speech.subtitles import subtitles
from server import sse
from server.errors import MAX_UPLOAD_KEY
from server.keys import CONFIG, SERVICE
from server.schemas import read_json
from server.shapes import M, Shape, documents, parse, refuse

routes = web.RouteTableDef()
ASR_ALIASES = {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"}
TTS_ALIASES = {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MAX_VAD_S = 120.0
CONCATENATE = ("pcm", "mp3", "aac")  # formats whose pieces, sent one after another, make one valid stream
LANGUAGES = {"en": "english"}
LIST_FIELDS = {"timestamp_granularities"}  # the form fields that take several values (sent as name[])


# ---- the bodies: JSON for speech and phonemes, multipart forms (text fields and a file) for the uploads --------

def _form_bool(value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise refuse(f"must be true or false, got {value!r}")
    return word == "true"


FormBool = Annotated[str, AfterValidator(_form_bool), WithJsonSchema({"type": "boolean"})]
# form values are text: a number's field parses it ("0.2"), NaN and Infinity refused as anywhere
FormNumber = Annotated[float, Field(strict=False, ge=0, le=1)]
Upload = Annotated[bytes, WithJsonSchema({"type": "string", "format": "binary"})]


def _voice_id(ref: dict[str, Any]) -> str:
    vid = ref.get("id")
    if not isinstance(vid, str) or not vid:
        raise refuse("as an object needs a string 'id' naming one of the model's voices")
    return vid


# a voice name, a speaker id, or OpenAI's custom-voice object {"id": name} (read as its name)
Voice = Union[str, Annotated[int, Field(ge=0)],
              Annotated[dict[str, Any], AfterValidator(_voice_id),
                        WithJsonSchema({"type": "object", "properties": {"id": {"type": "string"}},
                                        "required": ["id"]})]]


class TranscriptionForm(Shape):
    """POST /v1/audio/transcriptions' and /translations' multipart form."""

    file: Upload = Field(description="the audio: any format FFmpeg decodes")
    model: str | None = None
    response_format: Literal[TRANSCRIPT_FORMATS] = "json"
    language: str | None = None  # a hint; "" or absent: detected
    prompt: str | None = None  # accepted: the recognizers here take no prompt
    temperature: FormNumber | None = None  # accepted: the recognizers here decode greedily
    timestamp_granularities: list[Literal["segment", "word"]] | None = None
    stream: FormBool | None = None  # true: transcript.text.delta events as each speech span is decoded


class VadForm(Shape):
    """POST /vad's multipart form."""

    file: Upload = Field(description="the clip to scan for speech (at most two minutes)")


class SpeechRequest(Shape):
    """POST /v1/audio/speech."""

    input: str | None = None  # checked with the speed by the TTS model's bounds (check_tts_input)
    model: str | None = None
    voice: Voice | None = None
    speed: float | None = None  # 0.25 to 4
    response_format: Literal[tuple(audio.FORMATS)] = "wav"
    stream_format: Literal["audio", "sse"] | None = None  # sse: speech.audio.delta events
    instructions: str | None = None  # accepted: the voices here take no instructions


async def read_upload(request: web.Request, shape: type[M], route: str) -> M:
    """A multipart upload's text fields and file (as `file`) validated as shape."""
    fields, data = await read_form(request)
    return parse(shape, {**fields, **({"file": data} if data is not None else {})}, route)


async def read_form(request: web.Request) -> tuple[dict[str, Any], bytes | None]:
    """Text fields and the uploaded file of a multipart/form-data request: 413 over the upload limit (declared
    or counted as the body arrives), 415 for another media type, 400 for a body that is no well-formed form."""
    limit = request.app[MAX_UPLOAD_KEY]
    if request.content_length is not None and request.content_length > limit:  # refused before a byte is read
        raise PayloadTooLarge(f"the request declares {request.content_length} bytes; uploads take at most "
                              f"{limit // 2**20} MB (--max-upload-mb)", "file")
    if request.content_type != "multipart/form-data":
        got = request.headers.get("Content-Type")
        raise UnsupportedMediaType("send the audio as multipart/form-data with a 'file' field "
                                   + (f"(got {got!r})" if got else "(the request had no Content-Type)"), "file")
    try:
        reader = await request.multipart()
    except ValueError as e:  # no boundary, or one over 70 characters
        raise _malformed(e) from None
    fields: dict[str, Any] = {}
    data = None
    size = 0
    while (part := await _next_part(reader)) is not None:
        chunks = []
        while chunk := await _read_chunk(part):
            size += len(chunk)  # every part counts: a text field can be as large as a file
            if size > limit:
                raise PayloadTooLarge(f"the upload is larger than {limit // 2**20} MB (--max-upload-mb)", "file")
            chunks.append(chunk)
        name = _part_name(part)  # after the part is read: a body cut short in its headers says so
        if name == "file":
            data = b"".join(chunks)
            continue
        try:
            value = b"".join(chunks).decode(part.get_charset("utf-8"))
        except (UnicodeDecodeError, LookupError) as e:
            raise InvalidRequest(f"form field {name!r} is not text in its charset: {e}", name) from None
        if name.endswith("[]") and name[:-2] in LIST_FIELDS:
            fields.setdefault(name[:-2], []).append(value)
        elif name.endswith("[]") or name in fields:
            raise InvalidRequest(f"form field {name!r}: '{name.removesuffix('[]')}' takes one value", name)
        else:
            fields[name] = value
    return fields, data


# What aiohttp's multipart reader raises for a body that is no well-formed multipart (a connection that drops
# raises ConnectionResetError instead: no one is left to answer): ValueError for a missing, wrong or truncated
# boundary and a body that ends early; BadHttpMessage for part headers that are no headers (no colon, a line
# over 8190 bytes, more than 128 of them) and a chunked body whose chunks are broken.
_MALFORMED = (ValueError, BadHttpMessage)
# aiohttp warns of a Content-Disposition it cannot parse and reads no name from it; the warnings are raised
# only where warnings are errors (the tests), and mean the same then
_BAD_DISPOSITION = (BadContentDispositionHeader, BadContentDispositionParam)
_NO_NAME = ("malformed multipart/form-data: every part needs a 'Content-Disposition: form-data; name=\"...\"' "
            "header (the audio goes in the part named 'file')")


def _malformed(e: Exception) -> InvalidRequest:
    """The 400 for a body aiohttp cannot read as multipart, with its reason."""
    reason = e.message if isinstance(e, BadHttpMessage) else str(e)  # BadHttpMessage's str() prefixes "400, message:"
    return InvalidRequest(f"malformed multipart/form-data: {reason}", "file")


async def _next_part(reader: MultipartReader) -> BodyPartReader | None:
    """The next part of the form (None after the last), refusing nested multipart parts."""
    try:
        part = await reader.next()
    except (*_MALFORMED, RuntimeError) as e:  # RuntimeError: a _charset_ part longer than any charset name
        raise _malformed(e) from None
    except _BAD_DISPOSITION:
        raise InvalidRequest(_NO_NAME, "file") from None
    if isinstance(part, MultipartReader):
        raise InvalidRequest("malformed multipart/form-data: a part is itself multipart; send the audio as one "
                             "'file' part", "file")
    return part


async def _read_chunk(part: BodyPartReader) -> bytes:
    """The next bytes of a part, as sent (no Content-Transfer-Encoding applied: RFC 7578 deprecates it)."""
    try:
        return await part.read_chunk(1 << 20)
    except _MALFORMED as e:
        raise _malformed(e) from None


def _part_name(part: BodyPartReader) -> str:
    """The form field a part carries (RFC 7578: every part names one in its Content-Disposition)."""
    try:
        name = part.name
    except _BAD_DISPOSITION:
        name = None
    if not name:
        raise InvalidRequest(_NO_NAME, "file")
    return name


def _asr(request: web.Request, model: str | None):
    svc = request.app[SERVICE].speech.get("asr")
    if model and model != svc.id and model not in ASR_ALIASES:
        raise ModelNotFound(f"The model '{model}' does not exist; speech-to-text model: {svc.id} "
                            f"(or {', '.join(sorted(ASR_ALIASES))})", "model")
    return svc


async def _transcribe(request: web.Request, task: str) -> web.Response:
    form = await read_upload(request, TranscriptionForm, f"audio.{task}")
    fmt, language = form.response_format, form.language or None
    svc = _asr(request, form.model)
    samples = await asyncio.to_thread(audio.decode, form.file, ASR_RATE, request.app[CONFIG].max_audio_s,
                                      "the most a transcription decodes (--max-audio-s)")  # FFmpeg: off the loop
    if form.stream:
        return await _transcript_events(request, svc, samples, language, task)
    result = await svc.transcribe(samples, language, task, segments=fmt in ("verbose_json", "srt", "vtt"))
    if fmt == "text":
        return web.Response(text=result.text + "\n", content_type="text/plain")
    if fmt in ("srt", "vtt"):
        return web.Response(text=subtitles(result.segments, fmt),
                            content_type="text/plain" if fmt == "srt" else "text/vtt")
    usage = {"type": "duration", "seconds": math.ceil(result.duration)}  # what OpenAI bills whisper by
    if fmt == "json":
        return web.json_response({"text": result.text, "usage": usage})
    segments = [{"id": s["id"], "seek": 0, "start": s["start"], "end": s["end"], "text": s["text"], "tokens": [],
                 "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}
                for s in result.segments]
    return web.json_response({"task": task, "language": LANGUAGES.get(result.language, result.language),
                              "duration": result.duration, "text": result.text, "segments": segments,
                              "usage": usage})


async def _transcript_events(request: web.Request, svc, samples: np.ndarray, language: str | None,
                             task: str) -> web.StreamResponse:
    """`stream=true`: a transcript.text.delta per speech span as soon as it is decoded, then
    transcript.text.done with the whole text (whatever the response_format, as OpenAI does)."""
    pieces = svc.transcribe_stream(samples, language, task)
    first = await anext(pieces, None)  # errors (a translation refused) still come back as a 4xx
    resp = await sse.open_stream(request)
    texts = []
    segment = first
    while segment is not None:
        delta = (" " if texts else "") + segment["text"]
        texts.append(segment["text"])
        await resp.write(sse.event({"type": "transcript.text.delta", "delta": delta}))
        segment = await anext(pieces, None)
    await resp.write(sse.event({"type": "transcript.text.done", "text": " ".join(texts)}))
    await resp.write_eof()
    return resp


@documents("POST", "/v1/audio/transcriptions", "Transcribe audio (OpenAI Audio; multipart form)", TranscriptionForm)
@routes.post("/v1/audio/transcriptions")
async def transcriptions(request: web.Request) -> web.Response:
    return await _transcribe(request, "transcribe")


@documents("POST", "/v1/audio/translations", "Translate audio into English text (OpenAI Audio; multipart form)",
           TranscriptionForm)
@routes.post("/v1/audio/translations")
async def translations(request: web.Request) -> web.Response:
    return await _transcribe(request, "translate")


@documents("POST", "/v1/audio/speech", "Speak a text (OpenAI Audio): audio bytes, or SSE events", SpeechRequest)
@routes.post("/v1/audio/speech")
async def speech(request: web.Request) -> web.StreamResponse:
    body = parse(SpeechRequest, await read_json(request), "audio.speech")
    text, voice, fmt = body.input, body.voice, body.response_format
    speed = 1.0 if body.speed is None else body.speed
    svc = _tts(request, body.model)
    check_tts_input(text, speed)
    svc.voice_id(voice)  # an unknown voice is a 400 before any audio is made
    if body.stream_format == "sse":
        return await _speech_events(request, svc, text, voice, speed, fmt)
    if fmt in CONCATENATE:
        # formats whose pieces concatenate: the first sentence leaves before the last is synthesized
        resp = web.StreamResponse(headers={"Content-Type": audio.FORMATS[fmt][2]})
        await resp.prepare(request)
        async for samples, rate in svc.sentences_audio(text, voice, speed):
            data, _ = await asyncio.to_thread(audio.encode, samples, rate, fmt)
            await resp.write(data)
        await resp.write_eof()
        return resp
    samples, rate = await svc.speak(text, voice, speed)
    data, content_type = await asyncio.to_thread(audio.encode, samples, rate, fmt)
    return web.Response(body=data, content_type=content_type.split(";")[0])


async def _speech_events(request: web.Request, svc, text: str, voice, speed: float, fmt: str) -> web.StreamResponse:
    """OpenAI's `stream_format: "sse"`: speech.audio.delta events (base64 audio, a sentence at a time for the
    formats that concatenate, the whole file at once for the others), then speech.audio.done. The TTS models
    have no tokenizer: usage counts the input's characters."""
    resp = await sse.open_stream(request)
    if fmt in CONCATENATE:
        async for samples, rate in svc.sentences_audio(text, voice, speed):
            data, _ = await asyncio.to_thread(audio.encode, samples, rate, fmt)
            await resp.write(sse.event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}))
    else:
        samples, rate = await svc.speak(text, voice, speed)
        data, _ = await asyncio.to_thread(audio.encode, samples, rate, fmt)
        await resp.write(sse.event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}))
    await resp.write(sse.event({"type": "speech.audio.done",
                                "usage": {"input_tokens": len(text), "output_tokens": 0, "total_tokens": len(text)}}))
    await resp.write_eof()
    return resp


def _tts(request: web.Request, model: str | None):
    svc = request.app[SERVICE].speech.get("tts")
    if model and model != svc.id and model not in TTS_ALIASES:
        raise ModelNotFound(f"The model '{model}' does not exist; text-to-speech model: {svc.id} "
                            f"(or {', '.join(sorted(TTS_ALIASES))})", "model")
    return svc


class PhonemesRequest(Shape):
    """Text to phonemize as the text-to-speech model reads it (no audio is made)."""

    input: str
    voice: Voice | None = None  # as /v1/audio/speech takes it
    model: str | None = None


@documents("POST", "/v1/audio/phonemes", "The normalized text, language and IPA phonemes per sentence that "
           "text-to-speech would read", PhonemesRequest)
@routes.post("/v1/audio/phonemes")
async def phonemes(request: web.Request) -> web.Response:
    """{input, voice?, model?} -> {text, language, sentences: [{text, phonemes}]}: the TTS model's own G2P."""
    body = parse(PhonemesRequest, await read_json(request), "audio.phonemes")
    svc = _tts(request, body.model)
    check_tts_input(body.input, 1.0)
    language, sentences = await svc.phonemes(body.input, body.voice)
    return web.json_response({"text": " ".join(text for text, _ in sentences), "language": language,
                              "sentences": [{"text": text, "phonemes": ipa} for text, ipa in sentences]})


@routes.get("/v1/audio/voices")
async def voices(request: web.Request) -> web.Response:
    svc = request.app[SERVICE].speech.get("tts")
    return web.json_response({"model": svc.id, "voices": svc.model.voices, "openai_voices": list(OPENAI_VOICES)})


@documents("POST", "/vad", "Where a clip has speech: voice-activity spans (multipart form)", VadForm)
@routes.post("/vad")
async def vad(request: web.Request) -> web.Response:
    form = await read_upload(request, VadForm, "vad")
    svc = request.app[SERVICE].speech.get("vad")
    samples = await asyncio.to_thread(audio.decode, form.file, ASR_RATE, MAX_VAD_S,
                                      "the most /vad takes (longer audio: /v1/audio/transcriptions)")
    seconds = len(samples) / ASR_RATE
    spans = await svc.spans(samples)
    return web.json_response({"duration": round(seconds, 3),
                              "spans": [{"start": round(a, 3), "end": round(b, 3)} for a, b in spans]})
