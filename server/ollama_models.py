"""The Ollama API's model management on llamadesk's roster: names, pull, copy, create and delete.

- Names: a request's model is our id, or Ollama's `name:latest` form of one (either way round).
- Pull: `hf.co/{owner}/{repo}[:QUANT]` (any `owner/repo` name) is the Hugging Face pull of engine/catalog/hub.py,
  served afterwards under the name it was pulled by (a roster entry; a name without a tag gets `:latest`, as
  Ollama lists it); a name without a slash is a catalog entry, downloaded by the catalog's downloader.
- Copy and create add a roster entry (not loaded: the first request naming it loads it). Create takes an
  existing model and overrides what the roster has keys for: a Jinja chat template (written under
  `<models_dir>/templates/`), `num_ctx` (ctx) and `num_batch` (chunk); anything else is a 400 naming it.
- Delete removes the roster entry (unloading the model first) and the files that were ours: a GGUF (with its
  split parts and `.sha256` sidecars) or a template that lives in models_dir and that no other entry or loaded
  model uses. A file elsewhere on disk is never deleted.

Entries are added and removed through the roster (ModelManager.add_entry / forget), which saves the config.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from engine.catalog import entries as cat
from engine.catalog.downloads import DownloadError
from engine.chat import ChatTemplate
from engine.config import ModelEntry
from engine.errors import Conflict, InvalidRequest, ModelNotFound
from engine.models.manager import check_shape
from server.routes.catalog import readable_catalog

log = logging.getLogger("llamadesk.server")
LATEST = ":latest"
POLL_S = 0.25  # how often a catalog download's progress is looked at
_SPLIT = re.compile(r"^(?P<base>.+)-00001-of-(?P<count>\d{5})\.gguf$")


# ---- names -------------------------------------------------------------------------------------------------

def resolve(svc, name: str) -> str:
    """Our id for an Ollama model name: the name itself, else it without its ':latest' tag, else it with one
    (unchanged when none is served: the engine's 404 names it)."""
    roster = svc.roster
    if name in roster.loaded or name in roster.loading:
        return name
    known = roster.available().keys() | roster.loaded.keys()
    if name in known:
        return name
    if name.endswith(LATEST) and name[:-len(LATEST)] in known:
        return name[:-len(LATEST)]
    if name + LATEST in known:
        return name + LATEST
    return name


def _tagged(name: str) -> str:
    """name as Ollama lists it: with a tag (':latest' when it has none)."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def _local(path: str | None) -> Path | None:
    return Path(path).expanduser().resolve() if path else None


def rostered_files(svc) -> set[Path]:
    """The files the roster's own entries serve."""
    return {p for p in (_local(e.path) for e in svc.config.models if not e.remote) if p is not None}


def is_rostered_file(path: str | None, files: set[Path]) -> bool:
    return _local(path) in files


# ---- pull ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Pulling:
    """A pull as /api/pull follows it: Ollama's progress lines, then the name it is served by."""

    lines: Callable[[], AsyncIterator[dict[str, Any]]]  # progress, up to (not including) success; raises on failure
    finished: asyncio.Future  # the served name once every file is verified (and the roster knows it)


async def pull(svc, name: str) -> Pulling:
    """Start pulling name (a Hugging Face name, or a catalog entry's): errors found before any byte moves raise
    here (a bad name 400, no such repo, quant or entry 404, a gated repo 401, a pull already running 409, a catalog
    file that cannot be used 500)."""
    readable_catalog(svc)  # both kinds are named against the catalog
    if "/" in name:
        return await _pull_from_hub(svc, name)
    return _pull_from_catalog(svc, name)


async def _pull_from_hub(svc, name: str) -> Pulling:
    spec = name[:-len(LATEST)] if name.endswith(LATEST) else name  # Ollama's ':latest' is the default quant
    job = await svc.catalog.pull(spec)
    alias = _tagged(name)

    async def finish() -> str:
        await job.wait()
        if job.error is not None:
            raise job.error
        await _alias(svc, alias, job.path)
        return alias

    async def lines() -> AsyncIterator[dict[str, Any]]:
        async for event in job.events():
            line = _hub_line(event)
            if line is not None:
                yield line
    return Pulling(lines, _retrieved(asyncio.ensure_future(finish())))


def _hub_line(event: dict[str, Any]) -> dict[str, Any] | None:
    """A hub pull's progress event in the shape of Ollama's pull (None for its 'success': said once the roster
    knows the name)."""
    status = event["status"]
    if status == "success":
        return None
    if status.startswith("pulling ") and status != "pulling manifest":
        return {"status": "downloading " + status[len("pulling "):], "digest": event["digest"],
                "total": event["total"], "completed": event["completed"]}
    return {k: v for k, v in event.items() if k in ("status", "digest")}


def _pull_from_catalog(svc, name: str) -> Pulling:
    served = name[:-len(LATEST)] if name.endswith(LATEST) else name
    try:
        entry = svc.catalog.entry(served)
    except ModelNotFound:
        raise ModelNotFound(f"'{name}' is neither a catalog entry nor a Hugging Face model: pull "
                            "hf.co/{owner}/{repo}:{QUANT}, or a name GET /catalog lists", "model") from None
    if entry.kind not in ("llm", "embedding"):
        raise InvalidRequest(f"'{served}' is a {entry.kind} model: /api/pull takes language and embedding models "
                             "(POST /catalog/download fetches the others)", "model")
    downloads = svc.catalog.downloader.downloads
    if cat.local_state(entry, svc.config.models_dir())["state"] == "verified":
        download = None  # on disk already: nothing to fetch
    else:
        running = downloads.get(served)
        if running is None or running.status not in ("queued", "downloading", "verifying"):
            svc.catalog.download(served)  # (a pull already under way is followed, not started again)
        download = downloads[served]

    async def finish() -> str:
        while download is not None and download.status not in ("done", "failed", "cancelled"):
            await asyncio.sleep(POLL_S)
        if download is not None and download.status != "done":
            raise DownloadError(download.error or f"the download of {served} was {download.status}")
        return served
    finished = _retrieved(asyncio.ensure_future(finish()))

    async def lines() -> AsyncIterator[dict[str, Any]]:
        yield {"status": "pulling manifest"}
        told = None
        while download is not None and not finished.done():
            if download.status == "verifying":
                line = {"status": "verifying sha256 digest", "digest": f"sha256:{entry.sha256}"}
            else:
                line = {"status": f"downloading {entry.file}", "digest": f"sha256:{entry.sha256}",
                        "total": download.total or entry.size, "completed": download.bytes}
            if line != told:
                told = line
                yield line
            await asyncio.wait([finished], timeout=POLL_S)
        await finished  # the download's failure, raised
    return Pulling(lines, finished)


def _retrieved(fut: asyncio.Future) -> asyncio.Future:
    """fut, its exception marked as retrieved (a client that left never awaits it)."""
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


async def _alias(svc, name: str, path: Path) -> None:
    """A roster entry naming the pulled file by the name it was pulled by (kept when it exists)."""
    if any(e.name == name for e in svc.config.models):
        return
    await svc.roster.add_entry(ModelEntry(name=name, path=str(path), preload=False))


# ---- copy, create ------------------------------------------------------------------------------------------

def _entry_of(svc, name: str) -> ModelEntry:
    """The roster entry of name, or for a model served from models_dir, a download or a loaded file, an entry
    made for it (ModelNotFound otherwise)."""
    for e in svc.config.models:
        if e.name == name:
            return e
    found = svc.roster.available().get(name)
    if found is not None:
        return found
    m = svc.roster.loaded.get(name)
    if m is not None:
        return ModelEntry(name=name, path=str(m.model.path), chat_template=m.settings.chat_template,
                          tool_format=m.settings.tool_format)
    raise ModelNotFound(f"model '{name}' not found", "model")


def _refuse_taken(svc, name: str, param: str) -> None:
    roster = svc.roster
    if name in roster.loaded or name in roster.loading or name in roster.available() or \
            any(e.name == name for e in svc.config.models):
        raise Conflict(f"a model named '{name}' already exists: delete it first (or pick another name)", param)


async def copy(svc, source: str, destination: str) -> ModelEntry:
    """A roster entry named destination with everything source's has (its file, template and settings)."""
    entry = _entry_of(svc, resolve(svc, source))
    _refuse_taken(svc, destination, "destination")
    copied = dataclasses.replace(entry, name=destination, default=False, preload=False)
    await svc.roster.add_entry(copied)
    log.info("copied model %s to %s", entry.name, destination)
    return copied


# Ollama's Modelfile parameters that roster keys hold: parameter -> key
MODELFILE_KEYS = {"num_ctx": "ctx", "num_batch": "chunk"}


async def create(svc, name: str, source: str, template: str | None, settings: dict[str, Any]) -> ModelEntry:
    """A roster entry named name: source's, with its own chat template (text) and roster settings."""
    entry = _entry_of(svc, resolve(svc, source))
    if entry.remote:
        raise InvalidRequest(f"'from': {entry.name} is a remote model (another server serves it): it has no chat "
                             "template or context here to set", "from")
    _refuse_taken(svc, name, "model")
    created = dataclasses.replace(entry, name=name, default=False, preload=False, **settings)
    try:
        check_shape(created)  # the roster's bounds, as a load would check them
    except InvalidRequest as e:
        ollama = next((k for k, v in MODELFILE_KEYS.items() if v == e.param), e.param)
        raise InvalidRequest(f"'parameters.{ollama}' ({e.param} in the roster): {e.message}", "parameters") from None
    if template is not None:
        await asyncio.to_thread(_check_template, template)
        created.chat_template = str(await asyncio.to_thread(_write_template, svc.config.models_dir(), name, template))
    await svc.roster.add_entry(created)
    log.info("created model %s from %s", name, entry.name)
    return created


def _check_template(text: str) -> None:
    """InvalidRequest unless text is a Jinja chat template that renders a plain conversation."""
    try:
        compiled = ChatTemplate(text, "", "")
    except Exception as e:  # a syntax error, or a template that fails while compiling: the user's text
        raise InvalidRequest(f"'template' is not a Jinja chat template ({e}); llamadesk renders Jinja chat "
                             "templates as GGUF files carry them, not Ollama's Go templates", "template") from None
    if compiled.caps.problem:
        raise InvalidRequest(f"'template' fails on a plain conversation: {compiled.caps.problem}", "template")


def _write_template(models_dir: Path, name: str, text: str) -> Path:
    """The template's file: <models_dir>/templates/<name>-<hash>.jinja, written whole or not at all."""
    folder = models_dir / "templates"
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]
    path = folder / f"{slug}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.jinja"
    tmp = path.with_name(path.name + ".writing")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


