"""Any GGUF from Hugging Face: search the hub, list a repo's GGUFs (quant, size, fit on this box), pick one, and
pull it through the catalog's downloader, verified against the sha256 the hub reports for it.

The hub's JSON API, as huggingface_hub calls it: `GET /api/models?search=…&filter=gguf` (repos),
`GET /api/models/{repo}/tree/main?recursive=true` (files, paged by a `Link: rel="next"` header; an LFS file's
`lfs.oid` is the sha256 of its content), `GET /{repo}/resolve/main/{path}` (the bytes, Range-capable, usually a
redirect to a CDN). `HF_ENDPOINT` names a mirror (huggingface_hub's convention). A token — the `hf_token` config
key, else `HF_TOKEN`, else the file `hf auth login` writes — is sent as a bearer for gated and private repos.

A model is named `repo`, `repo:QUANT` or `repo/path/in/repo.gguf` (an `hf.co/` prefix, as Ollama writes it, is
accepted). A split GGUF (`name-00001-of-00003.gguf`, …) is one model: its parts are pulled as a set. A repo's
`mmproj-*.gguf` is its vision tower, pulled beside the model on request; a pairing file beside the model
(`<model file>.mmproj`, naming the tower's file) makes serving the model load the tower with it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable
from urllib.parse import quote

import aiohttp

from engine.catalog import entries as cat
from engine.catalog.downloads import Download, Downloader, DownloadError, _sha256
from engine.errors import (Conflict, EngineError, InsufficientMemory, InvalidRequest, ModelNotFound, UpstreamError,
                           UpstreamUnauthorized)

log = logging.getLogger("llamadesk.hub")
DEFAULT_ENDPOINT = "https://huggingface.co"
REVISION = "main"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/")
_SPLIT = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})$")
# A quant label as GGUF repos spell it in file names (Q4_K_M, IQ3_XXS, UD-Q4_K_XL, BF16, …), between separators.
_QUANT = re.compile(r"(?:^|[-._])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]{1,4})*|B?F16|F32|TQ\d_0|MXFP4(?:_MOE)?))(?=$|[-._])",
                    re.I)
# Which quant a default pull takes, first that fits: Q4_K_M is Ollama's and llama-server -hf's default; then the
# other mid-size quants (best quality per byte), larger ones, smaller ones, unquantized last.
PREFERENCE = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_1", "Q6_K", "Q8_0", "Q5_0",
              "Q5_1", "Q3_K_L", "Q3_K_M", "IQ3_M", "Q3_K_S", "IQ3_S", "IQ3_XS", "IQ3_XXS", "Q2_K", "IQ2_M", "IQ2_S",
              "IQ2_XS", "IQ2_XXS", "BF16", "F16", "F32")
_VISION_PREFERENCE = ("F16", "BF16", "Q8_0", "F32")


# ---- names -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What a pull names: a repo, and maybe a quant or one file of it."""

    repo: str
    quant: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return self.repo + (f":{self.quant}" if self.quant else "") + (f"/{self.file}" if self.file else "")


def parse_spec(text: str, param: str = "model") -> Spec:
    """`repo`, `repo:QUANT` or `repo/file.gguf` (InvalidRequest naming param otherwise)."""
    raw = text.strip()
    for prefix in _PREFIXES:
        if raw.lower().startswith(prefix):
            raw = raw[len(prefix):]
            break
    quant = file = None
    if ":" in raw:
        raw, quant = raw.rsplit(":", 1)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", quant):
            raise InvalidRequest(f"'{param}': {quant!r} is not a quant label (e.g. Q4_K_M)", param)
    parts = raw.split("/")
    repo = "/".join(parts[:2])
    if len(parts) > 2:
        file = "/".join(parts[2:])
        if quant or not file.lower().endswith(".gguf") or ".." in parts or "" in parts:
            raise InvalidRequest(f"'{param}' must be repo, repo:QUANT or repo/file.gguf; got {text!r}", param)
    if not _REPO.match(repo):
        raise InvalidRequest(f"'{param}' must name a Hugging Face repo as owner/name (repo, repo:QUANT or "
                             f"repo/file.gguf); got {text!r}", param)
    return Spec(repo, quant.upper() if quant else None, file)


