"""Writing the small ONNX graphs the test assets are made of (numpy + onnx only)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper


def save(graph: onnx.GraphProto, path: Path, metadata: dict | None = None) -> None:
    """Check and write graph as an opset-17 model carrying metadata (as sherpa-onnx exports do)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="llamadesk-tests")
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def const(name: str, value, dtype=np.float32) -> onnx.NodeProto:
    """A Constant node named name holding value."""
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
