"""Shared fixtures: the real test models, and live servers on loopback ports."""
from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from pathlib import Path

import pytest

from tests.assets.prepare import default_dest, prepare

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Servers write their prompt cache to the user cache dir at shutdown and read it back at the next start: the
# tests' servers (in process and launched) use a folder of this run's own, so no run starts warm from another.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="llamadesk-test-cache-")
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="llamadesk-test-data-")  # stored responses, models
TEMPLATES = Path(__file__).resolve().parent / "assets" / "templates"


@pytest.fixture(scope="session")
def assets() -> dict[str, Path]:
    """Paths of the test models (prepared once, cached outside the repo)."""
    return prepare(default_dest())


@pytest.fixture(scope="session")
def tts_standins(tmp_path_factory) -> dict[str, Path]:
    """Kokoro, Kitten, Matcha and MMS (VITS by letters) model folders with their families' real interfaces (tests/assets/tts_standins.py)."""
    from tests.assets import tts_standins
    base = tmp_path_factory.mktemp("tts-standins")
    made = {"kokoro": base / "kokoro-multi-lang-v1_0", "kitten": base / "kitten-nano-en-v0_2-fp16",
            "matcha": base / "matcha-icefall-en_US-ljspeech", "mms": base / "vits-mms-eng"}
    tts_standins.make_kokoro(made["kokoro"])
    tts_standins.make_kitten(made["kitten"])
    tts_standins.make_matcha(made["matcha"])
    tts_standins.make_mms(made["mms"])
    return made


@pytest.fixture(scope="session")
def asr_standins(tmp_path_factory) -> dict[str, Path]:
    """NeMo CTC, SenseVoice, Paraformer, NeMo TDT and icefall transducers, and Moonshine model folders with their families' interfaces (tests/assets/asr_standins.py)."""
    from tests.assets import asr_standins
    base = tmp_path_factory.mktemp("asr-standins")
    made = {"nemo_ctc": base / "sherpa-onnx-nemo-ctc-en-conformer-small",
            "sense_voice": base / "sherpa-onnx-sense-voice-zh-en-ja-ko-yue-2024-07-17",
            "paraformer": base / "sherpa-onnx-paraformer-en-2024-03-09",
            "nemo_transducer": base / "sherpa-onnx-nemo-parakeet-tdt-0.6b-v2-int8",
            "moonshine": base / "sherpa-onnx-moonshine-tiny-en-int8",
            "transducer": base / "sherpa-onnx-zipformer-en-2023-06-26"}
    asr_standins.make_nemo_ctc(made["nemo_ctc"])
    asr_standins.make_sense_voice(made["sense_voice"])
    asr_standins.make_paraformer(made["paraformer"])
    asr_standins.make_parakeet_tdt(made["nemo_transducer"])
    asr_standins.make_moonshine(made["moonshine"])
    asr_standins.make_zipformer_transducer(made["transducer"])
    return made


class LiveServer:
    """The real server (engine + aiohttp) on its own loop in a background thread."""

    def __init__(self, argv: list[str], toml: str, tmp: Path):
        from engine.config import load
        cfg_path = tmp / "llamadesk.toml"
        cfg_path.write_text(toml)
        # the prompt cache stays off disk unless a test asks for it: in-process servers share one environment,
        # so one server's cache would otherwise warm the next one's first requests
        disk = [] if "--cache-disk" in argv else ["--cache-disk", "0"]
        self.config = load(["--config", str(cfg_path), "--port", "0", "--no-gui", *disk, *argv])
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)
        self._thread.start()
        self._ready.wait(120)
        if self._error:
            raise self._error

    def _run(self) -> None:
        from engine.service import Service
        from server.app import start_server
        asyncio.set_event_loop(self.loop)

        async def up() -> None:
            self.service = Service(self.config)
            await asyncio.to_thread(self.service.load_models)
            await asyncio.to_thread(self.service.load_speech)
            self.service.start(self.loop)
            self.server = await start_server(self.service, self.config)

        try:
            self.loop.run_until_complete(up())
        except BaseException as e:  # reported to the test that asked for the server
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return self.server.url

    def client(self):
        """A shared sync openai client (closed with the server)."""
        import openai
        if self._client is None:
            self._client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        return self._client

    def async_client(self, **kw):
        import openai
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **kw)

    def get(self, path: str) -> dict:
        import json
        import urllib.request
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()

        async def down() -> None:
            await self.server.stop()
            await self.service.stop()
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@pytest.fixture(scope="session")
def smol_server(assets, tmp_path_factory) -> LiveServer:
    """SmolLM2-135M (default; also served with a hermes and a thinking chat template written for the tests),
    all-MiniLM-L6-v2 and SmolLM2 made a reranker (tests/assets/reranker_gguf.py) in one roster."""
    toml = f"""
[[models]]
name = "smollm2"
path = "{assets['smollm2']}"
default = true
ctx = 2048

[[models]]
name = "minilm"
path = "{assets['minilm']}"

[[models]]
name = "reranker"
path = "{assets['reranker']}"

[[models]]
name = "smollm2-hermes"
path = "{assets['smollm2']}"
chat_template = "{TEMPLATES / 'hermes.jinja'}"
streams = 2
ctx = 2048

[[models]]
name = "smollm2-gemma"
path = "{assets['smollm2']}"
chat_template = "{TEMPLATES / 'gemma.jinja'}"
streams = 1
ctx = 2048

[[models]]
name = "smollm2-think"
path = "{assets['smollm2']}"
chat_template = "{TEMPLATES / 'chatml_think.jinja'}"
streams = 2
ctx = 2048
"""
    srv = LiveServer(["--streams", "4"], toml, tmp_path_factory.mktemp("smol"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tiny_server(assets, tmp_path_factory) -> LiveServer:
    """The tiny random model: cheap to run many long streams on; small context and body limit."""
    srv = LiveServer(["--model", str(assets["tiny"]), "--ctx", "8192", "--streams", "4", "--max-json-mb", "1"],
                     "", tmp_path_factory.mktemp("tiny"))
    yield srv
    srv.stop()
