"""The catalog as a user meets it: entries with what is on disk and whether each fits, downloads one at a
time, serving a downloaded entry in process, importing a GGUF from disk."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from engine import llama
from engine.catalog import entries as cat
from engine.catalog import hub as hf
from engine.catalog.downloads import Download, Downloader
from engine.config import Config, ModelEntry
from engine.errors import Conflict, InvalidRequest, ModelNotFound
from engine.models.manager import ModelManager
from engine.speech.manager import SpeechManager

log = logging.getLogger("llamadesk.engine")
_LATER_SPLIT = re.compile(r"-(?!0+1-)\d{5}-of-\d{5}$")  # model-00002-of-00003: a part, not a model


class CatalogService:
    """The curated catalog over models_dir, its downloader, and serving its entries."""

    def __init__(self, config: Config, roster: ModelManager, speech: SpeechManager,
                 refuse_while_benching: Callable[[str], None]):
        self.config = config
        self.roster = roster
        self.speech = speech
        self._not_benching = refuse_while_benching
        self._entries: list[cat.Entry] | None = None
        self.downloader: Downloader | None = None
        self.pulls: list[hf.Pull] = []  # from Hugging Face, the latest last

    def start(self) -> None:
        self.downloader = Downloader(self.config.models_dir(), mirror=self.config.catalog_mirror,
                                     on_change=self._on_download)

    async def close(self) -> None:
        if self.downloader:
            await self.downloader.close()

    def entries(self) -> list[cat.Entry]:
        """The catalog (shipped, or catalog_path), read once."""
        if self._entries is None:
            path = Path(self.config.catalog_path).expanduser() if self.config.catalog_path else None
            self._entries = cat.load_catalog(path)
        return self._entries

    def entry(self, name: str) -> cat.Entry:
        for e in self.entries():
            if e.name == name:
                return e
        raise ModelNotFound(f"'{name}' is not in the catalog", "name")

    def starter_set(self) -> tuple[list[cat.Entry], int]:
        """The starter entries and the bytes downloading them all takes (the Catalog's first-run offer)."""
        return cat.starter_set(self.entries())

    def listing(self) -> dict[str, Any]:
        """Every entry with what is on disk, its fit badge and its download state; the box facts."""
        c = self.config
        models_dir = c.models_dir()
        box = cat.box_facts()
        downloads = self.downloader.downloads if self.downloader else {}
        out = []
        for e in self.entries():
            d = cat.describe(e, models_dir, c.ctx, c.streams, c.kv_dtype, box)
            d["download"] = downloads[e.name].as_dict() if e.name in downloads else None
            d["served"] = e.name in self.roster.loaded
            out.append(d)
        pulls = []
        for p in self.pulls:
            tower = p.tower_path
            pulls.append({**p.as_dict(), "vision": None if tower is None else
                          {"file": tower.name, "wired": p.status == "done" and self._wired(p.model, tower)}})
        starter, starter_bytes = self.starter_set()
        return {"box": box, "models_dir": str(models_dir), "entries": out,
                "starter_set": {"entries": [e.name for e in starter], "size": starter_bytes},
                "local": cat.unknown_local_ggufs(self.entries(), models_dir),
                "pulls": pulls}

    def available(self) -> list[ModelEntry]:
        """The language and embedding models on disk that a request may load by name: downloaded catalog
        entries (by entry name) and the other GGUFs in models_dir (by file stem; vision towers and the later
        parts of a split GGUF are not models of their own), each with its vision tower when that is on disk."""
        models_dir = self.config.models_dir()
        out = []
        for e in self.entries():
            if e.kind in ("llm", "embedding"):
                state = cat.local_state(e, models_dir)
                if state["state"] in ("verified", "present"):
                    out.append(ModelEntry(name=e.name, path=state["path"], image_mmproj=self._vision_tower(e)))
        for f in cat.unknown_local_ggufs(self.entries(), models_dir):
            if not f["name"].lower().startswith("mmproj") and not _LATER_SPLIT.search(f["name"]):
                tower = hf.tower_of(Path(f["path"]))
                out.append(ModelEntry(name=f["name"], path=f["path"], image_mmproj=tower and str(tower)))
        return out

    def download(self, name: str, tower: str | None = None) -> dict[str, Any]:
        """Queue the entry (or, with tower, that tower of the entry) for download."""
        self._not_benching("start a download")
        e = self.entry(name)
        if tower is not None:
            if tower not in e.towers:
                raise InvalidRequest(f"'{name}' has no tower '{tower}'; its towers: {', '.join(e.towers) or 'none'}",
                                     "tower")
            e = self.entry(tower)
        return self.downloader.enqueue(e).as_dict()

    def cancel(self, name: str) -> bool:
        """Cancel a queued or running download (False when there is none)."""
        return self.downloader.cancel(name)

    async def serve(self, name: str) -> dict[str, Any]:
        """Serve a downloaded catalog entry now, in process: an LLM or embedding model joins the roster as
        the default (with its towers already on disk wired in: speech models, and the vision projector an LLM
        loads beside its weights), an ASR or TTS model replaces the
        speech model; the result is saved as the authoritative config, so the next start serves it too."""
        e = self.entry(name)
        if e.kind not in ("llm", "embedding", "asr", "tts"):
            raise InvalidRequest(f"'{name}' is a {e.kind} model: it is served as a tower of another entry",
                                 "name")
        path = self._downloaded(e)
        values: dict[str, Any] = {}
        if e.kind in ("asr", "tts"):
            await self.speech.replace(e.kind, path)
            values[e.kind] = path
        else:
            await self._serve_model(ModelEntry(name=e.name, path=path, default=True,
                                               image_mmproj=self._vision_tower(e)))
        towers = []
        for t in (self.entry(t) for t in e.towers):
            state = cat.local_state(t, self.config.models_dir())
            wired = False
            if t.kind in ("asr", "tts") and state["state"] in ("verified", "present"):
                await self.speech.replace(t.kind, state["path"])
                values[t.kind] = state["path"]
                wired = True
            elif t.kind == "mmproj" and state["state"] in ("verified", "present"):
                wired = self._wired(e.name, Path(state["path"]))
            towers.append({"name": t.name, "kind": t.kind, "local": state["state"], "wired": wired})
        await asyncio.to_thread(self.config.save, values, True)
        return {"served": name, "kind": e.kind, "default": e.kind in ("llm", "embedding"),
                "config": str(self.config.path), "towers": towers}

    async def _serve_model(self, entry: ModelEntry) -> None:
        """Load entry as the default model; one loaded without the vision tower it has now is loaded again."""
        loaded = self.roster.loaded.get(entry.name)
        if loaded is not None and loaded.settings.image_mmproj != entry.image_mmproj:
            await self.roster.remove(entry.name)
            loaded = None
        if loaded is None:
            await self.roster.add(entry, make_default=True)
        self.roster.make_default_entry(entry)

    def _vision_tower(self, e: cat.Entry) -> str | None:
        """The path of the LLM entry's first vision (mmproj) tower that is downloaded, or None."""
        for t in (self.entry(t) for t in e.towers if e.kind == "llm"):
            state = cat.local_state(t, self.config.models_dir())
            if t.kind == "mmproj" and state["state"] in ("verified", "present"):
                return state["path"]
        return None

    def _wired(self, name: str, tower: Path) -> bool:
        """Whether the model served by name takes images through tower: loaded with it, or loaded with it by
        the next request naming it."""
        loaded = self.roster.loaded.get(name)
        entry = self.roster.available().get(name)
        mmproj = loaded.settings.image_mmproj if loaded is not None else entry and entry.image_mmproj
        return bool(mmproj) and Path(mmproj).expanduser() == tower

    def _downloaded(self, e: cat.Entry) -> str:
        state = cat.local_state(e, self.config.models_dir())
        if state["state"] not in ("verified", "present"):
            raise Conflict(f"'{e.name}' is not downloaded yet ({state['state']}): POST /catalog/download first")
        return state["path"]

    async def import_gguf(self, path: str) -> dict[str, Any]:
        """Copy a GGUF from disk into models_dir so the catalog lists it (checked to be a GGUF first)."""
        src = Path(path).expanduser()
        llama.check_gguf(src)
        dest_dir = self.config.models_dir()
        dest = dest_dir / src.name
        if dest.exists():
            raise Conflict(f"{dest} already exists")
        dest_dir.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".importing")
        await asyncio.to_thread(shutil.copyfile, src, tmp)
        os.replace(tmp, dest)
        return {"name": dest.stem, "path": str(dest), "size": dest.stat().st_size}

    # ---- Hugging Face ---------------------------------------------------------------------------

    def _puller(self) -> hf.Puller:
        # the hub is read afresh each time: HF_ENDPOINT, HF_TOKEN and hf_token may change while serving
        c = self.config
        return hf.Puller(hf.Hub(token=hf.token_from(c.hf_token)), self.downloader, c.models_dir(), c.ctx, c.streams,
                         c.kv_dtype)

    async def search(self, query: str, limit: int = 20) -> dict[str, Any]:
        """GGUF repos on the hub matching query, most downloaded first."""
        puller = self._puller()
        return {"query": query, "endpoint": puller.hub.endpoint, "models": await puller.hub.search(query, limit)}

    async def files(self, repo: str) -> dict[str, Any]:
        """A hub repo's GGUF models (quant, size, memory needed, fit, the default pick) and vision towers."""
        spec = hf.parse_spec(repo, "repo")
        if spec.quant or spec.file:
            raise InvalidRequest(f"'repo' must be owner/name, got {repo!r}", "repo")
        return await self._puller().describe(spec.repo)

    async def pull(self, model: str, vision: bool = False) -> hf.Pull:
        """Start pulling `repo[:QUANT|/file.gguf]` from the hub into models_dir (verified against the hub's
        sha256; served by name once done); its progress is pull.events() and GET /catalog's `pulls`."""
        self._not_benching("start a download")
        pull = await self._puller().start(hf.parse_spec(model), vision)
        pull.model = hf.served_name(pull.path, self.config.models, self.entries())
        self.pulls = [p for p in self.pulls if p.path != pull.path][-15:] + [pull]  # the last 16, one per file
        return pull

    def _on_download(self, d: Download) -> None:
        for p in self.pulls:
            if p.status == "downloading":
                p.on_change(d)
