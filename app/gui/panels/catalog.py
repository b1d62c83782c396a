"""Catalog: curated models, each with a one-line description, capability badges, size, license and whether it fits
this machine (the ones to start with tagged "recommended"); downloads with their progress, and with the reason and
Retry when one fails; serve, show in folder, import. A welcome card on the first run. And any GGUF from Hugging
Face: search, a repo's files with quant, size and fit, Download (pull)."""
from __future__ import annotations

import html

from PySide6.QtCore import QRect, QRectF, QSize, Qt, QUrl
from PySide6.QtGui import QColor, QDesktopServices, QFont, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QFileDialog, QFrame, QGroupBox, QHBoxLayout,
                               QHeaderView, QLabel, QLineEdit, QProgressBar, QPushButton, QStyle, QStyledItemDelegate,
                               QStyleOptionViewItem, QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from app.gui.panels.elided import ElidedLabel, breakable
from app.gui.theme import icon
from engine.catalog.entries import KINDS
from engine.errors import EngineError

COLUMNS = ["model", "size", "fit", "license", "status"]  # the kind shows as a badge, and the kind filter picks it
MODEL, SIZE, FIT, LICENSE, STATUS = range(len(COLUMNS))
REPO_COLUMNS = ["repo", "downloads", "likes"]
FILE_COLUMNS = ["quant", "file", "size", "fit", ""]
ACTIVE = ("queued", "downloading", "verifying", "extracting")
WELCOME_FOLDED = "catalog/welcome_folded"  # in the window's state: the welcome card folded to its title line
ON_DISK = ("verified", "present")
BADGE_COLORS = {"recommended": "#a35a00", "tools": "#2f6fdf", "vision": "#8e44ad", "reasoning": "#b9410c",
                "embedding": "#0f7f70", "speech": "#2e7d32"}
FIT_COLORS = {"fits": "#2e8b57", "tight": "#c27c0e", "too big": "#d0453a"}
ERROR_COLOR, WARN_COLOR = "#d0453a", "#c27c0e"
DESCRIPTION_ROLE = Qt.ItemDataRole.UserRole + 1
BADGES_ROLE = Qt.ItemDataRole.UserRole + 2
TAGS_ROLE = Qt.ItemDataRole.UserRole + 3


def _size(n: int, estimated: bool) -> str:
    s = f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"
    return ("~" + s) if estimated else s


def badges(entry: dict, by_name: dict[str, dict]) -> list[str]:
    """What the entry can do: tools (a trained tool-call format), vision, reasoning, embedding, speech."""
    towers = {by_name[t]["kind"] for t in entry.get("towers", []) if t in by_name}
    kind = entry["kind"]
    out = []
    if kind == "llm" and entry.get("tool_format") not in ("", "generic", None):
        out.append("tools")
    if kind == "mmproj" or "mmproj" in towers:
        out.append("vision")
    if entry.get("thinking"):
        out.append("reasoning")
    if kind == "embedding":
        out.append("embedding")
    if kind in ("asr", "tts") or towers & {"asr", "tts"}:
        out.append("speech")
    return out


def memory_budget(box: dict) -> int:
    """The bytes a recommended model may need: half of the GPU's memory, else a quarter of the RAM (on a CPU a
    model's speed falls with its size, so a CPU box is offered smaller ones)."""
    if box.get("vram_bytes"):
        return max(box["vram_bytes"], box["ram_bytes"]) // 2
    return box["ram_bytes"] // 4


def recommend(entries: list[dict], box: dict, n: int = 3) -> list[dict]:
    """The chat models to start with on this box: within memory_budget, the largest of each family, at most n."""
    budget = memory_budget(box)
    fitting = sorted((e for e in entries if e["kind"] == "llm" and e["memory_needed"] <= budget),
                     key=lambda e: -e["memory_needed"])
    picks: list[dict] = []
    for e in fitting:
        if e["family"] not in {p["family"] for p in picks}:
            picks.append(e)
        if len(picks) == n:
            break
    return picks


def _pill(painter: QPainter, word: str, x: int, line: QRect, font: QFont) -> int:
    """Draw a rounded badge at x on line; the x after it."""
    fm = QFontMetrics(font)
    w, h = fm.horizontalAdvance(word) + 12, fm.height() + 2
    rect = QRectF(x, line.center().y() - h / 2 + 1, w, h)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(BADGE_COLORS.get(word, "#666666")))
    painter.drawRoundedRect(rect, h / 2, h / 2)
    painter.setPen(QColor("#ffffff"))
    painter.setFont(font)
    painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, word)
    return int(rect.right()) + 5


def _pills_width(words: list[str], font: QFont) -> int:
    fm = QFontMetrics(font)
    return sum(fm.horizontalAdvance(w) + 17 for w in words)


