"""One declarative configuration schema: it generates the CLI flags, the TOML keys and the
per-key source report (default / toml / cli) that /config and the Settings panel show."""
from __future__ import annotations

import argparse
import os
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import platformdirs

from engine import rpc

APP_NAME = "llamadesk"


class ConfigError(Exception):
    """A configuration value is invalid; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Option:
    """One configuration key: its TOML name is `name`, its flag `--name-with-dashes`."""

    name: str
    type: type
    default: Any
    help: str
    short: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    cli_only: bool = False  # flags that make no sense in a config file
    check: Callable[[Any, str], None] | None = None  # more than a type can say (raises ConfigError naming label)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, raw: Any, where: str) -> Any:
        """Convert raw (a CLI string or a TOML value) to this option's type, or raise ConfigError."""
        label = f"{self.flag} ({where})" if where == "cli" else f"'{self.name}' ({where})"
        value = raw
        try:
            if self.type is bool:
                if isinstance(raw, str):
                    if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                        raise ValueError
                    value = raw.lower() in ("1", "true", "yes", "on")
                elif not isinstance(raw, bool):
                    raise ValueError
            elif self.type is int:
                if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                    raise ValueError
                value = int(raw)
            elif self.type is str:
                if not isinstance(raw, str):
                    raise ValueError
                if "\x00" in raw or len(raw) > 4096:  # no path, URL or name holds a NUL or runs that long
                    raise ConfigError(f"invalid value for {label}: a NUL character or more than 4096 characters")
        except ValueError:
            raise ConfigError(f"invalid value for {label}: {raw!r} is not {_type_word(self.type)}") from None
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"invalid value for {label}: {raw!r}; allowed: {', '.join(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"invalid value for {label}: {raw!r}; must be >= {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"invalid value for {label}: {raw!r}; must be <= {self.maximum}")
        if self.check is not None:
            self.check(value, label)
        return value


def _type_word(t: type) -> str:
    return {int: "an integer", bool: "a boolean (true/false)", str: "a string"}[t]


KV_DTYPES = ("f16", "q8_0", "q4_0")  # the KV cache element types llama.cpp offers on CPU and GPU

