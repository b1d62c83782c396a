"""Writing the small ONNX graphs the test assets are made of (numpy + onnx only)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from app.speech_assets import save  # the one writer, shared with the starter set's speech models

__all__ = ["const", "save"]


def const(name: str, value, dtype=np.float32) -> onnx.NodeProto:
    """A Constant node named name holding value."""
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
