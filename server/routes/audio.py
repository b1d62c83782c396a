"""Speech routes: transcriptions, translations, speech, voices, and /vad."""
from __future__ import annotations

import asyncio
import base64
import math
from typing import Any

import numpy as np
from aiohttp import web

from engine.errors import InvalidRequest, ModelNotFound
from engine.speech import audio
from engine.speech.audio import ASR_RATE
from engine.speech.tts import OPENAI_VOICES, check_tts_input
from engine.speech.subtitles import subtitles
from server import sse
from server.errors import MAX_UPLOAD_KEY
from server.keys import SERVICE
from server.schemas import Fields, read_json

routes = web.RouteTableDef()
ASR_ALIASES = {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"}
TTS_ALIASES = {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MAX_VAD_S = 120.0
CONCATENATE = ("pcm", "mp3", "aac")  # formats whose pieces, sent one after another, make one valid stream
LANGUAGES = {"en": "english"}


async def read_form(request: web.Request) -> tuple[dict[str, Any], bytes | None]:
    """Text fields and the uploaded file of a multipart request (413 over the upload limit)."""
    if not request.content_type.startswith("multipart/"):
        raise InvalidRequest("send the audio as multipart/form-data with a 'file' field", "file")
    limit = request.app[MAX_UPLOAD_KEY]
    fields: dict[str, Any] = {}
    data = None
    reader = await request.multipart()
    async for part in reader:
        if part.name == "file":
            chunks, size = [], 0
            while chunk := await part.read_chunk(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
                chunks.append(chunk)
            data = b"".join(chunks)
        elif part.name:
            value = await part.text()
            if part.name.endswith("[]"):
                fields.setdefault(part.name[:-2], []).append(value)
            else:
                fields[part.name] = value
    return fields, data


def _asr(request: web.Request, model: str | None):
    svc = request.app[SERVICE].speech("asr")
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
    samples = await asyncio.to_thread(audio.decode, data, ASR_RATE)  # FFmpeg work stays off the loop
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
    svc = request.app[SERVICE].speech("tts")
    if model and model != svc.id and model not in TTS_ALIASES:
        raise ModelNotFound(f"The model '{model}' does not exist; text-to-speech model: {svc.id} "
                            f"(or {', '.join(sorted(TTS_ALIASES))})", "model")
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
    parts = [(samples, rate) async for samples, rate in svc.sentences_audio(text, voice, speed)]
    rate = parts[0][1]
    data, content_type = await asyncio.to_thread(audio.encode, np.concatenate([p for p, _ in parts]), rate, fmt)
    return web.Response(body=data, content_type=content_type.split(";")[0])


async def _speech_events(request: web.Request, svc, text: str, voice, speed: float, fmt: str) -> web.StreamResponse:
    """OpenAI's `stream_format: "sse"`: speech.audio.delta events (base64 audio, a sentence at a time for the
    formats that concatenate, the whole file at once for the others), then speech.audio.done. The TTS models
    have no tokenizer: usage counts the input's characters."""
    resp = await sse.open_stream(request)
    parts = []
    async for samples, rate in svc.sentences_audio(text, voice, speed):
        if fmt in CONCATENATE:
            data, _ = await asyncio.to_thread(audio.encode, samples, rate, fmt)
            await resp.write(sse.event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}))
        else:
            parts.append((samples, rate))
    if parts:
        data, _ = await asyncio.to_thread(audio.encode, np.concatenate([p for p, _ in parts]), parts[0][1], fmt)
        await resp.write(sse.event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}))
    await resp.write(sse.event({"type": "speech.audio.done",
                                "usage": {"input_tokens": len(text), "output_tokens": 0, "total_tokens": len(text)}}))
    await resp.write_eof()
    return resp


@routes.get("/v1/audio/voices")
async def voices(request: web.Request) -> web.Response:
    svc = request.app[SERVICE].speech("tts")
    return web.json_response({"model": svc.id, "voices": svc.model.voices, "openai_voices": list(OPENAI_VOICES)})


@routes.post("/vad")
async def vad(request: web.Request) -> web.Response:
    _, data = await read_form(request)
    if data is None:
        raise InvalidRequest("'file' is required: the clip to scan for speech", "file")
    svc = request.app[SERVICE].speech("vad")
    samples = await asyncio.to_thread(audio.decode, data, ASR_RATE)
    seconds = len(samples) / ASR_RATE
    if seconds > MAX_VAD_S:
        raise InvalidRequest(f"the clip is {seconds:.1f} s long; /vad takes at most {MAX_VAD_S:.0f} s", "file")
    spans = await svc.spans(samples)
    return web.json_response({"duration": round(seconds, 3),
                              "spans": [{"start": round(a, 3), "end": round(b, 3)} for a, b in spans]})