def quant_of(file_name: str) -> str:
    """The quant label in a GGUF's file name ('' when it has none), upper-cased."""
    stem = Path(file_name).name
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    split = _SPLIT.match(stem)
    found = _QUANT.findall(split.group("base") if split else stem)
    return found[-1].upper() if found else ""


def _is_vision(path: str) -> bool:
    return "mmproj" in Path(path).name.lower()


# ---- a repo's files --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubFile:
    """One GGUF in a repo, as the tree API lists it."""

    path: str
    size: int
    sha256: str | None  # the LFS oid; None for a file kept in git itself

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class Variant:
    """One model of a repo: a GGUF, or the parts of a split GGUF, in one quant."""

    repo: str
    quant: str
    files: list[HubFile]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def path(self) -> str:
        return self.files[0].path

    def rank(self) -> tuple[int, str]:
        return (PREFERENCE.index(self.quant) if self.quant in PREFERENCE else len(PREFERENCE), self.path)


@dataclass
class Listing:
    """A repo's GGUF models, its vision towers, and split sets missing parts (not offered)."""

    repo: str
    variants: list[Variant]
    vision: list[HubFile]
    incomplete: list[str] = field(default_factory=list)


def group(repo: str, files: list[HubFile]) -> Listing:
    """The repo's GGUFs as models: split parts gathered into sets, mmproj files set apart as vision towers."""
    variants, vision, sets, incomplete = [], [], {}, []
    for f in sorted(files, key=lambda f: f.path):
        if not f.path.lower().endswith(".gguf"):
            continue
        if _is_vision(f.path):
            vision.append(f)
            continue
        m = _SPLIT.match(f.path[:-5])
        if m:
            sets.setdefault((m.group("base"), int(m.group("count"))), {})[int(m.group("no"))] = f
        else:
            variants.append(Variant(repo, quant_of(f.name), [f]))
    for (base, count), parts in sets.items():
        if sorted(parts) != list(range(1, count + 1)):
            incomplete.append(f"{base} ({len(parts)} of {count} parts)")
            continue
        variants.append(Variant(repo, quant_of(parts[1].name), [parts[n] for n in range(1, count + 1)]))
    variants.sort(key=lambda v: v.path)
    return Listing(repo, variants, vision, incomplete)


def fit_of(v: Variant, ctx: int, streams: int, kv_dtype: str, box: dict[str, Any]) -> tuple[int, str]:
    """Memory the variant needs and its fit badge on this box, as the catalog computes them (weights and compute
    buffers: a hub file's KV size is unknown until its header is read)."""
    e = cat.Entry(name=f"{v.repo}/{v.path}", kind="llm", file=v.files[0].name, url="", sha256="", size=v.size)
    need = cat.memory_needed(e, ctx, streams, kv_dtype)
    return need, cat.fit_badge(need, box)


def pick(listing: Listing, spec: Spec, fit: Callable[[Variant], str]) -> Variant:
    """The variant spec names: its file, its quant, or by default the preferred quant that fits this box."""
    if not listing.variants:
        raise ModelNotFound(f"{listing.repo} has no GGUF model files"
                            + (f" (incomplete split sets: {', '.join(listing.incomplete)})" if listing.incomplete
                               else ""), "model")
    if spec.file:
        return _by_file(listing, spec.file)
    if spec.quant:
        found = [v for v in listing.variants if v.quant == spec.quant]
        if not found:
            raise ModelNotFound(f"{listing.repo} has no {spec.quant} GGUF; it has "
                                f"{', '.join(sorted({v.quant or v.path for v in listing.variants}))}", "model")
        if len(found) > 1:
            raise InvalidRequest(f"{listing.repo}:{spec.quant} matches {len(found)} models "
                                 f"({', '.join(v.path for v in found)}): name one as repo/file.gguf", "model")
        return found[0]
    for badge in ("fits", "tight"):
        fitting = sorted((v for v in listing.variants if fit(v) == badge), key=Variant.rank)
        if fitting:
            return fitting[0]
    smallest = min(listing.variants, key=lambda v: v.size)
    raise InsufficientMemory(f"none of {listing.repo}'s GGUFs fits this machine's memory (the smallest, "
                             f"{smallest.quant or smallest.path}, is {_gb(smallest.size)}); name one with "
                             f"{listing.repo}:QUANT to pull it anyway", "model")