class ModelDelegate(QStyledItemDelegate):
    """A model's cell: its name in full (and a "recommended" tag) over its capability badges and its one-line
    description, elided to the column."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        name, opt.text = opt.text, ""
        style = opt.widget.style() if opt.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)  # background, selection
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        color = opt.palette.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        bold, small = _fonts(opt.font)
        r = opt.rect.adjusted(6, 3, -6, -3)
        top = QRect(r.left(), r.top(), r.width(), r.height() // 2)
        bottom = QRect(r.left(), top.bottom() + 1, r.width(), r.height() - top.height())
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setFont(bold)
        painter.setPen(color)
        painter.drawText(top, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, name)
        x = top.left() + QFontMetrics(bold).horizontalAdvance(name) + 8
        for tag in index.data(TAGS_ROLE) or []:
            x = _pill(painter, tag, x, top, small)
        x = bottom.left()
        for word in index.data(BADGES_ROLE) or []:
            x = _pill(painter, word, x, bottom, small)
        muted = QColor(color)
        muted.setAlpha(255 if selected else 185)
        painter.setFont(opt.font)
        painter.setPen(muted)
        rest = QRect(x, bottom.top(), max(bottom.right() - x, 0), bottom.height())
        description = index.data(DESCRIPTION_ROLE) or ""
        painter.drawText(rest, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         QFontMetrics(opt.font).elidedText(description, Qt.TextElideMode.ElideRight, rest.width()))
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index) -> QSize:  # noqa: N802
        bold, small = _fonts(option.font)
        name = index.data(Qt.ItemDataRole.DisplayRole) or ""
        width = QFontMetrics(bold).horizontalAdvance(name) + 8 + _pills_width(index.data(TAGS_ROLE) or [], small)
        return QSize(width + 10, 2 * QFontMetrics(option.font).height() + 12)


def _fonts(base: QFont) -> tuple[QFont, QFont]:
    bold = QFont(base)
    bold.setBold(True)
    small = QFont(base)
    if base.pointSizeF() > 0:
        small.setPointSizeF(base.pointSizeF() * 0.85)
    else:
        small.setPixelSize(max(int(base.pixelSize() * 0.85), 8))
    return bold, small


class StatusCell(QWidget):
    """A row's state: what is on disk, the download's progress, or why it failed with Retry."""

    def __init__(self, on_retry):
        super().__init__()
        self.name = ""
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.text = ElidedLabel()
        self.retry = QPushButton(icon("panels-retry"), "Retry")
        self.retry.setToolTip("download again (it resumes where it stopped)")
        self.retry.clicked.connect(lambda: on_retry(self.name))
        row = QHBoxLayout(self)
        row.setContentsMargins(4, 2, 4, 2)
        row.addWidget(self.bar, 1)
        row.addWidget(self.text, 1)
        row.addWidget(self.retry)

    def show_entry(self, e: dict) -> None:
        self.name = e["name"]
        d = e["download"]
        status = d["status"] if d else None
        self.bar.setVisible(status == "downloading" and not d["error"])  # an error while downloading: it retries
        self.retry.setVisible(status == "failed")
        self.text.setVisible(not self.bar.isVisibleTo(self))
        if self.bar.isVisibleTo(self):
            self._progress(d)
            return
        color = ""
        if status == "failed":
            text, color = d["error"] or "the download failed", ERROR_COLOR
        elif status in ACTIVE and d["error"]:
            text, color = f"retrying (attempt {d['attempts']}): {d['error']}", WARN_COLOR
        elif status in ACTIVE:
            text = {"queued": "waiting for the download before it", "verifying": "checking the download…",
                    "extracting": "unpacking…"}.get(status, status)
        elif e["served"]:
            text = "serving"
        elif e["local"]["state"] in ON_DISK:
            text = "downloaded"
        elif e["local"]["state"] == "partial":
            text = "partly downloaded: Download resumes it"
        else:
            text = "cancelled" if status == "cancelled" else ""
        self.text.setText(text)
        self.text.setStyleSheet(f"color: {color}" if color else "")

    def _progress(self, d: dict) -> None:
        total = d["total"] or 0
        self.bar.setValue(int(1000 * d["bytes"] / total) if total else 0)
        rate = f" · {d['rate'] / 1e6:.1f} MB/s" if d["rate"] else ""
        self.bar.setFormat(f"{100 * d['bytes'] / total:.0f}%{rate}" if total else "starting…")
        eta = f", about {d['eta_s']:.0f} s left" if d.get("eta_s") else ""
        self.bar.setToolTip(f"{_size(d['bytes'], False)} of {_size(total, False)}{eta}" if total else "")


class CatalogTable(QTableWidget):
    """The model table; it tells the panel when its width changes, so the model column can take what is free."""

    def __init__(self, on_resize):
        super().__init__(0, len(COLUMNS))
        self._on_resize = on_resize

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._on_resize()


class WelcomeCard(QFrame):
    """The first run: the models that fit this machine, a download away; or a GGUF the user already has."""

    def __init__(self, panel: "CatalogPanel"):
        super().__init__()
        self.panel = panel
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel("Welcome! Pick a model that fits this machine")
        font = self.title.font()
        font.setBold(True)
        if font.pointSizeF() > 0:
            font.setPointSizeF(font.pointSizeF() * 1.15)
        self.title.setFont(font)
        self.title.setWordWrap(True)
        hide = QPushButton(icon("panels-cancel"), "Hide")
        hide.setFlat(True)
        hide.setToolTip("hide this card (the catalog below has every model)")
        hide.clicked.connect(panel.dismiss_welcome)
        self.fold = QPushButton()
        self.fold.setFlat(True)
        self.fold.clicked.connect(lambda: self.set_collapsed(not self.collapsed))
        title_row = QHBoxLayout()
        title_row.addWidget(self.title, 1)
        title_row.addWidget(self.fold)
        title_row.addWidget(hide)
        self.intro = QLabel()
        self.intro.setWordWrap(True)
        self.picks = QVBoxLayout()
        self.pick_buttons: dict[str, QPushButton] = {}
        self.open_button = QPushButton(icon("panels-open"), "Open a GGUF you already have…")
        self.open_button.setToolTip("serve a GGUF file from this machine now (it stays where it is)")
        self.open_button.clicked.connect(panel.ask_open)
        self.starter_button = QPushButton(icon("panels-download"), "Try the starter models")
        self.starter_button.clicked.connect(panel.download_starters)
        buttons = QHBoxLayout()
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.starter_button)
        buttons.addStretch(1)
        self.details = QWidget()  # all but the title: folded away, the table below gets the room
        details = QVBoxLayout(self.details)
        details.setContentsMargins(0, 0, 0, 0)
        details.setSpacing(4)
        details.addWidget(self.intro)
        details.addLayout(self.picks)
        details.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)  # folded, one line: at 900x600 the table needs the room
        layout.setSpacing(4)
        layout.addLayout(title_row)
        layout.addWidget(self.details)
        state = panel.bridge.ui_state
        self.set_collapsed(state is not None and state.value(WELCOME_FOLDED, False, bool))

    def set_collapsed(self, collapsed: bool) -> None:
        """Fold the card to its title line (or unfold it); remembered for the next start."""
        self.collapsed = collapsed
        self.details.setVisible(not collapsed)
        self.fold.setText("Show choices" if collapsed else "Fewer")
        self.fold.setIcon(icon("panels-show" if collapsed else "panels-hide"))
        self.fold.setToolTip("show the recommended models again" if collapsed else
                             "fold this card to one line: more of the catalog shows")
        state = self.panel.bridge.ui_state
        if state is not None and state.value(WELCOME_FOLDED, False, bool) != collapsed:
            state.setValue(WELCOME_FOLDED, collapsed)

    def show_choices(self, picks: list[dict], starters: list[dict], box: dict, downloads: dict[str, str]) -> None:
        """The recommended entries with a Download each, and the starter set's button when there is one."""
        gpu = f" and {box['vram_bytes'] / 2**30:.0f} GiB of GPU memory" if box.get("vram_bytes") else ""
        self.title.setText(f"Welcome! Pick a model that fits this machine ({box['ram_bytes'] / 2**30:.0f} GiB of "
                           f"memory{gpu})")
        self.intro.setText("These run well here; the one you download is served as soon as it is here." if picks else
                           "No catalog model fits this machine's memory comfortably: open a GGUF you already have, "
                           "or pick one below.")
        if [p["name"] for p in picks] != list(self.pick_buttons):
            self._rebuild(picks)
        for name, button in self.pick_buttons.items():
            status = downloads.get(name)
            button.setEnabled(status not in ACTIVE)
            button.setText("Downloading…" if status in ACTIVE else "Download")
        self.starter_button.setVisible(bool(starters))
        if starters:
            total = sum(e["size"] for e in starters)
            self.starter_button.setText(f"Try the starter models (~{total / 1e6:.0f} MB)")
            self.starter_button.setToolTip("download " + ", ".join(e["name"] for e in starters))

    def _rebuild(self, picks: list[dict]) -> None:
        while self.picks.count():
            item = self.picks.takeAt(0)
            if item.layout():
                while item.layout().count():
                    w = item.layout().takeAt(0).widget()
                    if w:
                        w.deleteLater()
                item.layout().deleteLater()
        self.pick_buttons = {}
        for e in picks:
            row = QHBoxLayout()
            name = QLabel(e["name"])
            bold = name.font()
            bold.setBold(True)
            name.setFont(bold)
            about = ElidedLabel(f"{_size(e['size'], e['size_estimated'])} · {e.get('description') or e['family']}")
            about.setToolTip(f"{about.full_text()}\nneeds about {e['memory_needed'] / 2**30:.1f} GiB of memory")
            button = QPushButton(icon("panels-download"), "Download")
            button.setToolTip(f"download {e['name']}, then serve it")
            button.clicked.connect(lambda _=False, n=e["name"]: self.panel.download_and_serve(n))
            row.addWidget(name)
            row.addWidget(about, 1)
            row.addWidget(button)
            self.picks.addLayout(row)
            self.pick_buttons[e["name"]] = button

    def pick_names(self) -> list[str]:
        return list(self.pick_buttons)


