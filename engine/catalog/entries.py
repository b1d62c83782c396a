"""The curated model catalog: entries, their invariants, what is on disk, and whether each fits this box."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.config import TOOL_FORMATS
from engine.system import total_ram_bytes

KINDS = ("llm", "embedding", "asr", "tts", "vad", "mmproj")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# KV cache bytes relative to f16, per --kv-dtype.
KV_FACTOR = {"f16": 1.0, "q8_0": 34 / 64, "q4_0": 18 / 64}


class CatalogError(Exception):
    """The catalog file is unreadable or breaks an invariant."""


@dataclass
class Entry:
    """One downloadable model (or tower) of the catalog."""

    name: str
    kind: str
    file: str
    url: str
    sha256: str
    size: int
    family: str = ""
    url_ref: str = ""
    size_estimated: bool = False
    quant: str = ""
    params: str = ""
    ctx: int = 0
    license: str = ""
    tool_format: str = ""
    thinking: bool = False
    towers: list[str] = field(default_factory=list)
    kv_bytes_per_token: int = 0
    archive: str = ""
    languages: str = ""
    embedding_dims: int = 0
    for_model: str = ""
    starter: bool = False  # one of the starter set: small models that show every kind of route working
    description: str = ""  # one line for people choosing a model (the Catalog panel shows it)
    note: str = ""
    source: str = ""

    @property
    def is_archive(self) -> bool:
        return self.archive == "tar.bz2"

    def local_path(self, models_dir: Path) -> Path:
        """Where the verified model lives: the file, or the folder an archive unpacks into."""
        return models_dir / (self.name if self.is_archive else self.file)


def default_catalog_path() -> Path:
    """resources/catalog.toml shipped with llamadesk."""
    return Path(__file__).resolve().parents[2] / "resources" / "catalog.toml"


def load_catalog(path: Path | None = None) -> list[Entry]:
    """Read and validate a catalog (CatalogError names every broken invariant)."""
    path = path or default_catalog_path()
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CatalogError(f"cannot read the catalog {path}: {e}") from None
    known = set(Entry.__dataclass_fields__)
    entries = []
    for i, raw in enumerate(doc.get("model", [])):
        extra = set(raw) - known
        missing = {"name", "kind", "file", "url", "sha256", "size"} - set(raw)
        if extra or missing:
            raise CatalogError(f"catalog entry {i + 1} ({raw.get('name', '?')}): "
                               + (f"unknown keys {sorted(extra)} " if extra else "")
                               + (f"missing keys {sorted(missing)}" if missing else ""))
        entries.append(Entry(**raw))
    problems = validate(entries)
    if problems:
        raise CatalogError(f"catalog {path} is invalid: " + "; ".join(problems))
    return entries


def validate(entries: list[Entry]) -> list[str]:
    """Every broken invariant: unique names and files, 64-hex sha256, https URLs, known kinds, towers resolve."""
    problems = []
    names = [e.name for e in entries]
    by_name = {e.name: e for e in entries}
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"duplicate name {dup}")
    targets = [e.local_path(Path(".")).as_posix() for e in entries]
    for dup in sorted({t for t in targets if targets.count(t) > 1}):
        problems.append(f"two entries would be saved as {dup}")
    for e in entries:
        if not _HEX64.match(e.sha256):
            problems.append(f"{e.name}: sha256 must be 64 lowercase hex digits")
        if not e.url.startswith("https://"):
            problems.append(f"{e.name}: url must be https")
        if e.kind not in KINDS:
            problems.append(f"{e.name}: unknown kind {e.kind!r}")
        if e.size <= 0:
            problems.append(f"{e.name}: size must be positive")
        if "/" in e.file or "\\" in e.file or e.file.startswith("."):
            problems.append(f"{e.name}: file must be a plain file name")
        if e.kind == "llm" and e.tool_format not in TOOL_FORMATS:
            problems.append(f"{e.name}: tool_format must be one of {', '.join(TOOL_FORMATS)}")
        for t in e.towers:
            if t not in by_name:
                problems.append(f"{e.name}: tower {t} is not in the catalog")
            elif by_name[t].kind not in ("mmproj", "asr", "tts"):
                problems.append(f"{e.name}: tower {t} is a {by_name[t].kind}, not a tower kind")
    return problems


# ---- the box ---------------------------------------------------------------------------------

_box: dict[str, Any] | None = None


def box_facts() -> dict[str, Any]:
    """This machine's memory (and GPU memory where detectable), for fit badges."""
    global _box
    if _box is None:
        _box = {"ram_bytes": total_ram_bytes(), "vram_bytes": _vram_bytes(), "cpu_count": os.cpu_count()}
    return {**_box, "ram_available_bytes": _available_ram()}


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _vram_bytes() -> int | None:
    """Total memory of the first NVIDIA GPU, when nvidia-smi is there to ask."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5).stdout
        return int(out.split()[0]) * 2**20
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def memory_needed(e: Entry, ctx: int, streams: int, kv_dtype: str) -> int:
    """Bytes to serve the entry: weights, plus for an LLM the KV cache at ctx x streams."""
    need = e.size
    if e.kind == "llm":
        need += int(e.kv_bytes_per_token * KV_FACTOR[kv_dtype] * min(ctx, e.ctx or ctx) * streams)
        need += 256 * 2**20  # compute buffers and runtime
    return need


def fit_badge(need: int, box: dict[str, Any]) -> str:
    """'fits', 'tight' or 'too big' against this box's RAM (or VRAM when larger)."""
    budget = max(box["ram_bytes"], box.get("vram_bytes") or 0)
    if need <= 0.7 * budget:
        return "fits"
    if need <= 0.95 * budget:
        return "tight"
    return "too big"


def local_state(e: Entry, models_dir: Path) -> dict[str, Any]:
    """What of the entry is on disk: absent, partial (resumable), present, or verified (sidecar matches)."""
    path = e.local_path(models_dir)
    sidecar = sidecar_path(e, models_dir)
    if path.exists():
        verified = sidecar.exists() and sidecar.read_text().split()[:1] == [e.sha256]
        return {"state": "verified" if verified else "present", "path": str(path)}
    part = models_dir / (e.file + ".part")
    if part.exists():
        return {"state": "partial", "path": str(part), "bytes": part.stat().st_size}
    return {"state": "absent", "path": None}


def sidecar_path(e: Entry, models_dir: Path) -> Path:
    """The `.sha256` file recording a verified download."""
    return models_dir / (e.local_path(Path(".")).name + ".sha256")


def describe(e: Entry, models_dir: Path, ctx: int, streams: int, kv_dtype: str, box: dict[str, Any]) -> dict:
    """The entry as /catalog shows it: fields, local state, memory need and fit badge."""
    need = memory_needed(e, ctx, streams, kv_dtype)
    return {**asdict(e), "local": local_state(e, models_dir), "memory_needed": need, "fit": fit_badge(need, box)}


def starter_set(entries: list[Entry]) -> tuple[list[Entry], int]:
    """The entries marked starter, and the bytes downloading all of them takes."""
    chosen = [e for e in entries if e.starter]
    return chosen, sum(e.size for e in chosen)


def unknown_local_ggufs(entries: list[Entry], models_dir: Path) -> list[dict[str, Any]]:
    """GGUF files in models_dir that no catalog entry accounts for (imported or copied by hand)."""
    known = {e.file for e in entries}
    if not models_dir.is_dir():
        return []
    return [{"name": p.stem, "kind": "local", "file": p.name, "path": str(p), "size": p.stat().st_size}
            for p in sorted(models_dir.glob("*.gguf")) if p.name not in known]