def _by_file(listing: Listing, file: str) -> Variant:
    for v in listing.variants:
        if any(f.path == file for f in v.files):
            return v
    named = [v for v in listing.variants if any(f.name == file for f in v.files)]
    if len(named) == 1:
        return named[0]
    if any(f.path == file or f.name == file for f in listing.vision):
        raise InvalidRequest(f"{file} is {listing.repo}'s vision tower, not a model: pull a model of the repo "
                             "with \"vision\": true (--vision) to fetch it beside the model", "model")
    raise ModelNotFound(f"{listing.repo} has no GGUF {file}; its models: "
                        f"{', '.join(v.path for v in listing.variants)}", "model")


def pick_vision(listing: Listing) -> HubFile | None:
    """The repo's vision tower: of several mmproj files the F16 one (then BF16, Q8_0, F32, the first)."""
    if not listing.vision:
        return None
    ranked = sorted(listing.vision, key=lambda f: (_VISION_PREFERENCE.index(quant_of(f.name))
                                                   if quant_of(f.name) in _VISION_PREFERENCE else 99, f.path))
    return ranked[0]


# ---- the hub's HTTP API ------------------------------------------------------------------------------------


def token_from(config_token: str | None) -> str | None:
    """The token to send: hf_token, else $HF_TOKEN, else the token file (`$HF_TOKEN_PATH`, `$HF_HOME/token`,
    ~/.cache/huggingface/token)."""
    if config_token:
        return config_token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    path = Path(os.environ["HF_TOKEN_PATH"]).expanduser() if os.environ.get("HF_TOKEN_PATH") else home / "token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Hub:
    """The Hugging Face API at endpoint ($HF_ENDPOINT, else huggingface.co), with an optional token."""

    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout_s: float = 60):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.token = token
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30)

    @property
    def headers(self) -> dict[str, str]:
        """What every request to the hub carries: the token, when there is one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def resolve_url(self, repo: str, path: str) -> str:
        """Where a file's bytes are (Range-capable; the hub may redirect to a CDN)."""
        return f"{self.endpoint}/{repo}/resolve/{REVISION}/{quote(path, safe='/')}"

    def page_url(self, repo: str) -> str:
        return f"{self.endpoint}/{repo}"

    def _session(self) -> aiohttp.ClientSession:
        # trust_env: HTTP(S)_PROXY / NO_PROXY from the environment are honoured, as the downloader does
        return aiohttp.ClientSession(trust_env=True, timeout=self.timeout, headers={"User-Agent": "llamadesk"})

    async def search(self, query: str, limit: int = 20) -> list[dict[str, Any]]:
        """GGUF repos matching query, most downloaded first."""
        params = {"search": query, "filter": "gguf", "sort": "downloads", "direction": "-1", "limit": str(limit)}
        doc = await self._get_json(f"{self.endpoint}/api/models", params, None)
        if not isinstance(doc, list):
            raise UpstreamError(f"{self.endpoint} answered the model search with something other than a list")
        return [{"id": m.get("id") or m.get("modelId"), "downloads": m.get("downloads", 0), "likes": m.get("likes", 0),
                 "tags": m.get("tags", []), "pipeline_tag": m.get("pipeline_tag"), "gated": m.get("gated", False),
                 "private": m.get("private", False), "last_modified": m.get("lastModified")}
                for m in doc if isinstance(m, dict) and (m.get("id") or m.get("modelId"))]

    async def files(self, repo: str) -> list[HubFile]:
        """Every file of the repo's main branch (all pages of the tree)."""
        url: str | None = f"{self.endpoint}/api/models/{repo}/tree/{REVISION}"
        params: dict[str, str] | None = {"recursive": "true"}
        out: list[HubFile] = []
        async with self._session() as s:
            for _ in range(100):  # 100 pages of 1000 entries: beyond any model repo
                try:
                    async with s.get(url, params=params, headers=self.headers) as r:
                        await self._check(r, repo)
                        doc = await r.json(content_type=None)
                        nxt = r.links.get("next")
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                    raise UpstreamError(f"cannot list {repo} on {self.endpoint}: {e or type(e).__name__}") from None
                if not isinstance(doc, list):
                    raise UpstreamError(f"{self.endpoint} answered the file list of {repo} with something other "
                                        "than a list")
                out += [_hub_file(e) for e in doc if isinstance(e, dict) and e.get("type") == "file"]
                url, params = (str(nxt["url"]) if nxt and "url" in nxt else None), None  # the next URL has them
                if not url:
                    break
        return out

    async def listing(self, repo: str) -> Listing:
        """The repo's GGUF models and vision towers."""
        return group(repo, await self.files(repo))

    async def check_access(self, repo: str, path: str) -> None:
        """Whether the file can be fetched with this token (a gated repo answers 401/403 before any byte). The
        hub's own answer decides: a redirect to its CDN is a yes (huggingface_hub reads file metadata so too)."""
        async with self._session() as s:
            try:
                async with s.head(self.resolve_url(repo, path), headers=self.headers, allow_redirects=False) as r:
                    await self._check(r, repo, path)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                raise UpstreamError(f"cannot reach {self.endpoint}: {e or type(e).__name__}") from None

    async def _get_json(self, url: str, params: dict[str, str], repo: str | None) -> Any:
        async with self._session() as s:
            try:
                async with s.get(url, params=params, headers=self.headers) as r:
                    await self._check(r, repo)
                    return await r.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                raise UpstreamError(f"cannot reach {self.endpoint}: {e or type(e).__name__}") from None

    async def _check(self, r: aiohttp.ClientResponse, repo: str | None, path: str | None = None) -> None:
        """The typed error for a refusal: the hub says why in X-Error-Code (huggingface_hub reads it too)."""
        if r.status < 400:
            return
        raise self.refusal(r.status, r.headers.get("X-Error-Code", ""), repo, path)

    def refusal(self, status: int, code: str, repo: str | None, path: str | None = None) -> EngineError:
        """The error to report for the hub's answer status (and X-Error-Code) about repo or one of its files."""
        what = f"{repo}/{path}" if path else repo or "the request"
        if code == "RepoNotFound" or (status == 404 and not path):
            hint = "" if self.token else " (a private repo needs a token: set HF_TOKEN or hf_token in the config)"
            return ModelNotFound(f"no repo {repo} on {self.endpoint}{hint}", "model")
        if code == "EntryNotFound" or status == 404:
            return ModelNotFound(f"{what} does not exist on {self.endpoint}", "model")
        if status in (401, 403):
            return UpstreamUnauthorized(self.denied(status, repo or what))
        return UpstreamError(f"{self.endpoint} answered HTTP {status} for {what}")

    def denied(self, status: int, repo: str) -> str:
        """Why the hub refused (401/403) a gated or private repo, and what to do about it."""
        page = self.page_url(repo)
        if not self.token:
            return (f"{repo} is gated or private: the hub answered {status} without a token. Accept its terms on "
                    f"{page} and set HF_TOKEN (or hf_token in the config) to a token of that account")
        if status == 401:
            return f"the hub refused the token (401) for {repo}: check HF_TOKEN (or hf_token in the config)"
        return (f"the token (HF_TOKEN or hf_token) has no access to {repo} (403): accept the repo's terms on {page} "
                "with the token's account")