SCHEMA: tuple[Option, ...] = (
    Option("config", str, None, "path of the TOML config file", short="-c", cli_only=True),
    Option("model", str, None, "GGUF file to serve (adds it to the roster as the default model)", short="-m"),
    Option("image_mmproj", str, None, "vision projector GGUF (mmproj) of --model: its chat then takes images"),
    Option("host", str, "127.0.0.1", "address to bind; 0.0.0.0 exposes the server to the network"),
    Option("port", int, 8080, "TCP port of the OpenAI-compatible server (0 = any free port)", short="-p",
           minimum=0, maximum=65535),
    Option("ctx", int, 4096, "context length per stream, in tokens (clamped to the model's training context)",
           minimum=64, maximum=1 << 22),
    Option("max_tokens", int, 4096, "default completion length when a request does not say", minimum=1,
           maximum=1 << 22),
    Option("streams", int, 4, "concurrent generation streams per model (continuous batching)", short="-s",
           minimum=1, maximum=64),
    Option("threads", int, 0, "CPU threads for llama.cpp (0 = one per core)", short="-t", minimum=0, maximum=1024),
    Option("chunk", int, 512, "largest prefill slice per scheduler tick, in tokens", minimum=16, maximum=1 << 16),
    Option("kv_dtype", str, "f16", "KV cache element type", choices=KV_DTYPES),
    Option("kv_unified", bool, True, "one KV cell pool per model that all its streams draw from, so streams share "
           "a common prefix's cells; off: each stream owns ctx cells"),
    Option("cache_ram", int, -1, "host-RAM prompt cache per model, in MiB: KV states of conversations evicted from "
           "the KV, restored when they come back (-1: an eighth of the RAM, at most 8192; 0: off)", minimum=-1,
           maximum=1 << 20),
    Option("cache_disk", int, 2048, "of the prompt cache, MiB written to the user cache dir at a clean shutdown and "
           "read back at the next start, per model (0: off)", minimum=0, maximum=1 << 20),
    Option("responses_store_mb", int, 256, "stored Responses API responses (store, previous_response_id), MiB kept "
           "in the user data dir across restarts, the oldest dropped first (0: none kept)", minimum=0,
           maximum=1 << 20),
    Option("jit", bool, True, "a request naming an available model that is not loaded (a roster entry, a "
           "downloaded catalog entry, a GGUF in models_dir) loads it; off: 404"),
    Option("idle_ttl", int, 3600, "seconds a model loaded on demand stays loaded while idle (-1: until unloaded; "
           "models loaded at start stay unless their roster entry sets ttl)", minimum=-1, maximum=366 * 86400),
    Option("max_memory", int, -1, "MiB that loaded models may take together (weights, KV cache, compute "
           "buffers, estimated before a load); idle models are unloaded to make room (-1: 3/4 of the RAM)",
           minimum=-1, maximum=1 << 30),
    Option("max_loaded", int, 0, "most models loaded at once (0: no limit beyond --max-memory)", minimum=0,
           maximum=1024),
    Option("gpu", str, "auto", "offload layers to a GPU when llama.cpp has one", choices=("auto", "off")),
    Option("gpu_layers", str, "auto", "layers each model offloads with --gpu auto: auto (as many as fit the free "
           "GPU memory, with their KV cache), all (or -1), or a count N (0: CPU only); a roster entry's "
           "gpu_layers overrides it", check=lambda v, label: _check_gpu_layers(v, label)),
    Option("rpc", str, None, "comma-separated llama.cpp rpc-server addresses (host:port,…) that every local model "
           "offloads all its layers to (a roster entry's rpc overrides it); see `llamadesk rpc-server`",
           check=lambda v, label: _check_rpc(v, True, label)),
    Option("rpc_allow_lan", bool, False, "allow rpc-server addresses beyond this machine: rpc-server has no "
           "authentication, so only on a LAN you trust"),
    Option("models_dir", str, None, "where downloaded models live (default: the user data dir)"),
    Option("asr", str, None, "speech-to-text model directory (whisper, moonshine, NeMo, SenseVoice, Paraformer)"),
    Option("asr_workers", int, 1, "speech-to-text worker threads, each with its own recognizer", minimum=1, maximum=16),
    Option("tts", str, None, "text-to-speech model directory (Piper/VITS, Kokoro, Kitten or Matcha + vocoder)"),
    Option("vad", str, None, "Silero VAD model (default: the one shipped with llamadesk)"),
    Option("catalog_mirror", str, None, "base URL serving catalog files by name (offline mirrors, tests)"),
    Option("catalog_path", str, None, "a catalog TOML to use instead of the one shipped with llamadesk"),
    Option("hf_token", str, None, "Hugging Face token for pulling gated and private repos (default: $HF_TOKEN, "
           "then the token file `hf auth login` writes)"),
    Option("max_json_mb", int, 16, "largest JSON request body, in MB (413 beyond)", minimum=1, maximum=1024),
    Option("max_upload_mb", int, 64, "largest audio upload, in MB (413 beyond)", minimum=1, maximum=4096),
    Option("max_audio_s", int, 7200, "longest audio a transcription decodes, in seconds (413 beyond; /vad takes 120)",
           minimum=1, maximum=7 * 86400),
    Option("cors_origins", str, None, "comma-separated browser origins allowed to call the API (CORS); * for any",
           check=lambda v, label: _check_origins(v, label)),
    Option("allowed_hosts", str, None, "comma-separated extra host names the server answers to (Host header; "
           "loopback names always); * for any"),
    Option("api_key", str, None, "when set, every request must carry 'Authorization: Bearer <key>'"),
    Option("insecure_no_key", bool, False, "allow serving beyond loopback (--host 0.0.0.0) without an API key"),
    Option("access_log", bool, True, "log one line per request (method, path, status, duration, Origin); "
           "--access-log off to silence"),
    Option("log_level", str, "info", "logging level", choices=("debug", "info", "warning", "error")),
    Option("theme", str, "system", "the desktop app's colours: system (the platform's), light or dark",
           choices=("system", "light", "dark")),
    Option("no_gui", bool, False, "run the server headless, without importing Qt", cli_only=True),
)
OPTIONS = {o.name: o for o in SCHEMA}
# Who can reach the server and with what key: changed from the GUI, the CLI or the file, never by an HTTP
# request without the API key (a web page in the user's browser could otherwise open the server up).
SECRET_KEYS = ("api_key", "hf_token")  # shown as *** by /config and left out of the diagnostics
NETWORK_KEYS = ("host", "api_key", "cors_origins", "allowed_hosts", "insecure_no_key",
                "rpc", "rpc_allow_lan")  # rpc: where models' weights and prompts go
