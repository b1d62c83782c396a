"""Settings: the configuration schema as a form in groups, each field with a human label (its key and help as the
tooltip) and where its value comes from; checked before anything is saved."""
from __future__ import annotations

import html
import secrets
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout,
                               QLabel, QLineEdit, QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from app.gui import theme
from app.gui.panels.elided import ElidedLabel, breakable
from engine.config import SCHEMA, SECRET_KEYS, ConfigError, Option, load
from engine.origins import check_each, check_origins, is_host
from server.access import is_loopback_bind

# Where each key sits and what it is called on screen; a key missing here still shows, under "Other".
GROUPS: dict[str, dict[str, str]] = {
    "Appearance": {"theme": "Theme"},
    "Server": {"model": "Default model file", "image_mmproj": "Vision projector (mmproj)",
               "host": "Listen address", "port": "Port",
               "jit": "Load models on first request", "idle_ttl": "Unload idle models after (seconds)",
               "max_loaded": "Most models loaded at once", "responses_store_mb": "Stored responses (MiB)",
               "max_json_mb": "Largest request body (MB)", "max_upload_mb": "Largest audio upload (MB)",
               "access_log": "Log every request", "log_level": "Log detail"},
    "Performance": {"ctx": "Context per stream (tokens)", "max_tokens": "Default reply length (tokens)",
                    "streams": "Parallel streams per model", "threads": "CPU threads",
                    "chunk": "Prefill chunk (tokens)",
                    "kv_dtype": "KV cache precision", "kv_unified": "Streams share one KV cache",
                    "cache_ram": "Prompt cache in RAM (MiB)", "cache_disk": "Prompt cache on disk (MiB)",
                    "max_memory": "Memory for models (MiB)", "gpu": "GPU offload"},
    "Speech": {"asr": "Speech-to-text model", "asr_workers": "Speech-to-text workers", "tts": "Text-to-speech model",
               "vad": "Voice activity model", "max_audio_s": "Longest audio (seconds)"},
    "Paths": {"models_dir": "Models folder", "catalog_path": "Catalog file", "catalog_mirror": "Catalog mirror URL"},
    "Security": {"api_key": "API key", "insecure_no_key": "Allow network access without a key",
                 "cors_origins": "Allowed browser origins", "allowed_hosts": "Extra host names",
                 "hf_token": "Hugging Face token"},
}
# Paths get a Browse button: a file (with its filter) or a folder.
PATHS: dict[str, str | None] = {"model": "GGUF models (*.gguf)", "image_mmproj": "GGUF models (*.gguf)",
                                "vad": "ONNX models (*.onnx)",
                                "catalog_path": "TOML files (*.toml)", "asr": None, "tts": None, "models_dir": None}
# What a number's lowest value means, shown instead of the number.
SPECIAL = {"port": "any free port", "threads": "one per core", "cache_ram": "automatic", "cache_disk": "off",
           "max_memory": "automatic (3/4 of RAM)", "idle_ttl": "never", "max_loaded": "no limit",
           "responses_store_mb": "keep none"}
CHOICE_LABELS = {"theme": {"system": "System", "light": "Light", "dark": "Dark"},
                 "gpu": {"auto": "when there is a GPU", "off": "off (CPU only)"}}
SOURCE_WORDS = {"default": "default", "cli": "command line", "toml": "settings file", "app": "this app"}
SOURCE_TIPS = {"default": "not set anywhere: the built-in default", "cli": "from a command-line flag",
               "toml": "from the settings file",
               "app": "chosen in the app (here or View ▸ Theme), remembered apart from the settings file"}
# Preferences of the window itself: remembered by the app, never written to the settings file
APP_KEYS = ("theme",)
ERROR_STYLE = "color: #d0453a"


def label_for(opt: Option) -> str:
    """The human label of a key (from GROUPS, else made from its name)."""
    for labels in GROUPS.values():
        if opt.name in labels:
            return labels[opt.name]
    return opt.name.replace("_", " ").capitalize()


def _group_of(opt: Option) -> str:
    return next((g for g, labels in GROUPS.items() if opt.name in labels), "Other")


# ---- checks on what a field holds (None: fine) ---------------------------------------------------

def check_host(text: str) -> str | None:
    if not is_host(text):
        return f"'{text}' is not an address or host name (for example 127.0.0.1 or 0.0.0.0)"
    return None


def check_url(text: str) -> str | None:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in text:
        return f"'{text}' is not a web address (for example https://example.org/models)"
    return None


def check_hosts(text: str) -> str | None:
    return check_each(text, lambda h: None if h == "*" or is_host(h.removeprefix(".")) else
                      f"'{h}' is not a host name (for example myhost.local, or .example.org for its subdomains)")


def check_secret(text: str) -> str | None:
    if any(c.isspace() for c in text):
        return "no spaces or line breaks"
    return None