# ---- delete ------------------------------------------------------------------------------------------------

async def delete(svc, name: str) -> dict[str, Any]:
    """Remove a model: its roster entry (unloading it first) and the files of ours only it used."""
    name = resolve(svc, name)
    entry = _entry_of(svc, name)
    rostered = [e for e in svc.config.models if e.name == name]
    others = [e for e in svc.config.models if e.name != name]
    if not rostered and is_rostered_file(entry.path, {p for p in (_local(e.path) for e in others) if p}):
        users = ", ".join(e.name for e in others if _local(e.path) == _local(entry.path))
        raise Conflict(f"'{name}' is the file of the model(s) {users}: delete those instead", "model")
    await svc.roster.forget(name)
    removed = await asyncio.to_thread(_remove_ours, svc, entry)
    log.info("deleted model %s%s", name, f" and {', '.join(removed)}" if removed else "")
    return {"model": name, "files_removed": removed}


def _remove_ours(svc, entry: ModelEntry) -> list[str]:
    """Delete the entry's GGUF (and its parts and sidecars) and its template when they live in models_dir and
    nothing else serves them; the paths deleted."""
    models_dir = svc.config.models_dir().expanduser().resolve()
    in_use = {p for e in svc.config.models for p in (_local(e.path), _local(e.chat_template)) if p is not None}
    in_use |= {_local(str(m.model.path)) for m in svc.roster.loaded.values()}
    removed = []
    for path in _files_of(entry):
        if path in in_use or not path.is_relative_to(models_dir) or not path.is_file():
            continue
        path.unlink()
        removed.append(str(path))
        sidecar = path.with_name(path.name + ".sha256")
        if sidecar.exists():
            sidecar.unlink()
    return removed


def _files_of(entry: ModelEntry) -> list[Path]:
    """The entry's GGUF (every part of a split one) and its chat template file."""
    files = []
    model = _local(entry.path)
    if model is not None:
        split = _SPLIT.match(model.name)
        count = int(split.group("count")) if split else 1
        files += [model.with_name(f"{split.group('base')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)] \
            if split else [model]
    template = _local(entry.chat_template)
    if template is not None:
        files.append(template)
    return files