MODEL_KEYS = {"name": str, "path": str, "default": bool, "ctx": int, "streams": int, "chunk": int,
              "kv_dtype": str, "chat_template": str, "tool_format": str, "kv_unified": bool, "cache_ram": int,
              "cache_disk": int, "ttl": int, "preload": bool, "image_mmproj": str,
              "backend": str, "url": str, "urls": list, "api_key": str, "api_key_env": str, "remote_model": str,
              "timeout": int, "rpc": (str, list), "gpu_layers": (str, int)}
BACKENDS = ("local", "remote")  # local: a GGUF llama.cpp serves here; remote: an OpenAI-compatible server elsewhere
# The keys a remote entry takes; every other roster key is about a GGUF served here.
REMOTE_KEYS = ("name", "backend", "default", "url", "urls", "api_key", "api_key_env", "remote_model", "timeout")
SHARED_KEYS = ("name", "backend", "default")  # the keys a local entry shares with a remote one
REMOTE_TIMEOUT_S = (1, 86400)  # bounds of a remote entry's timeout
# The tool-call wire formats engine/tools.py parses and constrains (the one list); a roster entry may also
# say "none" (tools refused with a 400).
TOOL_FORMATS = ("hermes", "llama_json", "mistral", "harmony", "gemma", "generic")


@dataclass
class ModelEntry:
    """One [[models]] roster entry; per-entry settings override the global ones."""

    name: str
    path: str = ""  # a remote entry has none
    default: bool = False
    ctx: int | None = None
    streams: int | None = None
    chunk: int | None = None
    kv_dtype: str | None = None
    chat_template: str | None = None  # a Jinja file replacing the GGUF's template (llama-server's --chat-template-file)
    tool_format: str | None = None  # override the detected tool-call format; "none" refuses tools
    kv_unified: bool | None = None  # the global kv_unified, cache_ram (MiB) and cache_disk (MiB) for this model
    cache_ram: int | None = None
    cache_disk: int | None = None
    ttl: int | None = None  # seconds idle before it is unloaded (-1: never); default: stays if preloaded
    preload: bool | None = None  # false: listed, and loaded by the first request naming it
    image_mmproj: str | None = None  # its vision projector GGUF (mmproj): chat messages may hold images
    backend: str = "local"  # "remote": served by url / urls, an OpenAI-compatible server elsewhere
    url: str | None = None  # the upstream's OpenAI base URL (".../v1"; a bare host:port means its /v1)
    urls: list[str] | None = None  # more replicas of the same upstream model
    api_key: str | None = field(default=None, repr=False)  # sent upstream as the bearer token (kept in the file)
    api_key_env: str | None = None  # or the environment variable holding it (kept out of the file)
    remote_model: str | None = None  # the upstream's id for the model (default: name)
    timeout: int | None = None  # seconds an upstream may stay silent (before its answer or between events)
    rpc: str | list[str] | None = None  # rpc-servers holding its layers (None: the global rpc; [] or "": here)
    gpu_layers: str | int | None = None  # layers it offloads ("auto", "all", N; None: the global gpu_layers)

    @property
    def remote(self) -> bool:
        """Whether another server serves this entry (backend = "remote")."""
        return self.backend == "remote"


_OMITTED = {"path": "", "backend": "local", "default": False}  # written to the file only when they say more


_SAVING = threading.Lock()


