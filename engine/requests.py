"""What a caller asks the engine for, in engine terms (no HTTP here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()  # a request that says no keep_alive: the model's time-to-live stands


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop."""

    max_tokens: int | None = None  # None: the configured default, clamped to the context
    max_tokens_ceiling: bool = False  # max_tokens is only a ceiling: clamped to the context too, not refused
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF the output must match (response_format, forced tool calls)
    grammar_triggers: list[str] = field(default_factory=list)  # regexes: the grammar applies from their group on
    logprobs: int | None = None  # None: off; n: the chosen token's logprob plus the n most likely


@dataclass(frozen=True)
class OutputReading:
    """How a generation's text is read: the tool-call wire format, whether tools are on (and a grammar
    guarantees each call completes, so calls may stream), whether it may reason (and starts inside it)."""

    tool_format: str | None = None
    tools_active: bool = False
    constrained_calls: bool = False
    reasoning: bool = False
    in_reasoning: bool = False
    parallel_tool_calls: bool = True  # false: calls after the first are dropped (where no grammar stops them)


@dataclass
class ChatRequest:
    """A chat completion: messages rendered through the model's chat template."""

    model: str | None
    messages: list[dict[str, Any]]
    sampling: SamplingParams
    truncation: str | None = "disabled"  # or "auto": drop the oldest turns until the prompt fits; None: the
    # protocol has no such field (an over-context error does not advise it)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None  # {"type": "json_object"} | {"type": "json_schema", "schema"}
    keep_alive: Any = KEEP  # seconds the model stays loaded once idle after this request (None: until unloaded)


@dataclass
class CompletionRequest:
    """A raw completion of a text (or token) prompt."""

    model: str | None
    prompt: str | list[int]
    sampling: SamplingParams
    echo: bool = False
    keep_alive: Any = KEEP