def _hub_file(e: dict[str, Any]) -> HubFile:
    lfs = e.get("lfs") if isinstance(e.get("lfs"), dict) else {}
    oid = lfs.get("oid") if isinstance(lfs.get("oid"), str) else None
    size = lfs.get("size", e.get("size", 0))
    return HubFile(str(e.get("path", "")), size if isinstance(size, int) else 0,
                   oid.lower() if oid and re.fullmatch(r"[0-9a-fA-F]{64}", oid) else None)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# ---- pulling -------------------------------------------------------------------------------------------------


def local_name(repo: str, f: HubFile, vision: bool) -> str:
    """The file's name in models_dir: its own (a split set's parts keep theirs, so llama.cpp finds them), or for
    a vision tower `mmproj-<repo>-<quant>.gguf` (towers are often just `mmproj-F16.gguf`: repos would collide)."""
    if not vision:
        return f.name
    model = re.sub(r"-gguf$", "", repo.split("/")[1], flags=re.I)
    return f"mmproj-{model}-{quant_of(f.name) or Path(f.name).stem}.gguf"


def pairing_path(model: Path) -> Path:
    """The file naming the vision tower pulled beside the model at path."""
    return model.with_name(model.name + ".mmproj")


def tower_of(model: Path) -> Path | None:
    """The vision tower pulled beside the model at path, when its pairing file names one that is on disk."""
    try:
        tower = model.with_name(pairing_path(model).read_text().strip())
    except (OSError, ValueError):
        return None
    return tower if tower != model and tower.is_file() else None