@dataclass
class Config:
    """Effective configuration: values, where each came from, and the model roster."""

    values: dict[str, Any]
    sources: dict[str, str]
    models: list[ModelEntry] = field(default_factory=list)
    path: Path | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def report(self) -> dict[str, dict[str, Any]]:
        """Each key with its value, source and help, for /config and the Settings panel."""
        return {o.name: {"value": self.values[o.name], "source": self.sources[o.name], "help": o.help}
                for o in SCHEMA}

    def save(self, values: dict[str, Any] | None = None, apply: bool = False) -> Path | None:
        """The one writer of the config file: values (None drops a key) and the roster, as the authoritative
        TOML; apply: the running configuration takes the values too (as if read from the file). Blocking
        (a small file); returns the path, or None when this configuration has no file."""
        values = values or {}
        if apply:
            for k, v in values.items():
                self.values[k] = v
                self.sources[k] = "toml"
        if self.path is None:
            return None
        with _SAVING:  # the roster, /config, the catalog and the window may save at once, from threads
            _write_toml(self.path, values, list(self.models))
        return self.path

    def rpc_for(self, entry: ModelEntry) -> tuple[str, ...]:
        """The rpc-servers a local entry offloads to: its own rpc, else the global one (checked at load)."""
        return rpc.split_addresses(self.values.get("rpc") if entry.rpc is None else entry.rpc)

    def models_dir(self) -> Path:
        """Where models live: models_dir, else $LLAMADESK_MODELS_DIR, else <user data dir>/models."""
        if self.values.get("models_dir"):
            return Path(self.values["models_dir"]).expanduser()
        if os.environ.get("LLAMADESK_MODELS_DIR"):
            return Path(os.environ["LLAMADESK_MODELS_DIR"]).expanduser()
        return Path(platformdirs.user_data_dir(APP_NAME)) / "models"


def _write_toml(path: Path, values: dict[str, Any], models: list[ModelEntry]) -> None:
    """Write values and the roster into the TOML at path, keeping its comments and other keys,
    marked authoritative (its values then win over CLI flags). Written atomically."""
    import tomlkit
    doc = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    doc["authoritative"] = True
    for k, v in values.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    roster = tomlkit.aot()
    for m in models:
        t = tomlkit.table()
        for k in MODEL_KEYS:
            v = getattr(m, k)
            if v is not None and v != _OMITTED.get(k):
                t[k] = v
        roster.append(t)
    doc["models"] = roster
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomlkit.dumps(doc))
    os.replace(tmp, path)


def default_config_path() -> Path:
    """llamadesk.toml in the platform's user config dir."""
    return Path(platformdirs.user_config_dir(APP_NAME)) / "llamadesk.toml"


# what app/main.py runs instead of the server when the first argument names it (each has its own --help)
COMMANDS = """commands (instead of serving; first on the command line):
  llamadesk bench ...          llama-bench-style prompt and generation speed of a GGUF (bench --help)
  llamadesk pull ...           download a catalog entry or a Hugging Face GGUF into the models folder (pull --help)
  llamadesk rpc-server ...     llama.cpp's rpc-server, for a llamadesk elsewhere to offload to with --rpc
  llamadesk --install-desktop  a desktop entry and icon for this user (XDG; Linux), pointing at this program
  llamadesk --uninstall-desktop  remove them"""


