"""The Catalog, Settings and Models panels offscreen (pytest-qt), on a first run: the real server in setup mode on
the qasync loop, a catalog of its own whose downloads go to a refused loopback port (this machine offline)."""
from __future__ import annotations

import asyncio
import hashlib
import shutil
import socket

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

from PySide6.QtGui import QFont, QFontMetrics, QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QLabel, QLineEdit  # noqa: E402

from app.gui import theme  # noqa: E402
from app.gui.main import Desktop  # noqa: E402
from app.gui.panels.catalog import BADGES_ROLE, FIT, MODEL, STATUS, TAGS_ROLE  # noqa: E402
from engine.catalog.entries import Entry  # noqa: E402
from engine.config import OPTIONS, SCHEMA, load  # noqa: E402

STARTERS = "starter" in Entry.__dataclass_fields__  # the catalog's starter set (another change adds the field)
LONG_NAME = "a-catalog-entry-with-a-rather-long-name-q4_k_m"


def _entry(name: str, kind: str, family: str, size: int, extra: str = "") -> str:
    file = f"{name}.tar.bz2" if kind in ("asr", "tts") else f"{name}.gguf"
    archive = 'archive = "tar.bz2"\n' if kind in ("asr", "tts") else ""
    llm = 'ctx = 2048\nkv_bytes_per_token = 1024\n' if kind == "llm" else ""
    return (f'[[model]]\nname = "{name}"\nkind = "{kind}"\nfamily = "{family}"\nfile = "{file}"\n'
            f'url = "https://example.invalid/{file}"\nsha256 = "{hashlib.sha256(name.encode()).hexdigest()}"\n'
            f'size = {size}\nlicense = "apache-2.0"\ndescription = "the {name} model"\n{archive}{llm}{extra}\n')


STARTER = "starter = true\n" if STARTERS else ""
CATALOG = "".join((
    _entry("small-chat", "llm", "alpha", 50_000_000, 'tool_format = "hermes"\nthinking = true\n'),
    _entry("big-alpha", "llm", "alpha", 300_000_000, 'tool_format = "hermes"\n'),
    _entry("mid-chat", "llm", "beta", 200_000_000, 'tool_format = "generic"\n'),
    _entry("tiny-gamma", "llm", "gamma", 20_000_000, 'tool_format = "generic"\n' + STARTER),
    _entry("huge-chat", "llm", "delta", 10**15, 'tool_format = "hermes"\n'),  # too big for any machine
    _entry(LONG_NAME, "llm", "epsilon", 10**15, 'tool_format = "generic"\n'),
    _entry("embedder", "embedding", "bert", 30_000_000, STARTER),
    _entry("voice", "tts", "piper", 20_000_000),
))