def _pull_name(listing: Listing, v: Variant) -> str:
    """The shortest name that pulls exactly v: repo:QUANT when the quant is the repo's only one, else its file."""
    if v.quant and sum(w.quant == v.quant for w in listing.variants) == 1:
        return f"{listing.repo}:{v.quant}"
    return f"{listing.repo}/{v.path}"


def served_name(path: Path, roster: list[Any], entries: list[cat.Entry]) -> str:
    """The name requests serve the file at path by, as the catalog lists what is available: a roster entry's
    with that path, a catalog entry's with that file name, else the file's stem."""
    for m in roster:
        if Path(m.path).expanduser() == path:
            return m.name
    for e in entries:
        if e.kind in ("llm", "embedding") and e.file == path.name:
            return e.name
    return path.stem


def _entry(repo: str, f: HubFile, file: str, url: str, kind: str = "llm") -> cat.Entry:
    return cat.Entry(name=f"{repo}/{f.path}", kind=kind, file=file, url=url, sha256=f.sha256 or "", size=f.size,
                     source="huggingface")


@dataclass
class Part:
    """One file of a pull: its catalog-style entry and, once queued, its download."""

    entry: cat.Entry
    path: str  # in the repo
    download: Download | None = None  # None: already on disk, verified
    seen: str = "queued"  # the download's last status the pull reported

    @property
    def done_bytes(self) -> int:
        if self.download is None or self.download.status == "done":
            return self.entry.size
        return self.download.bytes if self.download.status in ("downloading", "verifying") else 0

    def progress(self) -> dict[str, Any]:
        """Ollama's progress line for this file."""
        return {"status": f"pulling {self.entry.file}", "digest": f"sha256:{self.entry.sha256}",
                "total": self.entry.size, "completed": self.download.bytes if self.download else self.entry.size}


