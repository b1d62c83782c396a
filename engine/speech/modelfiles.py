"""Finding a speech model's files in its folder, and reading what sherpa-onnx will read from them.

sherpa-onnx ends the whole process when a model lacks a metadata key its loader reads, so the ASR and
TTS loaders check those keys here first and turn a bad model into a ModelLoadError."""
from __future__ import annotations

from pathlib import Path

from engine.errors import ModelLoadError
from engine.speech import onnxinfo


def one_file(d: Path, pattern: str) -> str | None:
    """The file in d matching pattern (the int8 export when there are both), or None."""
    hits = sorted(d.glob(pattern))
    hits = [h for h in hits if "int8" in h.name] or hits  # prefer the int8 export when both ship
    return str(hits[0]) if hits else None


def model_dir(path: Path, what: str) -> Path:
    """The directory holding a model (the one given, or the one around a given file)."""
    d = Path(path)
    if d.is_file():
        d = d.parent
    if not d.is_dir():
        raise ModelLoadError(f"{what} model not found: {path}")
    return d


def onnx_info(path: Path, what: str) -> onnxinfo.OnnxInfo:
    """The metadata and graph names of an ONNX file; a ModelLoadError when it is not one."""
    try:
        return onnxinfo.read(path)
    except (OSError, onnxinfo.OnnxFormatError) as e:
        raise ModelLoadError(f"{path} is not a readable ONNX {what} model ({e})") from None


def metadata_int(meta: dict[str, str], key: str, path: Path) -> int:
    """An integer metadata value; a ModelLoadError naming the key when it is missing or not a number."""
    try:
        return int(meta[key])
    except (KeyError, ValueError):
        raise ModelLoadError(f"{path}: metadata '{key}' must be an integer, got {meta.get(key)!r}") from None


def check_metadata(kind: str, meta: dict[str, str], path: Path, required: tuple[str, ...]) -> None:
    """A ModelLoadError naming every required key that is missing or empty."""
    missing = [k for k in required if not meta.get(k, "").strip()]  # sherpa-onnx reads "" as absent
    if missing:
        raise ModelLoadError(f"{path} lacks the metadata sherpa-onnx needs for a {kind} model: "
                             f"{', '.join(missing)} (use the sherpa-onnx release of this model)")


def truthy(value: str) -> bool:
    """A metadata flag as a bool ("1", "true" -> True; "", "0", "false" -> False)."""
    return value.strip() not in ("", "0", "false", "False")
