"""Chat prompts: the GGUF's own Jinja template rendered in a sandbox."""
from __future__ import annotations

from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from engine.errors import InvalidRequest

# Used when a GGUF carries no tokenizer.chat_template (llama-server does the same).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROLES = ("system", "developer", "user", "assistant", "tool")
# What the renderer itself passes to every template; a request's chat_template_kwargs may not replace them.
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "tool_choice", "functions", "function_call",
                                "add_generation_prompt", "bos_token", "eos_token", "raise_exception", "strftime_now"})
_FIXED = TEMPLATE_VARIABLES - {"tools", "tool_choice", "functions", "function_call"}  # render()'s kwargs may set those


class ChatTemplate:
    """A compiled chat template with the model's BOS/EOS strings."""

    def __init__(self, template: str | None, bos: str, eos: str):
        self.source = template or CHATML
        self.bos = bos
        self._formatter = Jinja2ChatFormatter(self.source, eos_token=eos, bos_token=bos, add_generation_prompt=True)

    def render(self, messages: list[dict[str, Any]], /, **kwargs: Any) -> str:
        """The prompt text for messages (add_generation_prompt on); kwargs are more template variables."""
        clash = sorted(kwargs.keys() & _FIXED)
        if clash:
            raise InvalidRequest(f"chat_template_kwargs may not set the template's own variables: {', '.join(clash)}",
                                 "chat_template_kwargs")
        try:
            return self._formatter(messages=[_flatten(m) for m in messages], **kwargs).prompt
        except InvalidRequest:
            raise
        except Exception as e:  # the template's own raise_exception, or a template bug
            raise InvalidRequest(f"the model's chat template rejected the messages: {e}", "messages") from None


def _flatten(msg: dict[str, Any]) -> dict[str, Any]:
    """Content given as a list of parts becomes plain text for templates that expect a string."""
    content = msg.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise InvalidRequest(f"content part type {kind!r} is not supported by this model", "messages")
            text = part.get("text", "")
            if not isinstance(text, str):
                raise InvalidRequest("a text content part's 'text' must be a string", "messages")
            texts.append(text)
        msg = {**msg, "content": "".join(texts)}
    elif content is None:
        msg = {**msg, "content": ""}
    return msg


def turns(messages: list[dict[str, Any]]) -> tuple[list[int], list[list[int]]]:
    """Split message indices into leading system messages and user-led turns (for truncation)."""
    system, groups = [], []
    for i, m in enumerate(messages):
        if m.get("role") in ("system", "developer") and not groups:
            system.append(i)
        elif m.get("role") == "user" or not groups:
            groups.append([i])
        else:
            groups[-1].append(i)
    return system, groups
