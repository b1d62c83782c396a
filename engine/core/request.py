"""One generation request from the route to the scheduler and back (nano-vllm's `Sequence`): what was
asked, where it is in its life, and the typed events the scheduler thread sends to its collector."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from engine.errors import EngineError
from engine.requests import SamplingParams
from engine.text import StopMatcher, Utf8Stream


class RequestState(Enum):
    """Where a request is: INBOX (handed over on the event loop, not yet taken by the scheduler thread),
    QUEUED (waiting for a KV sequence), PREFILL, DECODE, DONE."""

    INBOX = "inbox"
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(frozen=True, eq=False)
class ImageSpan:
    """An image in a prompt: the embedding rows its projector made, standing at prompt positions start.. (the
    prompt holds a placeholder id at each, derived from the image's bytes, so that prefix reuse compares images
    like tokens). whole: its rows attend to each other both ways and must be decoded in one batch."""

    start: int
    rows: Any  # numpy float32 (n_pos, n_embd)
    whole: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.rows)


class Prompt(list):
    """A prompt's ids (list[int]) with the images standing at some of its positions."""

    def __init__(self, ids: list[int], images: tuple[ImageSpan, ...] = ()):
        super().__init__(ids)
        self.images = images


@dataclass
class Delta:
    """New text (possibly empty) and the logprobs entry of the token that made it."""

    text: str
    logprobs: dict[str, Any] | None = None


@dataclass
class End:
    """The request finished: why (stop, length, cancelled) and its usage with timings."""

    reason: str
    usage: dict[str, Any]


@dataclass
class Failed:
    """The request ended with an error; the server keeps serving."""

    error: EngineError


Event = Delta | End | Failed


class Sink(Protocol):
    """Where a request's events go (a Generation, on the event loop)."""

    def push(self, event: Event) -> None: ...


@dataclass(eq=False)
class Request:
    """One generation: its prompt and sampling, the scheduler's bookkeeping (state, KV sequence, cached and
    generated tokens) and the runner's (sampler, detokenizer, stop strings, timings). Written by the scheduler
    thread only, once submitted."""

    id: str
    prompt: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    images: tuple[ImageSpan, ...] = ()  # in prompt order; their positions' ids are placeholders
    max_tokens: int = 0
    render_special: bool = False  # keep special tokens' text (tool-call and reasoning markers) for parsing
    sink: Sink | None = None
    # the scheduler's
    state: RequestState = RequestState.INBOX
    seq: int = -1
    num_cached_tokens: int = 0  # tokens of this request already in its sequence's KV cache
    generated: list[int] = field(default_factory=list)
    reused_tokens: int = 0  # prompt tokens taken from the prefix cache instead of prefilled
    reuse: dict[str, int] = field(default_factory=dict)  # where they came from: kv, attached, ram, disk
    cancelled: bool = False
    # n > 1: the choices after the first share its prompt; they wait for it and copy its KV
    parent: Request | None = None
    children: list[Request] = field(default_factory=list)
    # the runner's
    sampler: Any = None  # engine.llama.SamplerChain, built before submission
    utf8: Utf8Stream = field(default_factory=Utf8Stream)
    stops: StopMatcher = field(default_factory=lambda: StopMatcher([]))
    submitted: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    ended_at: float | None = None
    tail: str = ""
    sent_text: bool = False
    finish_reason: str | None = None
    cancel_tick: int | None = None
    evict_ticks: int | None = None

    @property
    def prompt_left(self) -> int:
        return len(self.prompt) - self.num_cached_tokens

    def image_at(self, pos: int) -> ImageSpan | None:
        """The image whose rows stand at prompt position pos, if any."""
        return next((im for im in self.images if im.start <= pos < im.end), None)

    def run_end(self, pos: int) -> int:
        """Where the text or image run holding pos ends: a prefill slice never crosses one (text rows and image
        rows go through separate decodes)."""
        image = self.image_at(pos)
        if image is not None:
            return image.end
        return next((im.start for im in self.images if im.start > pos), len(self.prompt))

    def reusable(self, n: int) -> int:
        """How much of a cached prefix of n positions may be kept: never part of an image (its placeholder ids
        are hashes: only all of them matching says it is the same image), so a prefix ending inside one is cut
        back to its start."""
        image = self.image_at(n)
        return image.start if image is not None and image.start < n else n

    @property
    def family(self) -> list[Request]:
        """This request and the choices that share its prompt and have not ended."""
        return [self, *(c for c in self.children if c.state is not RequestState.DONE)]

    def timings(self) -> dict[str, float]:
        """llama-server's per-request timings: prompt (queue + prefill until the first token) and generation."""
        end = self.ended_at or time.monotonic()
        first = self.first_token_at or end
        prompt_ms = (first - self.submitted) * 1000
        predicted_ms = (end - first) * 1000
        predicted = max(len(self.generated) - 1, 0)  # the first token belongs to the prompt phase
        return {"prompt_n": len(self.prompt) - self.reused_tokens, "cache_n": self.reused_tokens,
                "prompt_ms": round(prompt_ms, 3), "predicted_n": len(self.generated),
                "predicted_ms": round(predicted_ms, 3),
                "predicted_per_second": round(predicted / (predicted_ms / 1000), 2) if predicted and predicted_ms
                else 0.0}