def check_api_key(text: str) -> str | None:
    return check_secret(text) or (None if len(text) >= 8 else "at least 8 characters")


def _path_check(kind: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        p = Path(text).expanduser()
        if kind == "file" and not p.is_file():
            return f"no such file: {text}"
        if kind == "dir" and not p.is_dir():
            return f"no such folder: {text}"
        if kind == "new dir" and p.exists() and not p.is_dir():
            return f"{text} is a file, not a folder"
        return None
    return check


CHECKS: dict[str, Callable[[str], str | None]] = {
    "host": check_host, "catalog_mirror": check_url, "cors_origins": check_origins, "allowed_hosts": check_hosts,
    "api_key": check_api_key, "hf_token": check_secret, "model": _path_check("file"), "vad": _path_check("file"),
    "image_mmproj": _path_check("file"),
    "catalog_path": _path_check("file"), "asr": _path_check("dir"), "tts": _path_check("dir"),
    "models_dir": _path_check("new dir")}


# ---- the panel -------------------------------------------------------------------------------------

class Field:
    """One key's row: its editor, an optional Browse or show/hide control, where its value comes from, its error."""

    def __init__(self, opt: Option, panel: QWidget):
        self.opt = opt
        self.editor = _editor(opt)
        self.editor.setToolTip(opt.help)
        self.label = QLabel(label_for(opt))
        self.label.setToolTip(f"{opt.help}\n\nsettings file key: {opt.name} · command-line flag: {opt.flag}")
        self.source = QLabel()
        self.source.setMinimumWidth(self.source.fontMetrics().horizontalAdvance("command line") + 6)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet(ERROR_STYLE)
        self.error.hide()
        self.reveal: QAction | None = None
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        if isinstance(self.editor, (QSpinBox, QComboBox)):
            # numbers and choices in one short column: easier to scan, and the source stays beside them
            self.editor.setFixedWidth(max(220, self.editor.sizeHint().width()))
            row.addWidget(self.editor)
            row.addStretch(1)
        else:
            row.addWidget(self.editor, 1)
        if opt.name in PATHS:
            browse = QPushButton("Browse…")
            browse.setToolTip(f"choose the {label_for(opt).lower()}")
            browse.clicked.connect(lambda: self.browse(panel))
            row.addWidget(browse)
        if opt.name in SECRET_KEYS:
            self.editor.setEchoMode(QLineEdit.EchoMode.Password)
            self.reveal = self.editor.addAction(theme.icon("panels-show"), QLineEdit.ActionPosition.TrailingPosition)
            self.reveal.setCheckable(True)
            self.reveal.setToolTip("show or hide the text")
            self.reveal.toggled.connect(self.on_reveal_toggled)
        row.addWidget(self.source)
        self.widget = QWidget()
        column = QVBoxLayout(self.widget)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addLayout(row)
        column.addWidget(self.error)

    def on_reveal_toggled(self, shown: bool) -> None:
        self.editor.setEchoMode(QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password)
        self.reveal.setIcon(theme.icon("panels-hide" if shown else "panels-show"))

    def browse(self, panel: QWidget) -> None:
        current = self.raw() or ""
        dlg = QFileDialog(panel, f"Choose the {label_for(self.opt).lower()}", str(Path(current).expanduser().parent
                                                                                  if current else Path.home()))
        if PATHS[self.opt.name] is None:
            dlg.setFileMode(QFileDialog.FileMode.Directory)
            dlg.setOption(QFileDialog.Option.ShowDirsOnly, True)
        else:
            dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
            dlg.setNameFilter(PATHS[self.opt.name])
        dlg.fileSelected.connect(self.editor.setText)
        dlg.open()  # not exec(): the shared event loop keeps serving

    def show(self, value: Any) -> None:
        w = self.editor
        if isinstance(w, QComboBox):
            w.setCurrentIndex(max(w.findData(value), 0))
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QSpinBox):
            w.setValue(int(value))
        else:
            w.setText("" if value is None else str(value))

    def raw(self) -> Any:
        w = self.editor
        if isinstance(w, QComboBox):
            return w.currentData()
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QSpinBox):
            return w.value()
        return w.text().strip() or None

    def problem(self) -> str | None:
        """What is wrong with the field's value (the schema's parse, then the key's own check)."""
        raw = self.raw()
        if raw is None:
            return None
        try:
            self.opt.parse(raw, "settings")
        except ConfigError as e:
            return str(e)
        check = CHECKS.get(self.opt.name)
        return check(raw) if check and isinstance(raw, str) else None

    def set_error(self, message: str | None) -> None:
        self.error.setText(breakable(message or ""))
        self.error.setVisible(bool(message))


