"""Speech routes: transcriptions, translations, speech, phonemes, voices, and /vad."""
from __future__ import annotations

import asyncio
import base64
import math
from typing import Annotated, Any

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam, BodyPartReader, MultipartReader
from pydantic import Field

from engine.errors import InvalidRequest, ModelNotFound, PayloadTooLarge, UnsupportedMediaType
from engine.speech import audio
from engine.speech.audio import ASR_RATE
from engine.speech.tts import OPENAI_VOICES, check_tts_input
from engine.speech.subtitles import subtitles
from server import sse
from server.errors import MAX_UPLOAD_KEY
from server.keys import CONFIG, SERVICE
from server.schemas import Fields, read_json
from server.shapes import Shape, documents, parse

routes = web.RouteTableDef()
ASR_ALIASES = {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"}
TTS_ALIASES = {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MAX_VAD_S = 120.0
CONCATENATE = ("pcm", "mp3", "aac")  # formats whose pieces, sent one after another, make one valid stream
LANGUAGES = {"en": "english"}
LIST_FIELDS = {"timestamp_granularities"}  # the form fields that take several values (sent as name[])


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
    fields, data = await read_form(request)
    if data is None:
        raise InvalidRequest("'file' is required: the audio to transcribe", "file")
    fmt = fields.get("response_format", "json")
    if fmt not in TRANSCRIPT_FORMATS:
        raise InvalidRequest(f"response_format must be one of {', '.join(TRANSCRIPT_FORMATS)}, got {fmt!r}",
                             "response_format")
    language = fields.get("language") or None
    svc = _asr(request, fields.get("model"))
    stream = fields.get("stream", "false").strip().lower()
    if stream not in ("true", "false"):
        raise InvalidRequest(f"'stream' must be true or false, got {fields['stream']!r}", "stream")
    Fields(fields, f"audio.{task}").use("model", "response_format", "language", "timestamp_granularities",
                                        "prompt", "temperature", "stream").log_ignored()
    samples = await asyncio.to_thread(audio.decode, data, ASR_RATE, request.app[CONFIG].max_audio_s,
                                      "the most a transcription decodes (--max-audio-s)")  # FFmpeg: off the loop
    if stream == "true":
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


@routes.post("/v1/audio/transcriptions")
async def transcriptions(request: web.Request) -> web.Response:
    return await _transcribe(request, "transcribe")


@routes.post("/v1/audio/translations")
async def translations(request: web.Request) -> web.Response:
    return await _transcribe(request, "translate")


@routes.post("/v1/audio/speech")
async def speech(request: web.Request) -> web.StreamResponse:
    f = Fields(await read_json(request), "audio.speech")
    model = f.get("model", str)
    text = f.get("input", str)
    voice = f.get("voice", (str, int, dict), what="a voice name, a speaker id or {\"id\": name}")
    if isinstance(voice, dict):  # OpenAI's custom-voice object: {"id": ...} names one of the model's voices
        voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise InvalidRequest("'voice' as an object needs a string 'id' naming one of the model's voices", "voice")
    if isinstance(voice, int) and voice < 0:
        raise InvalidRequest(f"'voice' as a speaker id must be >= 0, got {voice}", "voice")
    speed = f.get("speed", float, 1.0)
    fmt = f.get("response_format", str, "wav")
    stream_format = f.get("stream_format", str)
    f.get("instructions", str)
    f.log_ignored()
    svc = _tts(request, model)
    check_tts_input(text, speed)
    if fmt not in audio.FORMATS:
        raise InvalidRequest(f"response_format must be one of {', '.join(audio.FORMATS)}, got {fmt!r}",
                             "response_format")
    if stream_format not in (None, "audio", "sse"):
        raise InvalidRequest(f"stream_format must be 'audio' or 'sse', got {stream_format!r}", "stream_format")
    svc.voice_id(voice)  # an unknown voice is a 400 before any audio is made
    if stream_format == "sse":
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


class VoiceRef(Shape):
    """OpenAI's custom-voice object: its id names one of the model's voices."""

    id: Annotated[str, Field(min_length=1)]


class PhonemesRequest(Shape):
    """Text to phonemize as the text-to-speech model reads it (no audio is made)."""

    input: str
    voice: str | Annotated[int, Field(ge=0)] | VoiceRef | None = None  # as /v1/audio/speech takes it
    model: str | None = None


@documents("POST", "/v1/audio/phonemes", "The normalized text, language and IPA phonemes per sentence that "
           "text-to-speech would read", PhonemesRequest)
@routes.post("/v1/audio/phonemes")
async def phonemes(request: web.Request) -> web.Response:
    """{input, voice?, model?} -> {text, language, sentences: [{text, phonemes}]}: the TTS model's own G2P."""
    body = parse(PhonemesRequest, await read_json(request), "audio.phonemes")
    svc = _tts(request, body.model)
    check_tts_input(body.input, 1.0)
    voice = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
    language, sentences = await svc.phonemes(body.input, voice)
    return web.json_response({"text": " ".join(text for text, _ in sentences), "language": language,
                              "sentences": [{"text": text, "phonemes": ipa} for text, ipa in sentences]})


@routes.get("/v1/audio/voices")
async def voices(request: web.Request) -> web.Response:
    svc = request.app[SERVICE].speech.get("tts")
    return web.json_response({"model": svc.id, "voices": svc.model.voices, "openai_voices": list(OPENAI_VOICES)})


@routes.post("/vad")
async def vad(request: web.Request) -> web.Response:
    _, data = await read_form(request)
    if data is None:
        raise InvalidRequest("'file' is required: the clip to scan for speech", "file")
    svc = request.app[SERVICE].speech.get("vad")
    samples = await asyncio.to_thread(audio.decode, data, ASR_RATE, MAX_VAD_S,
                                      "the most /vad takes (longer audio: /v1/audio/transcriptions)")
    seconds = len(samples) / ASR_RATE
    spans = await svc.spans(samples)
    return web.json_response({"duration": round(seconds, 3),
                              "spans": [{"start": round(a, 3), "end": round(b, 3)} for a, b in spans]})
