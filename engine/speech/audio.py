"""Audio in and out with PyAV (FFmpeg): any container the OpenAI API accepts, decoded to mono float32
at the model's rate; synthesized audio encoded as wav, pcm, flac, mp3, opus or aac."""
from __future__ import annotations

import io
import wave

import av
import numpy as np

from engine.errors import InvalidRequest, PayloadTooLarge

ASR_RATE = 16000  # what speech recognition and voice activity detection take: 16 kHz mono
# response_format -> (container, codec, content type, rate the codec requires or None)
FORMATS = {
    "wav": (None, None, "audio/wav", None),
    "pcm": (None, None, "audio/pcm", None),
    "flac": ("flac", "flac", "audio/flac", None),
    "mp3": ("mp3", "libmp3lame", "audio/mpeg", None),
    "opus": ("ogg", "libopus", "audio/ogg", 48000),
    "aac": ("adts", "aac", "audio/aac", None),
}


class BadAudio(InvalidRequest):
    """The upload is not audio FFmpeg can decode, or holds no samples."""


def decode(data: bytes, rate: int, max_s: float | None = None, bound: str = "the limit") -> np.ndarray:
    """Mono float32 samples at `rate` from an encoded file (BadAudio when it is not usable audio). With max_s,
    PayloadTooLarge as soon as more than max_s seconds are decoded: a file's size says nothing of its duration
    (12 h of silence is 8 MB of FLAC), so memory is bounded by max_s x rate instead. `bound` names the limit in
    the message ("the most /vad takes")."""
    if not data:
        raise BadAudio("the audio file is empty", "file")
    most = None if max_s is None else int(max_s * rate)
    chunks: list[np.ndarray] = []
    total = 0

    def keep(frames) -> None:
        nonlocal total
        for out in frames:
            chunks.append(out.to_ndarray().reshape(-1))
            total += chunks[-1].size
            if most is not None and total > most:
                raise PayloadTooLarge(f"the audio lasts more than {max_s:g} s, {bound}", "file")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise BadAudio("the file holds no audio stream", "file")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(streams[0]):
                keep(resampler.resample(frame))
            keep(resampler.resample(None))
    except (BadAudio, PayloadTooLarge):
        raise
    except (av.FFmpegError, ValueError, IndexError) as e:
        raise BadAudio(f"cannot decode the audio file: {e}", "file") from None
    if total == 0:
        raise BadAudio("the audio file holds no samples (zero length)", "file")
    return np.concatenate(chunks).astype(np.float32, copy=False)


def encode(samples: np.ndarray, rate: int, fmt: str) -> tuple[bytes, str]:
    """(bytes, content type) of samples encoded as fmt."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format")
    container_fmt, codec, content_type, need_rate = FORMATS[fmt]
    pcm16 = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    if fmt == "pcm":
        return pcm16.tobytes(), content_type
    if fmt == "wav":
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(pcm16.tobytes())
        return buf.getvalue(), content_type
    buf = io.BytesIO()
    out_rate = need_rate or rate
    with av.open(buf, mode="w", format=container_fmt) as container:
        stream = container.add_stream(codec, rate=out_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm16.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=out_rate)
        for f in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(f):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue(), content_type

