"""The parts of an ONNX file that sherpa-onnx checks when it loads a model — the metadata
(`metadata_props`) and the graph's input and output names — read straight from the protobuf
wire format without loading any weights.

sherpa-onnx ends the whole process (exit -1) when a metadata key it requires is missing or
malformed, so every speech model is checked here first and a bad one becomes a load error
instead. The `onnx` package could parse these files too, but only by reading the whole model
(hundreds of MB for Kokoro) into Python objects; the handful of fields needed here are found by
skipping over everything else in a memory map."""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

# field numbers from onnx.proto
_MODEL_IR_VERSION, _MODEL_GRAPH, _MODEL_METADATA = 1, 7, 14
_GRAPH_INPUT, _GRAPH_OUTPUT, _GRAPH_INITIALIZER = 11, 12, 5
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_VALUE_INFO_NAME = 1
_INITIALIZER_NAME = 8


class OnnxFormatError(ValueError):
    """The file is not a readable ONNX model."""


@dataclass
class OnnxInfo:
    metadata: dict[str, str] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)   # graph inputs that are not initializers
    outputs: list[str] = field(default_factory=list)


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise OnnxFormatError("truncated")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise OnnxFormatError("malformed varint")


def _fields(buf, start: int, end: int):
    """(field number, value) for each field of the message in buf[start:end]; a length-delimited
    value is given as its (start, end) span, other wire types as ints (fixed-size ones skipped)."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, value
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise OnnxFormatError("truncated")
            yield number, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise OnnxFormatError(f"unexpected wire type {wire}")
    if pos != end:
        raise OnnxFormatError("truncated")


def _string(buf, span: tuple[int, int]) -> str:
    return bytes(buf[span[0]:span[1]]).decode("utf-8", "replace")


def _named(buf, span: tuple[int, int], name_field: int) -> str:
    for number, value in _fields(buf, *span):
        if number == name_field and isinstance(value, tuple):
            return _string(buf, value)
    return ""


def read(path: Path | str) -> OnnxInfo:
    """Metadata and graph input/output names of an ONNX file; OnnxFormatError if it is not one."""
    path = Path(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size == 0:
            raise OnnxFormatError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, size)


def _parse(buf, size: int) -> OnnxInfo:
    info = OnnxInfo()
    graph = None
    has_version = False
    for number, value in _fields(buf, 0, size):
        if number == _MODEL_IR_VERSION and isinstance(value, int):
            has_version = True
        elif number == _MODEL_GRAPH and isinstance(value, tuple):
            graph = value
        elif number == _MODEL_METADATA and isinstance(value, tuple):
            key = val = ""
            for n, v in _fields(buf, *value):
                if isinstance(v, tuple):
                    if n == _ENTRY_KEY:
                        key = _string(buf, v)
                    elif n == _ENTRY_VALUE:
                        val = _string(buf, v)
            info.metadata[key] = val
    if graph is None or not has_version:
        raise OnnxFormatError("no model graph")
    initializers: set[str] = set()
    inputs: list[str] = []
    for number, value in _fields(buf, *graph):
        if not isinstance(value, tuple):
            continue
        if number == _GRAPH_INPUT:
            inputs.append(_named(buf, value, _VALUE_INFO_NAME))
        elif number == _GRAPH_OUTPUT:
            info.outputs.append(_named(buf, value, _VALUE_INFO_NAME))
        elif number == _GRAPH_INITIALIZER:
            initializers.add(_named(buf, value, _INITIALIZER_NAME))
    info.inputs = [name for name in inputs if name not in initializers]
    return info