class Pull:
    """A model being pulled: its parts' downloads seen as one, with Ollama-style progress events."""

    def __init__(self, spec: Spec, variant: Variant, parts: list[Part], models_dir: Path, fit: str, need: int,
                 denied: Callable[[int, str], str]):
        self.spec, self.variant, self.parts, self.models_dir = spec, variant, parts, models_dir
        self.fit, self.memory_needed = fit, need
        self._denied = denied  # the hub's account of a 401/403
        self.status = "downloading"  # downloading | done | failed | cancelled
        self.error: EngineError | None = None
        self.model: str = Path(parts[0].entry.file).stem  # the name a request serves it by
        # each part's steps (download begun, its last bytes, verifying), kept so that no step of a fast download
        # is lost between two looks; byte counts in between are read when a client looks
        self._steps: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._finished = asyncio.Event()
        for part in parts:
            if part.download is not None:
                self._step(part)
        self._update()  # parts already verified here have no download: a pull of only those is done at once

    @property
    def names(self) -> set[str]:
        return {p.entry.name for p in self.parts}

    @property
    def path(self) -> Path:
        return self.models_dir / self.parts[0].entry.file

    @property
    def tower_path(self) -> Path | None:
        """Where the vision tower pulled with the model goes (None: the pull has none)."""
        tower = next((p for p in self.parts if p.entry.kind == "mmproj"), None)
        return None if tower is None else self.models_dir / tower.entry.file

    def on_change(self, d: Download) -> None:
        """The downloader's report for one of its parts."""
        for part in self.parts:
            if part.download is d:
                self._step(part)
                self._update()
                self._changed.set()

    def _step(self, part: Part) -> None:
        status = part.download.status
        if status == part.seen:
            return
        if status == "downloading":
            self._steps.append(part.progress())
        elif status == "verifying":
            self._steps += [part.progress(), {"status": "verifying sha256 digest", "digest":
                                              f"sha256:{part.entry.sha256}", "file": part.entry.file}]
        part.seen = status

    def _update(self) -> None:
        if self._finished.is_set():
            return
        failed = next((p for p in self.parts if p.download and p.download.status in ("failed", "cancelled")), None)
        if failed is not None:
            self.status = failed.download.status
            self.error = self._failure(failed)
        elif all(p.download is None or p.download.status == "done" for p in self.parts):
            self.status = "done"
            self._pair()
        else:
            return
        self._finished.set()

    def _pair(self) -> None:
        """Record which vision tower the model was pulled with: serving the model then loads it."""
        if self.tower_path is None:
            return
        try:
            pairing_path(self.path).write_text(self.tower_path.name + "\n")
        except OSError as e:  # a read-only models_dir: the model is served, without its tower
            log.warning("%s: its vision tower %s is not paired with it: %s", self.path.name, self.tower_path.name, e)

    def _failure(self, p: Part) -> EngineError:
        d = p.download
        if d.status == "cancelled":
            return DownloadError(f"the pull of {self.spec} was cancelled")
        if d.http_status in (401, 403):
            return UpstreamUnauthorized(self._denied(d.http_status, self.variant.repo))
        return DownloadError(d.error or "failed")

    async def wait(self) -> None:
        """Until every part is verified (or one failed: self.error says why)."""
        await self._finished.wait()

    def summary(self) -> dict[str, Any]:
        """What the pull fetched: the served name, the repo, quant, files and sizes."""
        return {"model": self.model, "repo": self.variant.repo, "quant": self.variant.quant,
                "path": str(self.path), "size": sum(p.entry.size for p in self.parts), "fit": self.fit,
                "memory_needed": self.memory_needed,
                "files": [{"file": p.entry.file, "path": p.path, "size": p.entry.size,
                           "sha256": p.entry.sha256, "kind": p.entry.kind} for p in self.parts]}

    def as_dict(self) -> dict[str, Any]:
        """The pull as GET /catalog lists it."""
        return {"spec": str(self.spec), **self.summary(), "status": self.status,
                "completed": sum(p.done_bytes for p in self.parts),
                "error": self.error.message if self.error else None,
                "downloads": [p.download.as_dict() for p in self.parts if p.download]}

    async def events(self, min_interval_s: float = 0.25) -> AsyncIterator[dict[str, Any]]:
        """Progress as Ollama's pull streams it: 'pulling <file>' with digest, total and completed per part (at
        most one line per min_interval_s while bytes arrive), 'verifying sha256 digest', then 'success' (or the
        failure, raised)."""
        yield {"status": "pulling manifest", "repo": self.variant.repo, "quant": self.variant.quant,
               "files": [p.entry.file for p in self.parts], "total": sum(p.entry.size for p in self.parts)}
        told, last = 0, None
        while True:
            while told < len(self._steps):
                last = self._steps[told]
                told += 1
                yield last
            if self._finished.is_set():
                break
            running = next((p for p in self.parts if p.download and p.download.status == "downloading"), None)
            if running is not None and running.progress() != last:
                last = running.progress()
                yield last
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), 5)
            except asyncio.TimeoutError:
                pass
            if not self._finished.is_set():
                await asyncio.sleep(min_interval_s)
        if self.error is not None:
            raise self.error
        yield {"status": "success", **self.summary()}


