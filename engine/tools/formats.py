"""Which tool-call wire format a chat template speaks, and whether it reasons in <think> tags."""
from __future__ import annotations

import hashlib
import uuid


def detect_format(template: str) -> str:
    """The tool-call wire format a chat template speaks ('generic' when it has none)."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|channel|>" in template:
        return "harmony"
    if "<|python_tag|>" in template or ("ipython" in template and "<|eot_id|>" in template):
        return "llama_json"
    if "<start_of_turn>" in template:
        return "gemma"
    return "generic"


def thinks(template: str) -> bool:
    """Whether the template marks reasoning with <think>...</think>."""
    return "<think>" in template


def new_call_id(fmt: str = "") -> str:
    """A fresh tool call id in the form the format's models know: Mistral's 9 letters and digits (its templates
    refuse any other), else OpenAI's call_..."""
    if fmt == "mistral":
        return short_call_id(uuid.uuid4().hex)
    return "call_" + uuid.uuid4().hex[:24]


_ALPHANUMERIC = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def short_call_id(seed: str) -> str:
    """A 9-character alphanumeric id derived from seed (the same seed, the same id)."""
    n = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    chars = []
    for _ in range(9):
        n, k = divmod(n, len(_ALPHANUMERIC))
        chars.append(_ALPHANUMERIC[k])
    return "".join(chars)