def build_parser() -> argparse.ArgumentParser:
    """The CLI, generated from SCHEMA; every flag defaults to 'not given'."""
    p = argparse.ArgumentParser(prog=APP_NAME, description="Run local AI models behind an OpenAI-compatible API.",
                                argument_default=argparse.SUPPRESS, epilog=COMMANDS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for o in SCHEMA:
        names = [o.flag] + ([o.short] if o.short else [])
        default_txt = "" if o.default is None else f" (default: {o.default})"
        if o.type is bool:  # --flag turns it on; --flag off (or false/no/0) turns it off
            p.add_argument(*names, nargs="?", const="true", dest=o.name, metavar="on|off", help=o.help)
        else:
            metavar = "{" + ",".join(o.choices) + "}" if o.choices else o.name.upper()
            p.add_argument(*names, dest=o.name, metavar=metavar, help=o.help + default_txt)
    return p


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None


def _parse_models(raw: Any, path: Path) -> list[ModelEntry]:
    if not isinstance(raw, list):
        raise ConfigError(f"'models' in {path} must be an array of tables ([[models]])")
    entries = []
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("backend", "local") != "local":
            entries.append(_parse_remote(item, i + 1, path))
            continue
        if not isinstance(item, dict) or "path" not in item:
            raise ConfigError(f"[[models]] entry {i + 1} in {path} needs a 'path' (or backend = \"remote\" and a "
                              "'url')")
        for k, v in item.items():
            if k not in MODEL_KEYS:
                raise ConfigError(f"unknown key '{k}' in [[models]] entry {i + 1}; allowed: {', '.join(MODEL_KEYS)}")
            if k in REMOTE_KEYS and k not in SHARED_KEYS:
                raise ConfigError(f"'{k}' in [[models]] entry {i + 1} is for a remote model: add "
                                  "backend = \"remote\" (and no 'path')")
            if k == "tool_format" and v not in (*TOOL_FORMATS, "none"):
                raise ConfigError(f"invalid value for 'tool_format' in [[models]] entry {i + 1}: {v!r}; "
                                  f"allowed: {', '.join(TOOL_FORMATS)}, none")
            if k == "rpc":
                _check_rpc(v, True, f"'rpc' in [[models]] entry {i + 1}")  # the form; beyond loopback: in load()
            elif k == "gpu_layers":
                _check_gpu_layers(v, f"'gpu_layers' in [[models]] entry {i + 1}")
            elif k in OPTIONS:
                OPTIONS[k].parse(v, f"[[models]] {i + 1}")
            elif not isinstance(v, MODEL_KEYS[k]) or isinstance(v, bool) and MODEL_KEYS[k] is not bool:
                raise ConfigError(f"invalid value for '{k}' in [[models]] entry {i + 1}: {v!r}")
        item = dict(item)
        item.setdefault("name", Path(item["path"]).stem)
        entries.append(ModelEntry(**item))
    _check_remote_names(entries, path)
    return entries


def _parse_remote(item: dict[str, Any], n: int, path: Path) -> ModelEntry:
    """A [[models]] entry with backend = "remote": a name, one or more http(s) base URLs, a key or the
    environment variable holding it, the upstream's model id and a timeout; nothing about a local GGUF."""
    where = f"[[models]] entry {n} in {path}"
    if item["backend"] not in BACKENDS:
        raise ConfigError(f"invalid value for 'backend' in {where}: {item['backend']!r}; allowed: "
                          f"{', '.join(BACKENDS)}")
    for k, v in item.items():
        if k not in REMOTE_KEYS:
            raise ConfigError(f"'{k}' does not apply to a remote model ({where}, backend = \"remote\"); its keys: "
                              f"{', '.join(REMOTE_KEYS)}")
        if not isinstance(v, MODEL_KEYS[k]) or isinstance(v, bool) and MODEL_KEYS[k] is not bool:
            raise ConfigError(f"invalid value for '{k}' in {where}: {v!r}")
        if isinstance(v, str) and ("\x00" in v or len(v) > 4096 or not v.strip()):
            raise ConfigError(f"invalid value for '{k}' in {where}: empty, a NUL character or over 4096 characters")
    if "name" not in item:
        raise ConfigError(f"{where} needs a 'name' (what requests call the model)")
    urls = ([item["url"]] if "url" in item else []) + list(item.get("urls", []))
    if not urls:
        raise ConfigError(f"{where} needs a 'url' (the upstream's OpenAI-compatible base URL, e.g. "
                          "\"http://gpu-box:8000/v1\") or 'urls' (replicas)")
    for u in urls:
        _check_url(u, where)
    if "api_key" in item and "api_key_env" in item:
        raise ConfigError(f"{where} sets both 'api_key' and 'api_key_env'; keep one")
    lo, hi = REMOTE_TIMEOUT_S
    if "timeout" in item and not lo <= item["timeout"] <= hi:
        raise ConfigError(f"invalid value for 'timeout' in {where}: {item['timeout']}; seconds from {lo} to {hi}")
    return ModelEntry(**item)


def _check_url(url: Any, where: str) -> None:
    """ConfigError unless url is an http(s) URL with a host, and no user, query or fragment."""
    from urllib.parse import urlsplit
    if not isinstance(url, str):
        raise ConfigError(f"invalid URL in {where}: {url!r} is not a string")
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 -- raises ValueError for a port out of range or not a number
    except ValueError as e:
        raise ConfigError(f"invalid URL {url!r} in {where}: {e}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"invalid URL {url!r} in {where}: an upstream is an http:// or https:// URL with a host, "
                          "e.g. \"http://gpu-box:8000/v1\"")
    if u.username is not None or u.query or u.fragment:
        raise ConfigError(f"invalid URL {url!r} in {where}: no user, query or fragment (put a key in 'api_key' "
                          "or 'api_key_env')")


def _check_rpc(value: Any, allow_lan: bool, where: str) -> None:
    """ConfigError unless value is rpc-server addresses (a "host:port,…" string or a list of them), each on
    this machine unless allow_lan."""
    try:
        addresses = rpc.split_addresses(value)
    except rpc.RpcAddressError as e:
        raise ConfigError(f"invalid value for {where}: {e}") from None
    far = [a for a in addresses if not rpc.is_loopback(a)]
    if far and not allow_lan:
        raise ConfigError(f"{where}: {', '.join(far)} is not on this machine, and rpc-server has no authentication "
                          "(anyone who reaches its port can use it and read or write the memory it holds): add --rpc-allow-lan "
                          "(rpc_allow_lan = true) to use rpc-servers on a LAN you trust")


def _check_gpu_layers(value: Any, where: str) -> None:
    """ConfigError unless value is "auto", "all" or a layer count (-1: all), as a string or a TOML integer."""
    from engine.models.gpu import requested
    try:
        requested(value)
    except (TypeError, ValueError):
        said = str(value).lower() if isinstance(value, bool) else repr(value)  # as the TOML file spells it
        raise ConfigError(f"invalid value for {where}: {said}; allowed: auto, all, or a number of layers "
                          "(0: CPU only, -1: all)") from None


def _check_remote_names(entries: list[ModelEntry], path: Path) -> None:
    """A remote entry's name is its own: requests naming it go upstream, so no other entry may share it."""
    seen: dict[str, ModelEntry] = {}
    for e in entries:
        other = seen.setdefault(e.name, e)
        if other is not e and (e.remote or other.remote):
            raise ConfigError(f"two [[models]] entries in {path} are named '{e.name}'; a remote model's name must "
                              "be its own")


def _check_origins(value: str, label: str) -> None:
    """ConfigError unless value is a comma-separated list of origins (the Settings panel's check too)."""
    from engine.origins import check_origins
    problem = check_origins(value) if value else None
    if problem:
        raise ConfigError(f"invalid value for {label}: {problem}")


def load(argv: list[str] | None = None, env_path: Path | None = None) -> Config:
    """Merge defaults, the TOML file and the CLI into one Config (raises ConfigError)."""
    cli_raw = vars(build_parser().parse_args(argv))
    cli = {k: OPTIONS[k].parse(v, "cli") for k, v in cli_raw.items()}

    path = Path(cli["config"]).expanduser() if cli.get("config") else (env_path or default_config_path())
    toml: dict[str, Any] = {}
    models: list[ModelEntry] = []
    authoritative = False
    if path.exists() or cli.get("config"):
        doc = _read_toml(path)
        authoritative = bool(doc.pop("authoritative", False))
        if "models" in doc:
            models = _parse_models(doc.pop("models"), path)
        for k, v in doc.items():
            opt = OPTIONS.get(k)
            if opt is None or opt.cli_only:
                allowed = ", ".join(o.name for o in SCHEMA if not o.cli_only)
                raise ConfigError(f"unknown key '{k}' in {path}; allowed: {allowed}, authoritative, [[models]]")
            toml[k] = opt.parse(v, "toml")

    layers = [("default", {o.name: o.default for o in SCHEMA})]
    layers += [("cli", cli), ("toml", toml)] if authoritative else [("toml", toml), ("cli", cli)]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, layer in layers:
        for k, v in layer.items():
            values[k] = v
            sources[k] = source
    cfg = Config(values=values, sources=sources, models=models, path=path)
    _check_rpc(values.get("rpc"), values["rpc_allow_lan"], f"{OPTIONS['rpc'].flag} ({sources['rpc']})")
    for i, m in enumerate(models):
        if m.rpc is not None:
            _check_rpc(m.rpc, values["rpc_allow_lan"], f"'rpc' in [[models]] entry {i + 1} ({m.name})")
    if values.get("model"):
        # --model puts that file first as the default; the roster keeps its other entries.
        name = Path(values["model"]).stem
        cfg.models = [ModelEntry(name=name, path=values["model"], default=True,
                                 image_mmproj=values.get("image_mmproj"))] + \
                     [m for m in models if m.name != name]
        for m in cfg.models[1:]:
            m.default = False
    elif values.get("image_mmproj"):
        raise ConfigError("--image-mmproj is the vision projector of --model, which is not given; a roster entry "
                          "takes one as image_mmproj in its [[models]] table")
    return cfg