class Puller:
    """Pulls hub models into models_dir through a downloader (the server's, or the CLI's own)."""

    def __init__(self, hub: Hub, downloader: Downloader, models_dir: Path, ctx: int, streams: int, kv_dtype: str):
        self.hub, self.downloader, self.models_dir = hub, downloader, Path(models_dir)
        self.ctx, self.streams, self.kv_dtype = ctx, streams, kv_dtype

    def fit(self, v: Variant, box: dict[str, Any] | None = None) -> tuple[int, str]:
        return fit_of(v, self.ctx, self.streams, self.kv_dtype, box or cat.box_facts())

    async def describe(self, repo: str) -> dict[str, Any]:
        """A repo's GGUF models with quant, size, memory needed, fit, and which a default pull takes; its vision
        towers."""
        listing = await self.hub.listing(repo)
        box = cat.box_facts()
        try:
            default = pick(listing, Spec(repo), lambda v: self.fit(v, box)[1]).path
        except EngineError:
            default = None
        models = []
        for v in listing.variants:
            need, badge = self.fit(v, box)
            models.append({"quant": v.quant, "path": v.path, "file": v.files[0].name, "size": v.size,
                           "parts": [{"path": f.path, "size": f.size} for f in v.files], "memory_needed": need,
                           "fit": badge, "default": v.path == default, "pull": _pull_name(listing, v)})
        tower = pick_vision(listing)
        towers = [{"path": f.path, "size": f.size, "quant": quant_of(f.name), "default": f is tower}
                  for f in listing.vision]
        return {"repo": repo, "models": models, "vision": towers, "incomplete": listing.incomplete}

    async def start(self, spec: Spec, vision: bool = False) -> Pull:
        """Resolve spec, check the hub lets us fetch it, and queue its files (those not already verified here)."""
        listing = await self.hub.listing(spec.repo)
        box = cat.box_facts()
        variant = pick(listing, spec, lambda v: self.fit(v, box)[1])
        need, badge = self.fit(variant, box)
        files = [(f, False) for f in variant.files]
        if vision:
            tower = pick_vision(listing)
            if tower is None:
                raise InvalidRequest(f"{spec.repo} has no vision tower (mmproj) to pull", "vision")
            files.append((tower, True))
        parts = []
        for f, is_tower in files:
            if f.sha256 is None:
                raise UpstreamError(f"{spec.repo}/{f.path} has no LFS sha256 on {self.hub.endpoint}: llamadesk pulls "
                                    "only files it can verify")
            e = _entry(spec.repo, f, local_name(spec.repo, f, is_tower), self.hub.resolve_url(spec.repo, f.path),
                       "mmproj" if is_tower else "llm")
            parts.append(Part(e, f.path))
        todo = [p for p in parts if self._busy(p.entry.name) or not await self._verified_here(p.entry)]
        if todo:
            await self.hub.check_access(spec.repo, todo[0].path)
        busy = [p.entry.name for p in todo if self._busy(p.entry.name)]  # checked with no await before the queueing
        if busy:
            raise Conflict(f"{', '.join(busy)} is already being pulled")
        for p in todo:
            p.download = self.downloader.enqueue(p.entry, url=p.entry.url, headers=self.hub.headers)
        pull = Pull(spec, variant, parts, self.models_dir, badge, need, self.hub.denied)
        log.info("pulling %s: %s (%s, %d file%s, %s)", spec, variant.path, variant.quant or "no quant label",
                 len(parts), "" if len(parts) == 1 else "s", _gb(sum(p.entry.size for p in parts)))
        return pull

    def _busy(self, name: str) -> bool:
        d = self.downloader.downloads.get(name)
        return d is not None and d.status in ("queued", "downloading", "verifying", "extracting")

    async def _verified_here(self, e: cat.Entry) -> bool:
        """Whether models_dir already holds this exact file (a Conflict when another file has its name)."""
        path = self.models_dir / e.file
        if not path.exists():
            return False
        if cat.local_state(e, self.models_dir)["state"] == "verified":
            return True
        actual = await asyncio.to_thread(_sha256, path)
        if actual != e.sha256:
            raise Conflict(f"{path} already exists and is another file (sha256 {actual[:12]}…, the hub's is "
                           f"{e.sha256[:12]}…): move it away to pull this one")
        cat.sidecar_path(e, self.models_dir).write_text(f"{e.sha256}  {e.file}\n")
        return True