class CatalogPanel(QWidget):
    """Pick, download and serve a model without a terminal."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.entries: list[dict] = []
        self.recommended: set[str] = set()
        self._selected: str | None = None
        self._failure: dict | None = None  # the failure shown in the problem strip: name, action, message
        self._failures_seen: set[tuple[str, str]] = set()
        self._serve_when_done: set[str] = set()  # picked on the welcome card: served once downloaded
        self._welcome_dismissed = False
        self.welcome = WelcomeCard(self)
        self.welcome.hide()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter by name, kind, family, description, license")
        self.filter.setClearButtonEnabled(True)
        self.kind = QComboBox()
        self.kind.addItems(["all kinds", *KINDS])
        self.empty = QLabel()
        self.empty.setWordWrap(True)
        self.empty.setTextFormat(Qt.TextFormat.PlainText)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.hide()
        self.box = QLabel()
        self.box.setWordWrap(True)  # a long models path must not widen the window past its size
        self.table = CatalogTable(self._fit_columns)
        self._setup_table()
        self.problem = QFrame()
        self.problem.setFrameShape(QFrame.Shape.StyledPanel)
        self.problem_text = QLabel()
        self.problem_text.setWordWrap(True)
        self.problem_text.setTextFormat(Qt.TextFormat.RichText)
        self.retry_button = QPushButton(icon("panels-retry"), "Retry")
        self.retry_button.clicked.connect(self.retry_failure)
        self.logs_link = QPushButton(icon("panels-logs"), "Open Logs")
        self.logs_link.setFlat(True)
        self.logs_link.setToolTip("the Logs panel has every line the server wrote about it")
        self.logs_link.clicked.connect(self.open_logs)
        problem_row = QHBoxLayout(self.problem)
        problem_row.setContentsMargins(6, 2, 6, 2)  # at 900x600 every pixel is the table's
        problem_row.addWidget(self.problem_text, 1)
        problem_row.addWidget(self.retry_button)
        problem_row.addWidget(self.logs_link)
        self.problem.hide()
        self.download_button = QPushButton(icon("panels-download"), "Download")
        self.cancel_button = QPushButton(icon("panels-cancel"), "Cancel")
        self.serve_button = QPushButton(icon("panels-serve"), "Serve")
        self.folder_button = QPushButton(icon("panels-folder"), "Show in folder")
        self.import_button = QPushButton(icon("panels-import"), "Import GGUF…")
        self.import_button.setToolTip("copy a GGUF from this machine into the models folder: it is then served "
                                      "by its file name, loaded by the first request that names it")
        self.import_button.clicked.connect(self.ask_import)
        self.local = QLabel()
        self.local.setWordWrap(True)
        self.download_button.clicked.connect(lambda: self._act("download"))
        self.cancel_button.clicked.connect(lambda: self._act("cancel"))
        self.serve_button.clicked.connect(lambda: self._act("serve"))
        self.folder_button.clicked.connect(self.show_folder)
        self.filter.textChanged.connect(self.render)
        self.kind.currentTextChanged.connect(self.render)
        self.table.itemSelectionChanged.connect(self.on_selection_changed)
        top = QHBoxLayout()
        top.addWidget(self.filter, 1)
        top.addWidget(self.kind)
        actions = QHBoxLayout()
        actions.addWidget(self.box, 1)
        for b in (self.download_button, self.cancel_button, self.serve_button, self.folder_button):
            actions.addWidget(b)
        local_row = QHBoxLayout()
        local_row.addWidget(self.local, 1)
        local_row.addWidget(self.import_button)
        curated = QWidget()
        curated_layout = QVBoxLayout(curated)
        curated_layout.setContentsMargins(6, 6, 6, 6)
        curated_layout.addLayout(top)
        curated_layout.addWidget(self.empty, 1)
        curated_layout.addWidget(self.table, 1)
        curated_layout.addWidget(self.problem)
        curated_layout.addLayout(actions)
        curated_layout.addLayout(local_row)
        self.tabs = QTabWidget()
        self.tabs.addTab(curated, "Curated models")
        self.tabs.addTab(self._hub_box(), icon("panels-search"), "Search Hugging Face")
        layout = QVBoxLayout(self)
        layout.addWidget(self.welcome)
        layout.addWidget(self.tabs, 1)
        self.update_buttons()
        bridge.stats_updated.connect(self.on_stats_updated)
        bridge.reloaded.connect(self.refresh)
        bridge.hub_results.connect(self.on_hub_results)
        bridge.hub_files.connect(self.on_hub_files)
        bridge.hub_failed.connect(self.on_hub_failed)

    def _setup_table(self) -> None:
        t = self.table
        t.setHorizontalHeaderLabels(COLUMNS)
        t.setItemDelegateForColumn(MODEL, ModelDelegate(t))
        t.verticalHeader().setVisible(False)
        t.verticalHeader().setDefaultSectionSize(2 * t.fontMetrics().height() + 14)
        t.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        t.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        t.setWordWrap(False)
        header = t.horizontalHeader()
        header.setStretchLastSection(False)
        for c in (SIZE, FIT):
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        t.setColumnWidth(LICENSE, t.fontMetrics().horizontalAdvance("apache-2.0") + 10)  # the whole one: its tooltip
        # the status column's width for a reason and Retry, and the least it gives up to the names (it elides)
        self._status_width = t.fontMetrics().horizontalAdvance("Cannot reach hug") + 70
        self._status_least = t.fontMetrics().horizontalAdvance("downloading")
        t.setColumnWidth(STATUS, self._status_width)

    def _fit_columns(self) -> None:
        """The model column gets the width the others leave, never less than its longest name: on a narrow
        window the status column (elided text) narrows first, so the table does not scroll sideways."""
        t = self.table
        fixed = sum(t.columnWidth(c) for c in (SIZE, FIT, LICENSE))
        names = t.sizeHintForColumn(MODEL)
        status = max(self._status_least, min(self._status_width, t.viewport().width() - fixed - names))
        t.setColumnWidth(STATUS, status)
        t.setColumnWidth(MODEL, max(names, t.viewport().width() - fixed - status))

    # ---- Hugging Face ----------------------------------------------------------------------------

    def _hub_box(self) -> QGroupBox:
        """Search Hugging Face, a repo's GGUFs, Download."""
        self.hub_query = QLineEdit()
        self.hub_query.setPlaceholderText("search Hugging Face for GGUF models")
        self.hub_search_button = QPushButton(icon("panels-search"), "Search")
        self.hub_repos = _table(REPO_COLUMNS)
        self.hub_models = _table(FILE_COLUMNS)
        self.hub_vision = QCheckBox("with its vision tower")
        self.hub_pull_button = QPushButton(icon("panels-download"), "Download")
        self.hub_status = QLabel()
        self.hub_status.setWordWrap(True)
        self.hub_search_button.clicked.connect(self.search_hub)
        self.hub_query.returnPressed.connect(self.search_hub)
        self.hub_repos.itemSelectionChanged.connect(self.on_repo_selected)
        self.hub_pull_button.clicked.connect(self.pull_selected)
        self.hub_repo_list: list[dict] = []
        self.hub_model_list: list[dict] = []
        self._pull_shown: tuple | None = None
        search = QHBoxLayout()
        search.addWidget(self.hub_query, 1)
        search.addWidget(self.hub_search_button)
        tables = QHBoxLayout()
        tables.addWidget(self.hub_repos, 1)
        tables.addWidget(self.hub_models, 1)
        actions = QHBoxLayout()
        actions.addWidget(self.hub_status, 1)
        actions.addWidget(self.hub_vision)
        actions.addWidget(self.hub_pull_button)
        box = QGroupBox("Hugging Face")
        inner = QVBoxLayout(box)
        inner.addLayout(search)
        inner.addLayout(tables, 1)
        inner.addLayout(actions)
        return box

    def search_hub(self) -> None:
        query = self.hub_query.text().strip()
        if query:
            self.hub_status.setText(f"searching for {query}…")
            self.bridge.search_hub(query)

    def on_hub_results(self, query: str, repos: list) -> None:
        self.hub_repos.clearSelection()  # a new list: picking its first row must read as a choice
        self.hub_repo_list = repos
        self.hub_repos.setRowCount(len(repos))
        for r, m in enumerate(repos):
            for c, text in enumerate((m["id"], f"{m['downloads']:,}", f"{m['likes']:,}")):
                self.hub_repos.setItem(r, c, _item(text))
        self.hub_models.setRowCount(0)
        self.hub_status.setText(f"{len(repos)} GGUF repos for {query}" if repos else f"no GGUF repo matches {query}")

    def on_repo_selected(self) -> None:
        rows = self.hub_repos.selectionModel().selectedRows()
        row = rows[0].row() if rows else -1
        if 0 <= row < len(self.hub_repo_list):
            self.hub_status.setText(f"listing {self.hub_repo_list[row]['id']}…")
            self.bridge.hub_repo(self.hub_repo_list[row]["id"])

    def on_hub_files(self, repo: str, doc: dict) -> None:
        self.hub_model_list = doc["models"]
        self.hub_models.setRowCount(len(self.hub_model_list))
        default = None
        for r, m in enumerate(self.hub_model_list):
            parts = f" ({len(m['parts'])} parts)" if len(m["parts"]) > 1 else ""
            for c, text in enumerate((m["quant"] or "?", m["file"] + parts, _size(m["size"], False), m["fit"],
                                      "default" if m["default"] else "")):
                self.hub_models.setItem(r, c, _item(text))
            if m["default"]:
                default = r
        if default is not None:
            self.hub_models.selectRow(default)
        self.hub_vision.setEnabled(bool(doc["vision"]))
        towers = f"; vision tower {doc['vision'][0]['path']}" if doc["vision"] else ""
        self.hub_status.setText(f"{repo}: {len(self.hub_model_list)} GGUF models{towers}")

    def on_hub_failed(self, message: str) -> None:
        self.hub_status.setText(message)

    def pull_selected(self) -> None:
        row = self.hub_models.currentRow()
        if 0 <= row < len(self.hub_model_list):
            model = self.hub_model_list[row]["pull"]
            self.hub_status.setText(f"pulling {model}…")
            self.bridge.pull(model, self.hub_vision.isEnabled() and self.hub_vision.isChecked())

    def show_pulls(self, pulls: list[dict]) -> None:
        """The latest pull's progress under the search (when it moved: the search's own lines stay otherwise)."""
        p = pulls[-1] if pulls else None
        if p is None or (p["spec"], p["status"], p["completed"]) == self._pull_shown:
            return
        self._pull_shown = (p["spec"], p["status"], p["completed"])
        if p["status"] == "downloading":
            self.hub_status.setText(f"pulling {p['spec']}: {_size(p['completed'], False)} of "
                                    f"{_size(p['size'], False)}")
        elif p["status"] == "done":
            self.hub_status.setText(f"pulled {p['spec']}: a request for the model '{p['model']}' serves it")
        else:
            self.hub_status.setText(f"pull of {p['spec']} {p['status']}: {p['error']}")

    # ---- the curated catalog -----------------------------------------------------------------------

    def on_stats_updated(self, _stats: dict) -> None:
        if self.isVisible():
            self.refresh()

    def refresh(self) -> None:
        try:
            doc = self.bridge.catalog()
        except Exception as e:  # a broken catalog file must not take the window down
            self.box.setText(breakable(f"The catalog cannot be read: {e}"))
            return
        if doc is None:
            return
        self.entries = doc["entries"]
        self.show_pulls(doc.get("pulls", []))
        local = [f["name"] for f in doc.get("local", [])]
        self.local.setText(f"Other GGUFs in the models folder ({len(local)}), served by name on demand: "
                           + ", ".join(local) if local else "No other GGUFs in the models folder.")
        b = doc["box"]
        self.box.setText(breakable(f"this box: {b['ram_bytes'] / 2**30:.0f} GiB RAM"
                                    + (f", {b['vram_bytes'] / 2**30:.0f} GiB VRAM" if b.get("vram_bytes") else "")
                                    + f" · models in {doc['models_dir']}"))
        picks = recommend(self.entries, b)
        self.recommended = {e["name"] for e in picks}
        self._show_welcome(doc, picks)
        self._follow_downloads()
        self.render()

    def _nothing_installed(self, doc: dict) -> bool:
        """No model to chat with or embed: none downloaded, no GGUF in the models folder, none in the roster."""
        return (not any(e["kind"] in ("llm", "embedding") and e["local"]["state"] in ON_DISK for e in doc["entries"])
                and not doc.get("local") and not any(m.get("kind") not in ("asr", "tts") for m in self.bridge.models()))

    def dismiss_welcome(self) -> None:
        self._welcome_dismissed = True
        self.welcome.hide()

    def _show_welcome(self, doc: dict, picks: list[dict]) -> None:
        if self._welcome_dismissed or not self._nothing_installed(doc):
            self.welcome.hide()
            return
        downloads = {e["name"]: e["download"]["status"] for e in doc["entries"] if e["download"]}
        self.welcome.show_choices(picks, self.starters(), doc["box"], downloads)
        self.welcome.show()

    def starters(self) -> list[dict]:
        """The catalog's starter set (small models to try everything with), not yet on disk."""
        return [e for e in self.entries if e.get("starter") and e["local"]["state"] not in ON_DISK]

    def _follow_downloads(self) -> None:
        """Report each new download failure in the problem strip; serve a welcome pick once it is here."""
        for e in self.entries:
            d = e["download"] or {}
            if d.get("status") == "failed" and (e["name"], d["error"]) not in self._failures_seen:
                self._failures_seen.add((e["name"], d["error"]))
                self.show_problem(e["name"], "download", d["error"] or "the download failed")
            if e["name"] in self._serve_when_done and d.get("status") in ("done", "failed", "cancelled"):
                self._serve_when_done.discard(e["name"])
                if d["status"] == "done":
                    self._serve(e["name"])

    def visible_entries(self) -> list[dict]:
        text = self.filter.text().strip().lower()
        kind = self.kind.currentText()
        return [e for e in self.entries
                if (kind == "all kinds" or e["kind"] == kind)
                and (not text or text in " ".join((e["name"], e["kind"], e["family"], e["license"],
                                                    e.get("description", ""), *badges(e, {}))).lower())]

    def render(self) -> None:
        rows = self.visible_entries()
        by_name = {e["name"]: e for e in self.entries}
        self.table.blockSignals(True)
        self.table.setRowCount(len(rows))
        for r, e in enumerate(rows):
            self._render_row(r, e, by_name)
        self._reselect(rows)
        self.table.blockSignals(False)
        self.empty.setVisible(bool(self.entries) and not rows)
        self.table.setVisible(bool(rows) or not self.entries)
        if not rows and self.entries:
            what = f"“{self.filter.text().strip()}”" if self.filter.text().strip() else "this filter"
            kind = f" among {self.kind.currentText()} models" if self.kind.currentText() != "all kinds" else ""
            self.empty.setText(f"No model matches {what}{kind}. Clear the filter to see all {len(self.entries)}.")
        self._fit_columns()
        self.update_buttons()

    def _render_row(self, r: int, e: dict, by_name: dict[str, dict]) -> None:
        tip = " · ".join(x for x in (e["family"], e.get("params"), e.get("quant"), e.get("languages")) if x)
        name = self._cell(r, MODEL, e["name"], f"{e['name']}\n{tip}\n{e.get('description', '')}".strip())
        name.setData(DESCRIPTION_ROLE, e.get("description") or tip)
        name.setData(BADGES_ROLE, badges(e, by_name))
        name.setData(TAGS_ROLE, ["recommended"] if e["name"] in self.recommended else [])
        size = self._cell(r, SIZE, _size(e["size"], e["size_estimated"]),
                          "estimated from the parameters; the download gives the exact size" if e["size_estimated"]
                          else "")
        size.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self._cell(r, LICENSE, e["license"] or "unknown", e["license"])
        fit = self._cell(r, FIT, e["fit"], f"needs about {e['memory_needed'] / 2**30:.1f} GiB of memory at the "
                                           "current context and streams")
        fit.setForeground(QColor(FIT_COLORS.get(e["fit"], "#808080")))
        cell = self.table.cellWidget(r, STATUS)
        if not isinstance(cell, StatusCell):
            cell = StatusCell(self.retry)
            self.table.setCellWidget(r, STATUS, cell)
        cell.show_entry(e)

    def _cell(self, r: int, c: int, text: str, tip: str = "") -> QTableWidgetItem:
        item = self.table.item(r, c)
        if item is None:
            item = _item(text)
            self.table.setItem(r, c, item)
        elif item.text() != text:
            item.setText(text)
        if item.toolTip() != tip:
            item.setToolTip(tip)
        return item

    def _reselect(self, rows: list[dict]) -> None:
        names = [e["name"] for e in rows]
        if self._selected in names:
            r = names.index(self._selected)
            if self.table.currentRow() != r or not self.table.selectionModel().isRowSelected(r):
                self.table.selectRow(r)
        else:
            self.table.clearSelection()
            self.table.setCurrentCell(-1, -1)

    def on_selection_changed(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        item = self.table.item(rows[0].row(), MODEL) if rows else None
        self._selected = item.text() if item else None
        self.update_buttons()

    def selected_name(self) -> str | None:
        return self._selected if any(e["name"] == self._selected for e in self.visible_entries()) else None

    def selected_entry(self) -> dict | None:
        name = self.selected_name()
        return next((e for e in self.entries if e["name"] == name), None)

    def update_buttons(self) -> None:
        """Each action only when the selected entry allows it (nothing selected: none)."""
        e = self.selected_entry()
        status = (e["download"] or {}).get("status") if e else None
        on_disk = bool(e) and e["local"]["state"] in ON_DISK
        self.download_button.setEnabled(bool(e) and not on_disk and status not in ACTIVE)
        self.cancel_button.setEnabled(status in ACTIVE)
        self.serve_button.setEnabled(on_disk and e["kind"] in ("llm", "embedding", "asr", "tts") and not e["served"])
        hint = "select a model in the list first" if e is None else ""
        for b, why in ((self.download_button, hint or ("already downloaded" if on_disk else "")),
                       (self.cancel_button, hint or "cancel the running download"),
                       (self.serve_button, hint or ("" if on_disk else "download it first"))):
            b.setToolTip(why)

    def _act(self, action: str) -> None:
        name = self.selected_name()
        if not name:
            return
        if action == "download":
            self.download(name)
        elif action == "cancel":
            self.bridge.cancel_download(name)
        else:
            self._serve(name)
        self.refresh()

    def download(self, name: str) -> bool:
        """Start (or resume) a download; its refusal shows in the problem strip."""
        why = self.bridge.start_download(name)
        if why is not None:
            self.show_problem(name, "download", why)
            return False
        if self._failure and self._failure["name"] == name:
            self.clear_problem()
        self._failures_seen = {f for f in self._failures_seen if f[0] != name}  # its next failure is news
        return True

    def retry(self, name: str) -> None:
        """A failed download again: it resumes where it stopped."""
        self.download(name)
        self.refresh()

    def download_and_serve(self, name: str) -> None:
        """A welcome pick: download it, then serve it."""
        if self.download(name):
            self._serve_when_done.add(name)
        self.refresh()

    def download_starters(self) -> None:
        for e in self.starters():
            if (e["download"] or {}).get("status") not in ACTIVE:
                self.download(e["name"])
        self.refresh()

    def _serve(self, name: str) -> None:
        task = self.bridge.serve(name)
        task.add_done_callback(lambda t: self._on_done(name, "serve", t))

    def _on_done(self, name: str, action: str, task) -> None:
        if task.cancelled() or task.exception() is None:
            if self._failure and self._failure["name"] == name:
                self.clear_problem()
            self.refresh()
            return
        e = task.exception()
        self.show_problem(name, action, e.message if isinstance(e, EngineError) else str(e))

    def show_problem(self, name: str, action: str, message: str) -> None:
        """A failure where it happened: what failed, why, Retry, and the way to the logs."""
        self._failure = {"name": name, "action": action, "message": message}
        what = {"download": "Downloading", "serve": "Serving", "open": "Opening"}.get(action, action)
        self.problem_text.setText(f"<span style='color:{ERROR_COLOR}'><b>{what} {html.escape(breakable(name))} "
                                  f"failed:</b></span> {html.escape(breakable(message))}")
        self.problem.show()

    def clear_problem(self) -> None:
        self._failure = None
        self.problem.hide()

    def retry_failure(self) -> None:
        f = self._failure
        if f is None:
            return
        self.clear_problem()
        if f["action"] == "download":
            self.download(f["name"])
        elif f["action"] == "serve":
            self._serve(f["name"])
        elif f["action"] == "open":
            self.open_gguf(f["name"])
        self.refresh()

    def open_logs(self) -> None:
        """Show the Logs panel (the window's, when this panel sits in one)."""
        window = self.window()
        if hasattr(window, "show_panel"):
            window.show_panel("Logs")

    def ask_open(self) -> None:
        dlg = QFileDialog(self, "Serve a GGUF you already have", "", "GGUF models (*.gguf)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(self.open_gguf)
        dlg.open()  # not exec(): the shared event loop keeps serving

    def open_gguf(self, path: str) -> None:
        """Serve a GGUF from where it is (it joins the roster, so the next start serves it too)."""
        task = self.bridge.load_model(path)
        task.add_done_callback(lambda t: self._on_done(path, "open", t))

    def ask_import(self) -> None:
        dlg = QFileDialog(self, "Import a GGUF into the models folder", "", "GGUF models (*.gguf)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(self.bridge.import_gguf)
        dlg.open()

    def show_folder(self) -> None:
        folder = self.bridge.models_dir()
        if folder is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(folder))


def _item(text: str) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setToolTip(text)
    return item


def _table(columns: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(columns))
    t.setHorizontalHeaderLabels(columns)
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    t.verticalHeader().setVisible(False)
    t.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
    t.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    return t