def _editor(opt: Option) -> QWidget:
    if opt.choices:
        w = QComboBox()
        for choice in opt.choices:
            w.addItem(CHOICE_LABELS.get(opt.name, {}).get(choice, choice), choice)
    elif opt.type is bool:
        w = QCheckBox()
    elif opt.type is int:
        w = QSpinBox()
        w.setRange(opt.minimum if opt.minimum is not None else -2**31,
                   opt.maximum if opt.maximum is not None else 2**31 - 1)
        if opt.name in SPECIAL:
            w.setSpecialValueText(SPECIAL[opt.name])
    else:
        w = QLineEdit()
        if opt.name == "cors_origins":
            w.setPlaceholderText("for example http://localhost:3000, https://app.example.org")
        elif opt.name in PATHS or opt.default is None:
            w.setPlaceholderText("not set")
    return w


class SettingsPanel(QWidget):
    """Edit, check, save (the settings file then wins over command-line flags) and apply (reload in process)."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.rows: dict[str, Field] = {}
        form_host = QWidget()
        groups = QVBoxLayout(form_host)
        self.groups = {name: QGroupBox(name) for name in (*GROUPS, "Other")}
        forms = {name: QFormLayout(box) for name, box in self.groups.items()}
        for opt in SCHEMA:
            if not opt.cli_only:
                f = self.rows[opt.name] = Field(opt, self)
                forms[_group_of(opt)].addRow(f.label, f.widget)
        label_width = max(f.label.sizeHint().width() for f in self.rows.values())
        for f in self.rows.values():
            f.label.setMinimumWidth(label_width)  # one column of labels down every group
        for name, box in self.groups.items():
            forms[name].setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
            if forms[name].rowCount():
                groups.addWidget(box)
        groups.addStretch(1)
        # (option, editor, source label) per key: what the window's tests and callers read
        self.fields: dict[str, tuple[Option, QWidget, QLabel]] = {n: (f.opt, f.editor, f.source)
                                                                  for n, f in self.rows.items()}
        if "theme" in self.rows:
            self.rows["theme"].editor.currentIndexChanged.connect(self.on_theme_chosen)
        key = self.rows["api_key"]
        key.reveal.toggled.connect(lambda _shown: self._show_key())
        key.editor.textChanged.connect(lambda _text: self._show_key())
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(form_host)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # Serving beyond loopback needs an API key: the switch makes one and shows it to copy.
        self.network = QCheckBox("Serve on the local network")
        self.network.setToolTip("Listens on every network interface instead of this machine only: other machines "
                                "connect with the API key ('Authorization: Bearer <key>' on every request; the "
                                "health check stays open).")
        self.network.toggled.connect(self.on_network_toggled)
        self.key_line = ElidedLabel()
        self.copy_key = QPushButton(theme.icon("panels-copy"), "Copy key")
        self.copy_key.clicked.connect(self.on_copy_key)
        network_row = QHBoxLayout()
        network_row.addWidget(self.network)
        network_row.addWidget(self.key_line, 1)
        network_row.addWidget(self.copy_key)
        self.path = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)
        self.notice = QLabel("Saving writes these settings to the settings file, and from then on they win over "
                             "command-line flags: a flag such as --port no longer changes a saved setting. "
                             "“Save and apply” also restarts the server with them now.")
        self.notice.setWordWrap(True)
        self.message = QLabel()
        self.message.setWordWrap(True)
        validate = QPushButton("Check")
        validate.setToolTip("check every field without saving")
        save = QPushButton("Save")
        save.setToolTip("write the settings file (used at the next start, or with Save and apply)")
        self.apply_button = QPushButton("Save and apply")
        self.apply_button.setToolTip("write the settings file and restart the server with it now")
        validate.clicked.connect(self.validate)
        save.clicked.connect(self.save)
        self.apply_button.clicked.connect(self.save_and_apply)
        buttons = QHBoxLayout()
        buttons.addWidget(self.path, 1)
        for b in (validate, save, self.apply_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addLayout(network_row)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.notice)
        layout.addWidget(self.message)
        layout.addLayout(buttons)
        bridge.reloaded.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        """Show the running configuration and where each value came from."""
        cfg = self.bridge.host.config
        self.path.setText(f"settings file: {cfg.path}")
        for name, f in self.rows.items():
            f.editor.blockSignals(True)
            f.show(cfg.values[name])
            f.editor.blockSignals(False)
            f.set_error(None)
            self._show_source(f, cfg.sources[name])
            if f.reveal is not None:
                f.reveal.setChecked(False)
        self._show_theme()
        self.network.blockSignals(True)
        self.network.setChecked(not is_loopback_bind(cfg.host))
        self.network.blockSignals(False)
        self._show_key()

    @staticmethod
    def _show_source(f: Field, source: str) -> None:
        f.source.setText(SOURCE_WORDS.get(source, source))
        f.source.setToolTip(SOURCE_TIPS.get(source, source))

    def _show_theme(self) -> None:
        """The theme in use, and where it comes from: a --theme flag, a choice the app remembers, or the file."""
        if "theme" in self.rows:
            f = self.rows["theme"]
            f.editor.blockSignals(True)
            f.show(theme.current())
            f.editor.blockSignals(False)
            state, source = self.bridge.ui_state, self.bridge.host.config.sources["theme"]
            chosen = source != "cli" and state is not None and state.value(theme.THEME_KEY) is not None
            self._show_source(f, "app" if chosen else source)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange) and self.rows:
            self._show_theme()  # switched in the View menu: the form says so too

    def on_theme_chosen(self, _index: int) -> None:
        """Switch the colours at once and remember them (not in the settings file: see APP_KEYS)."""
        name = self.rows["theme"].raw()
        theme.apply(QApplication.instance(), name)
        self.bridge.save_theme(name)
        self._show_theme()

    def on_network_toggled(self, on: bool) -> None:
        """Bind every interface with a key (one is made, and shown, when there is none), or loopback again."""
        host, key = self.rows["host"], self.rows["api_key"]
        host.editor.setText("0.0.0.0" if on else "127.0.0.1")
        if on and not key.editor.text().strip():
            key.editor.setText(secrets.token_urlsafe(24))
            key.reveal.setChecked(True)  # a new key: shown so it can be copied to the other machines
        self._show_key()
        self.message.setText("Save and apply to serve on the local network" if on else
                             "Save and apply to serve on this machine only")

    def _show_key(self) -> None:
        key = self.rows["api_key"]
        text = key.editor.text().strip()
        shown = self.network.isChecked() and bool(text)
        masked = key.editor.echoMode() != QLineEdit.EchoMode.Normal
        self.key_line.setText(("API key: " + ("•" * 12 if masked else text)) if shown else "")
        self.copy_key.setVisible(shown)

    def on_copy_key(self) -> None:
        QGuiApplication.clipboard().setText(self.rows["api_key"].editor.text().strip())
        self.message.setText("API key copied")

    def problems(self) -> dict[str, str]:
        """Every field's problem, and those of fields together (serving on the network needs a key)."""
        out = {name: p for name, f in self.rows.items() if (p := f.problem())}
        host, key = self.rows["host"].raw(), self.rows["api_key"].raw()
        if ("host" not in out and host and not is_loopback_bind(host) and not key
                and not self.rows["insecure_no_key"].raw()):
            out["api_key"] = (f"listening on {host} lets other machines in: set an API key (or tick "
                              "“Allow network access without a key”)")
        if "image_mmproj" in self.rows and self.rows["image_mmproj"].raw() and not self.rows["model"].raw():
            out.setdefault("image_mmproj", "a vision projector belongs to the default model file: set that too")
        return out

    def values(self) -> dict:
        """The form's values, parsed by the schema (raises ConfigError naming the key)."""
        return {name: None if (raw := f.raw()) is None else f.opt.parse(raw, "settings")
                for name, f in self.rows.items()}

    def validate(self) -> dict | None:
        """Show each field's problem beside it; the values when there is none."""
        problems = self.problems()
        for name, f in self.rows.items():
            f.set_error(problems.get(name))
        if problems:
            names = ", ".join(label_for(self.rows[n].opt) for n in problems)
            self.message.setText(f"<span style='{ERROR_STYLE}'>Nothing saved: fix {names}.</span>")
            return None
        self.message.setText("Every setting is valid.")
        return self.values()

    def save(self) -> bool:
        """Write the settings file when every field is valid; the source labels then say where each value
        will come from."""
        vals = self.validate()
        if vals is None:
            return False
        cfg = self.bridge.host.config
        path = self.bridge.save_settings(cfg, {k: v for k, v in vals.items() if k not in APP_KEYS})
        try:
            saved = load([*(self.bridge.host.argv or []), "--config", path])
        except ConfigError as e:
            self.message.setText(f"<span style='{ERROR_STYLE}'>saved to {breakable(path)}, but it does not read "
                                 f"back: {html.escape(breakable(str(e)))}</span>")
            return True
        file_keys = [n for n in self.rows if n not in APP_KEYS]
        for name in file_keys:
            self._show_source(self.rows[name], saved.sources[name])
        pending = [label_for(self.rows[n].opt) for n in file_keys if saved.values[n] != cfg.values[n]]
        self.message.setText(breakable(f"Saved to {path}.")
                             + (f" Used from the next start, or now with Save and apply: {', '.join(pending)}."
                                if pending else ""))
        return True

    def save_and_apply(self) -> None:
        """Save, then restart the server in process with the saved file (and the flags it started with)."""
        if self.save():
            cfg = self.bridge.host.config
            self.bridge.apply(load([*(self.bridge.host.argv or []), "--config", str(cfg.path)]))