@pytest.fixture(scope="module")
def refused_port():
    """A loopback port held (bound, never listening) so that nothing else takes it: connecting is refused, as when
    the hub cannot be reached."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def gui(qapp, loop, assets, tmp_path_factory, refused_port):
    """A first run: no model configured, nothing downloaded; a 900x600 window."""
    tmp = tmp_path_factory.mktemp("gui-panels")
    (tmp / "catalog.toml").write_text(CATALOG)
    cfg_path = tmp / "llamadesk.toml"
    cfg_path.write_text("# mine\n")
    config = load(["--config", str(cfg_path), "--port", "0", "--models-dir", str(tmp / "models"),
                   "--catalog-path", str(tmp / "catalog.toml"), "--catalog-mirror",
                   f"http://127.0.0.1:{refused_port}", "--cache-disk", "0"])
    desktop = Desktop(config)

    def run(coro, timeout: float = 60):
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))

    run(desktop.start())
    downloader = desktop.host.service.catalog.downloader
    downloader.retries, downloader.backoff_s = 1, 0.05  # give up on the refused port in a fraction of a second
    desktop.run_loop = run
    desktop.cfg_path = cfg_path
    desktop.tmp = tmp
    desktop.window.resize(900, 600)
    yield desktop
    theme.apply(qapp, "system")
    if desktop.host.service is not None:
        run(desktop.quit())


def pump(gui) -> None:
    """Let the window draw what changed, with the loop running (as it always is in the app)."""
    gui.run_loop(asyncio.sleep(0))


def wait_until(gui, pred, timeout: float = 30.0) -> None:
    async def poll():
        while not pred():
            await asyncio.sleep(0.05)
    gui.run_loop(poll(), timeout)


def in_loop(gui, action, until=lambda: True, timeout: float = 30.0) -> None:
    """Do action (a click) with the loop running, as every click in the app is; then wait until until()."""
    async def go():
        action()
        while not until():
            await asyncio.sleep(0.05)
    gui.run_loop(go(), timeout)


def catalog(gui):
    gui.window.show_panel("Catalog")
    panel = gui.window.panels["Catalog"]
    panel.refresh()
    pump(gui)
    return panel


def fits_900(gui, panel) -> bool:
    """Whether the panel fits a 900 px window beside the sidebar (the window's width is every panel's concern:
    the widest panel's minimum sets it)."""
    return panel.minimumSizeHint().width() < 900 - gui.window.sidebar.width() - 20


def shown_names(panel) -> list[str]:
    return [panel.table.item(r, MODEL).text() for r in range(panel.table.rowCount())]


def select(panel, name: str) -> None:
    panel.table.selectRow(shown_names(panel).index(name))


# ---- catalog ------------------------------------------------------------------------------------------

def test_the_welcome_card_offers_the_models_that_fit_when_nothing_is_installed(gui):
    panel = catalog(gui)
    assert gui.bridge.setup_mode and panel.welcome.isVisible()
    # the largest of each family that fits with room to spare: not small-chat (big-alpha is its family's),
    # not the ones too big for any machine, not the embedding or speech models
    assert panel.welcome.pick_names() == ["big-alpha", "mid-chat", "tiny-gamma"]
    assert panel.welcome.open_button.isVisible() and "GGUF you already have" in panel.welcome.open_button.text()
    tagged = {panel.table.item(r, MODEL).text() for r in range(panel.table.rowCount())
              if "recommended" in (panel.table.item(r, MODEL).data(TAGS_ROLE) or [])}
    assert tagged == {"big-alpha", "mid-chat", "tiny-gamma"}


def test_rows_carry_capability_badges_and_the_fit(gui):
    panel = catalog(gui)
    rows = {panel.table.item(r, MODEL).text(): r for r in range(panel.table.rowCount())}
    badges = {name: panel.table.item(r, MODEL).data(BADGES_ROLE) for name, r in rows.items()}
    assert badges["small-chat"] == ["tools", "reasoning"]
    assert badges["mid-chat"] == []  # a generic tool format is no trained tool calling
    assert badges["embedder"] == ["embedding"] and badges["voice"] == ["speech"]
    assert panel.table.item(rows["huge-chat"], FIT).text() == "too big"


def test_the_starter_button_downloads_the_starter_set(gui):
    panel = catalog(gui)
    button = panel.welcome.starter_button
    assert button.isVisible() and "(~50 MB)" in button.text()  # tiny-gamma 20 MB + embedder 30 MB
    in_loop(gui, button.click)
    started = {e["name"] for e in gui.bridge.catalog()["entries"] if e["download"]}
    assert started == {"tiny-gamma", "embedder"}
    wait_until(gui, lambda: all(e["download"]["status"] == "failed" for e in gui.bridge.catalog()["entries"]
                                if e["name"] in started))  # other tests' downloads may be cancelled, not failed


def rows_in_full_view(table) -> int:
    """How many rows the table shows whole (not cut by its bottom edge)."""
    height = table.viewport().height()
    return sum(1 for r in range(table.rowCount())
               if 0 <= table.rowViewportPosition(r) and table.rowViewportPosition(r) + table.rowHeight(r) <= height)


def test_at_900x600_the_folded_welcome_card_and_a_failure_leave_six_rows_and_the_fold_is_remembered(gui):
    panel = catalog(gui)
    gui.window.resize(900, 600)
    card = panel.welcome
    assert card.isVisible() and not card.collapsed and card.details.isVisible()  # unfolded on a first run
    panel.show_problem("mid-chat", "download", "Cannot reach 127.0.0.1: connection refused")
    try:
        pump(gui)
        unfolded = rows_in_full_view(panel.table)
        card.fold.click()
        pump(gui)
        assert card.isVisible() and panel.problem.isVisible() and not card.details.isVisible()
        assert rows_in_full_view(panel.table) >= 6 > unfolded
        assert card.fold.text() == "Show choices" and gui.window.width() == 900
        again = type(panel)(gui.bridge)  # the next start's panel: still folded
        assert again.welcome.collapsed and not again.welcome.details.isVisibleTo(again.welcome)
        again.deleteLater()
        card.fold.click()
        pump(gui)
        assert card.details.isVisible() and not type(panel)(gui.bridge).welcome.collapsed
    finally:
        panel.clear_problem()


def test_download_serve_and_cancel_wait_for_a_selected_row(gui):
    panel = catalog(gui)
    panel.table.clearSelection()
    pump(gui)
    buttons = (panel.download_button, panel.serve_button, panel.cancel_button)
    assert not any(b.isEnabled() for b in buttons)
    assert "select a model" in panel.download_button.toolTip()
    select(panel, "big-alpha")
    assert panel.selected_name() == "big-alpha"
    assert panel.download_button.isEnabled()
    assert not panel.serve_button.isEnabled() and not panel.cancel_button.isEnabled()  # not downloaded, none running
    panel.refresh()  # the once-a-second refresh keeps the choice
    assert panel.selected_name() == "big-alpha" and panel.download_button.isEnabled()
    panel.filter.setText("embedder")  # the selected row filtered away: nothing to act on
    assert not panel.download_button.isEnabled()
    panel.filter.setText("")
    assert panel.selected_name() == "big-alpha"


def test_an_offline_download_says_why_with_retry_and_a_way_to_the_logs(gui):
    panel = catalog(gui)
    select(panel, "mid-chat")
    in_loop(gui, panel.download_button.click)

    def failed():
        panel.refresh()
        entry = next(e for e in panel.entries if e["name"] == "mid-chat")
        return (entry["download"] or {}).get("status") == "failed"
    wait_until(gui, failed)
    pump(gui)
    cell = panel.table.cellWidget(shown_names(panel).index("mid-chat"), STATUS)
    reason = cell.text.full_text()
    assert reason.startswith("Cannot reach 127.0.0.1: connection refused"), reason
    assert cell.text.toolTip() == reason and cell.retry.isVisibleTo(cell)
    assert panel.problem.isVisible() and "Cannot reach 127.0.0.1: connection refused" in panel.problem_text.text()
    assert panel.retry_button.isVisible() and panel.logs_link.isVisible()
    for text in (reason, panel.problem_text.text()):
        assert "/catalog" not in text and "POST" not in text and "aiohttp" not in text and "ssl:" not in text
    assert fits_900(gui, panel)  # the long reason wraps or elides; it does not widen the window

    downloads = gui.host.service.catalog.downloader.downloads
    first = downloads["mid-chat"]
    in_loop(gui, cell.retry.click)  # downloads again at once (it would resume a partial file)
    assert downloads["mid-chat"] is not first and not panel.problem.isVisible()
    wait_until(gui, failed)
    assert panel.problem.isVisible()
    panel.logs_link.click()
    assert gui.window.stack.currentWidget() is gui.window.panels["Logs"]
    assert "Cannot reach 127.0.0.1: connection refused" in gui.window.panels["Logs"].view.toPlainText()


def test_the_filter_matches_kind_and_says_when_nothing_matches(gui):
    panel = catalog(gui)
    panel.filter.setText("embedding")
    assert shown_names(panel) == ["embedder"]
    panel.filter.setText("tts")
    assert shown_names(panel) == ["voice"]
    assert not panel.empty.isVisible()
    panel.filter.setText("no-such-model-anywhere")
    assert panel.table.rowCount() == 0 and panel.empty.isVisible() and not panel.table.isVisible()
    assert "No model matches" in panel.empty.text() and "no-such-model-anywhere" in panel.empty.text()
    panel.filter.setText("")
    assert panel.table.rowCount() == 8 and not panel.empty.isVisible()


def test_the_name_column_keeps_the_whole_name_at_900_px(gui):
    panel = catalog(gui)
    bold = QFont(panel.table.font())
    bold.setBold(True)
    assert panel.table.columnWidth(MODEL) > QFontMetrics(bold).horizontalAdvance(LONG_NAME)
    # and the table does not scroll sideways there: the status column (elided) gives way first
    assert gui.window.width() == 900 and panel.table.horizontalScrollBar().maximum() == 0
    for name in ("Catalog", "Settings", "Models"):
        assert fits_900(gui, gui.window.panels[name]), name


# ---- settings -----------------------------------------------------------------------------------------

def settings(gui):
    gui.window.show_panel("Settings")
    panel = gui.window.panels["Settings"]
    panel.refresh()
    return panel


def test_settings_have_human_labels_with_the_key_as_tooltip(gui):
    panel = settings(gui)
    for opt in SCHEMA:
        if opt.cli_only:
            continue
        row = panel.rows[opt.name]
        assert row.label.text() != opt.name and "_" not in row.label.text()
        assert opt.name in row.label.toolTip() and opt.help in row.label.toolTip()
    port = panel.rows["port"].editor
    assert (port.minimum(), port.maximum()) == (OPTIONS["port"].minimum, OPTIONS["port"].maximum)
    assert panel.notice.isVisible() and "win over command-line flags" in panel.notice.text()  # told before saving


def test_a_bad_origin_is_refused_beside_its_field_and_nothing_is_saved(gui):
    panel = settings(gui)
    before = gui.cfg_path.read_bytes()
    origins = panel.rows["cors_origins"]
    for bad in ("not a url", "http://localhost:3000/app", "localhost:3000", "http://localhost:99999"):
        origins.editor.setText(bad)
        assert not panel.save()
        assert origins.error.isVisible() and "not an origin" in origins.error.text(), bad
        assert gui.cfg_path.read_bytes() == before
    mirror = panel.rows["catalog_mirror"]
    mirror.editor.setText("ftp//mirror")
    origins.editor.setText("http://localhost:3000, https://app.example.org")
    assert not panel.save()
    assert mirror.error.isVisible() and not origins.error.isVisible()
    assert "Catalog mirror URL" in panel.message.text() and gui.cfg_path.read_bytes() == before
    panel.refresh()


def test_the_api_key_is_masked_until_shown(gui):
    panel = settings(gui)
    key = panel.rows["api_key"]
    secret = "k3y-for-the-other-machines-0123"
    key.editor.setText(secret)
    assert key.editor.echoMode() == QLineEdit.EchoMode.Password and secret not in key.editor.displayText()
    assert panel.rows["hf_token"].editor.echoMode() == QLineEdit.EchoMode.Password
    panel.network.setChecked(True)  # the key exists: the switch shows it masked, with Copy key
    assert all(secret not in label.text() for label in panel.findChildren(QLabel))
    panel.copy_key.click()
    assert QGuiApplication.clipboard().text() == secret
    key.reveal.trigger()
    assert key.editor.displayText() == secret and secret in panel.key_line.full_text()
    panel.refresh()
    assert key.editor.echoMode() == QLineEdit.EchoMode.Password and not panel.network.isChecked()


def test_saving_refreshes_where_each_value_comes_from(gui):
    panel = settings(gui)
    streams = panel.rows["streams"]
    assert streams.source.text() == "default"
    streams.editor.setValue(2)
    assert panel.save()
    assert streams.source.text() == "settings file"
    assert panel.rows["port"].source.text() == "settings file"  # the saved file wins over --port now
    assert "Parallel streams per model" in panel.message.text()  # saved, used after Save and apply
    saved = load(["--config", str(gui.cfg_path)])
    assert (saved.streams, saved.sources["streams"]) == (2, "toml") and "# mine" in gui.cfg_path.read_text()
    assert gui.host.config.streams != 2  # not applied: the running server is unchanged


@pytest.mark.skipif("theme" not in OPTIONS, reason="no theme setting")
def test_the_theme_choice_switches_the_palette(gui):
    panel = settings(gui)
    before = gui.cfg_path.read_bytes()
    combo = panel.rows["theme"].editor
    combo.setCurrentIndex(combo.findData("dark"))
    assert theme.is_dark() and panel.rows["theme"].source.text() == "this app"
    combo.setCurrentIndex(combo.findData("light"))
    assert not theme.is_dark()
    combo.setCurrentIndex(combo.findData("system"))
    assert theme.current() == "system"
    assert gui.cfg_path.read_bytes() == before  # remembered by the app, not written to the settings file
    assert panel.save() and load(["--config", str(gui.cfg_path)]).sources["theme"] == "default"  # nor by Save


# ---- models (last: it installs a model) -----------------------------------------------------------------

def test_opening_a_gguf_serves_it_and_long_names_are_elided_in_the_models_panel(gui, assets, tmp_path):
    long = tmp_path / ("a-model-file-with-a-name-long-enough-to-push-any-panel-off-the-frame-" * 2 + "q4.gguf")
    shutil.copyfile(assets["tiny"], long)
    panel = catalog(gui)
    assert panel.welcome.isVisible()
    in_loop(gui, lambda: panel.open_gguf(str(long)), lambda: any(m["id"] == long.stem for m in gui.bridge.models()),
            60)
    panel.refresh()
    assert not panel.welcome.isVisible()  # something is installed now
    gui.window.show_panel("Models")
    models = gui.window.panels["Models"]
    models.refresh()
    pump(gui)
    card = next(models.cards.itemAt(i).widget() for i in range(models.cards.count())
                if getattr(models.cards.itemAt(i).widget(), "name", None) == long.stem)
    title = card.layout().itemAtPosition(0, 0).layout().itemAt(0).widget()
    assert title.is_elided() and title.toolTip() == long.stem
    assert card.values["file"].is_elided() and card.values["file"].toolTip().endswith(long.name)
    assert fits_900(gui, models)
    gui.run_loop(gui.bridge.unload_model(long.stem))

