"""Which tool-call wire format a chat template speaks, and whether it reasons in <think> tags."""
from __future__ import annotations

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


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
