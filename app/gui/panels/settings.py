"""Settings: the effective config as a form generated from the schema, each key with its source."""
from __future__ import annotations

import secrets

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton,
                               QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from engine.config import SCHEMA, ConfigError, Option, load
from server.access import is_loopback_bind


class SettingsPanel(QWidget):
    """Edit, validate, save (authoritative TOML) and apply (reload in process)."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.fields: dict[str, tuple[Option, QWidget, QLabel]] = {}
        form_host = QWidget()
        self.form = QFormLayout(form_host)
        for opt in SCHEMA:
            if opt.cli_only:
                continue
            widget = self._widget(opt)
            widget.setToolTip(opt.help)
            source = QLabel()
            row = QHBoxLayout()
            row.addWidget(widget, 1)
            row.addWidget(source)
            self.form.addRow(opt.name, row)
            self.fields[opt.name] = (opt, widget, source)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(form_host)
        # Serving beyond loopback needs an API key: the switch makes one and shows it to copy.
        self.network = QCheckBox("Serve on the local network")
        self.network.setToolTip("Binds 0.0.0.0 instead of 127.0.0.1: other machines connect with the API key "
                                "('Authorization: Bearer <key>' on every request; /health stays open).")
        self.network.toggled.connect(self.on_network_toggled)
        self.key_line = QLabel()
        self.key_line.setTextInteractionFlags(self.key_line.textInteractionFlags().TextSelectableByMouse)
        self.copy_key = QPushButton("Copy key")
        self.copy_key.clicked.connect(self.on_copy_key)
        network_row = QHBoxLayout()
        network_row.addWidget(self.network)
        network_row.addWidget(self.key_line, 1)
        network_row.addWidget(self.copy_key)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.path = QLabel()
        validate = QPushButton("Validate")
        save = QPushButton("Save")
        self.apply_button = QPushButton("Save and apply")
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
        layout.addWidget(self.message)
        layout.addLayout(buttons)
        bridge.reloaded.connect(self.refresh)
        self.refresh()

    @staticmethod
    def _widget(opt: Option) -> QWidget:
        if opt.choices:
            w = QComboBox()
            w.addItems(list(opt.choices))
        elif opt.type is bool:
            w = QCheckBox()
        elif opt.type is int:
            w = QSpinBox()
            w.setRange(opt.minimum if opt.minimum is not None else -2**31, opt.maximum or 2**31 - 1)
        else:
            w = QLineEdit()
        return w

    def refresh(self) -> None:
        """Show the running configuration and where each value came from."""
        cfg = self.bridge.host.config
        self.path.setText(f"config file: {cfg.path}")
        for name, (opt, w, source) in self.fields.items():
            v = cfg.values[name]
            if isinstance(w, QComboBox):
                w.setCurrentText(str(v))
            elif isinstance(w, QCheckBox):
                w.setChecked(bool(v))
            elif isinstance(w, QSpinBox):
                w.setValue(int(v))
            else:
                w.setText("" if v is None else str(v))
            source.setText(cfg.sources[name])
        self.network.blockSignals(True)
        self.network.setChecked(not is_loopback_bind(cfg.host))
        self.network.blockSignals(False)
        self._show_key()

    def on_network_toggled(self, on: bool) -> None:
        """Bind every interface with a key (one is made when there is none), or loopback again."""
        _, host, _ = self.fields["host"]
        _, key, _ = self.fields["api_key"]
        host.setText("0.0.0.0" if on else "127.0.0.1")
        if on and not key.text().strip():
            key.setText(secrets.token_urlsafe(24))
        self._show_key()
        self.message.setText("Save and apply to serve on the local network" if on else
                             "Save and apply to serve on this machine only")

    def _show_key(self) -> None:
        _, key, _ = self.fields["api_key"]
        shown = self.network.isChecked() and bool(key.text().strip())
        self.key_line.setText(f"API key: {key.text().strip()}" if shown else "")
        self.copy_key.setVisible(shown)

    def on_copy_key(self) -> None:
        _, key, _ = self.fields["api_key"]
        QGuiApplication.clipboard().setText(key.text().strip())
        self.message.setText("API key copied")

    def values(self) -> dict:
        """The form's values, parsed by the schema (raises ConfigError naming the key)."""
        out = {}
        for name, (opt, w, _) in self.fields.items():
            if isinstance(w, QComboBox):
                raw = w.currentText()
            elif isinstance(w, QCheckBox):
                raw = w.isChecked()
            elif isinstance(w, QSpinBox):
                raw = w.value()
            else:
                raw = w.text().strip() or None
            out[name] = None if raw is None else opt.parse(raw, "settings")
        return out

    def validate(self) -> dict | None:
        try:
            vals = self.values()
        except ConfigError as e:
            self.message.setText(f"<span style='color:#c0392b'>{e}</span>")
            return None
        self.message.setText("valid")
        return vals

    def save(self) -> bool:
        vals = self.validate()
        if vals is None:
            return False
        path = self.bridge.save_settings(self.bridge.host.config, vals)
        self.message.setText(f"saved to {path} (authoritative: these values win over command-line flags)")
        return True

    def save_and_apply(self) -> None:
        if self.save():
            cfg = self.bridge.host.config
            self.bridge.apply(load(["--config", str(cfg.path)]))
