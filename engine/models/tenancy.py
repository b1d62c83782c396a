"""How long a loaded model stays, and what must go for another to fit: pure policy, no loading here.

A model's tenancy records when it was last used, how it came (configured at start, or loaded on demand by a
request), the keep_alive its last request asked for, and what it costs in memory. The manager asks which idle
models to evict (least recently used first) for a load to fit the memory budget and the loaded-model count,
and which models have outstayed their time-to-live.
"""
from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import InvalidRequest, ModelLoadError
from engine.system import total_ram_bytes
from engine.models.gguf import Footprint, NotGGUF, read_metadata

FOREVER = None  # a ttl that never runs out


@dataclass
class Tenancy:
    name: str
    footprint: Footprint
    on_demand: bool  # loaded by a request (JIT), not configured to load at start
    ttl_s: float | None  # the roster entry's ttl, or the global idle ttl for on-demand loads; None: stays
    last_used: float = field(default_factory=time.monotonic)
    keep_alive_s: float | None = None  # the last request's keep_alive (overrides ttl_s); set via keep()
    kept: bool = False  # whether a request set keep_alive_s
    leases: int = 0  # requests between routing and submission (not yet counted as the model's outstanding)

    def keep(self, seconds: float | None) -> None:
        """A request's keep_alive: stay this long once idle (None: until unloaded)."""
        self.keep_alive_s, self.kept = seconds, True

    @property
    def ttl(self) -> float | None:
        return self.keep_alive_s if self.kept else self.ttl_s

    def expired(self, now: float, busy: bool) -> bool:
        ttl = self.ttl
        return not busy and self.leases == 0 and ttl is not FOREVER and now - self.last_used >= ttl


def parse_keep_alive(value, field_name: str = "keep_alive") -> float | None:
    """Ollama's keep_alive: seconds (a number) or a duration string ("5m", "1h30m", "300ms", "10s"); 0 unloads
    when done, a negative value keeps the model loaded. Returns seconds, or None for forever."""
    if isinstance(value, bool) or value is None:
        raise InvalidRequest(f"'{field_name}' must be a number of seconds or a duration such as \"5m\"", field_name)
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _duration(value.strip(), field_name)
    else:
        raise InvalidRequest(f"'{field_name}' must be a number of seconds or a duration such as \"5m\"", field_name)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise InvalidRequest(f"'{field_name}' must be finite", field_name)
    return None if seconds < 0 else seconds


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def _duration(text: str, field_name: str) -> float:
    """Go's time.ParseDuration subset Ollama accepts ("1h30m", "-1m", "45s"; a bare number is seconds)."""
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    try:
        return sign * float(body)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(body) or not body:
        raise InvalidRequest(f"'{field_name}': {text!r} is not a duration (e.g. \"30s\", \"5m\", \"1h\", -1)",
                             field_name)
    return sign * total


def memory_budget(max_memory_mib: int) -> int:
    """Bytes models may take together: max_memory MiB, or for -1 three quarters of this machine's RAM."""
    if max_memory_mib >= 0:
        return max_memory_mib << 20
    return (total_ram_bytes() or 16 << 30) * 3 // 4


def victims(tenants: list[Tenancy], busy: set[str], need: int, budget: int, reserved: int,
            max_loaded: int, loading: int) -> list[Tenancy] | None:
    """The idle models to evict, least recently used first, so that a load of `need` bytes fits the budget
    (with `reserved` bytes already promised to loads in flight) and the count; None when it cannot fit
    without evicting a busy model (the caller waits, then gives up)."""
    used = sum(t.footprint.total for t in tenants) + reserved
    count = len(tenants) + loading
    out = []
    for t in sorted((t for t in tenants if t.name not in busy and t.leases == 0), key=lambda t: t.last_used):
        if used + need <= budget and (max_loaded <= 0 or count + 1 <= max_loaded):
            break
        out.append(t)
        used -= t.footprint.total
        count -= 1
    if used + need <= budget and (max_loaded <= 0 or count + 1 <= max_loaded):
        return out
    return None


def with_projector(need: Footprint, mmproj: str | None) -> Footprint:
    """need plus what the model's vision projector takes (when it has one): its weights, which libmtmd reads
    into buffers of its own, and the encoder's compute buffer (blocking: reads the projector's header)."""
    if not mmproj:
        return need
    path = Path(mmproj).expanduser()
    try:
        weights, compute = path.stat().st_size, encoder_compute_bytes(read_metadata(path))
    except (NotGGUF, OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load vision projector {path}: {e}") from None
    return dataclasses.replace(need, weights=need.weights + weights, compute=need.compute + compute)


def encoder_compute_bytes(meta: dict[str, object]) -> int:
    """The vision encoder's compute buffer at its largest image, from clip's metadata: ggml reuses buffers
    from layer to layer, so it holds about one layer's f32 activations (attention scores per head, Q/K/V/out
    and the FFN's rows per image position) beside the image itself and the projected rows."""
    def hp(name: str, default: int = 0) -> int:
        v = meta.get(f"clip.vision.{name}", default)
        return int(v) if isinstance(v, (int, float)) else default
    side, patch = hp("image_size", 224), hp("patch_size", 14) or 14
    n_pos = (side // patch) ** 2 + 1  # a class embedding, where the encoder has one
    n_embd, n_ff, n_head = hp("embedding_length", 1024), hp("feed_forward_length", 4096), hp("attention.head_count", 16)
    layer = n_head * n_pos * n_pos + n_pos * (4 * n_embd + n_ff)
    return 4 * (layer + 3 * side * side + n_pos * hp("projection_dim", n_embd)) + (16 << 20)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
