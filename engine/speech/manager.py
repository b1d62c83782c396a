"""The speech models a server runs: VAD, ASR and TTS services, each started from the configuration,
replaced in process (catalog serve), and explained when missing (degrade, never die)."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable

from engine.config import Config
from engine.errors import EngineError, SpeechUnavailable

log = logging.getLogger("llamadesk.engine")
SHIPPED_VAD = Path(__file__).resolve().parents[2] / "resources" / "models" / "silero_vad.onnx"
WHAT = {"asr": "speech-to-text", "tts": "text-to-speech", "vad": "voice activity detection"}


class SpeechManager:
    """The VAD, ASR and TTS services (None when not loaded) and why a configured one is not serving."""

    def __init__(self, config: Config, refuse_while_benching: Callable[[], None]):
        self.config = config
        self.vad = self.asr = self.tts = None
        self.errors: dict[str, str] = {}
        self._not_benching = refuse_while_benching

    def load(self) -> None:
        """Start the VAD, ASR and TTS services; a model that fails is logged and its routes explain. Blocking;
        call before the server starts or from a worker thread."""
        from engine.speech.asr import AsrService
        from engine.speech.tts import TtsService
        from engine.speech.vad import VadService
        c = self.config
        vad_path = Path(c.vad).expanduser() if c.vad else SHIPPED_VAD
        for kind, make in (("vad", lambda: VadService(vad_path)),
                           ("asr", lambda: AsrService(Path(c.asr).expanduser(), c.asr_workers, self.vad) if c.asr else None),
                           ("tts", lambda: TtsService(Path(c.tts).expanduser()) if c.tts else None)):
            try:
                svc = make()
            except Exception as e:  # a broken model must not take the server down
                msg = e.message if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
                self.errors[kind] = msg
                log.error("%s model not loaded: %s", kind.upper(), msg)
                continue
            setattr(self, kind, svc)
            if svc is not None:
                log.info("%s ready: %s", kind.upper(), getattr(svc, "id", vad_path.name))

    def get(self, kind: str):
        """The VAD, ASR or TTS service, or a clear error saying how to get one."""
        self._not_benching()
        svc = getattr(self, kind)
        if svc is None:
            why = f" ({self.errors[kind]})" if kind in self.errors else ""
            flag = f"start with --{kind} or download one from the catalog" if kind != "vad" else "check --vad"
            raise SpeechUnavailable(f"no {WHAT[kind]} model loaded{why}: {flag}")
        return svc

    async def replace(self, kind: str, path: str) -> None:
        """Serve another ASR or TTS model in process (built off the loop; the old one is closed)."""
        from engine.speech.asr import AsrService
        from engine.speech.tts import TtsService
        if kind == "asr":
            svc = await asyncio.to_thread(AsrService, Path(path), self.config.asr_workers, self.vad)
        else:
            svc = await asyncio.to_thread(TtsService, Path(path))
        old = getattr(self, kind)
        self.errors.pop(kind, None)
        setattr(self, kind, svc)
        if old is not None:
            old.pool.close()
        log.info("%s now serves %s", kind.upper(), svc.id)

    def models(self, created: int) -> list[dict[str, Any]]:
        """The ASR and TTS models as /v1/models entries."""
        out = []
        for kind in ("asr", "tts"):
            svc = getattr(self, kind)
            if svc is not None:
                out.append({"id": svc.id, "object": "model", "created": created, "owned_by": "llamadesk",
                            "kind": kind, "state": "ready", "type": svc.model.kind, "path": str(svc.model.path),
                            **({"voices": svc.model.voices} if kind == "tts" else
                               {"can_translate": svc.model.can_translate})})
        return out

    def stats(self) -> dict[str, Any]:
        """The ASR and TTS workers as /v1/stats reports them."""
        return {k: ({"model": svc.id, **svc.pool.stats()} if svc is not None else
                    {"state": "error" if k in self.errors else "off", "error": self.errors.get(k)})
                for k, svc in (("asr", self.asr), ("tts", self.tts))}

    def close(self) -> None:
        for svc in (self.asr, self.tts, self.vad):
            if svc is not None:
                svc.pool.close()
