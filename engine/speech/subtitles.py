"""SubRip and WebVTT text for timed transcript segments."""
from __future__ import annotations


def _timestamp(t: float, sep: str) -> str:
    ms = int(round(t * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def subtitles(segments: list[dict], fmt: str) -> str:
    """SRT ("srt") or WebVTT ("vtt") text for segments with start, end (seconds) and text."""
    if fmt == "srt":
        return "".join(f"{i + 1}\n{_timestamp(s['start'], ',')} --> {_timestamp(s['end'], ',')}\n{s['text']}\n\n"
                       for i, s in enumerate(segments))
    return "WEBVTT\n\n" + "".join(f"{_timestamp(s['start'], '.')} --> {_timestamp(s['end'], '.')}\n{s['text']}\n\n"
                                  for s in segments)
