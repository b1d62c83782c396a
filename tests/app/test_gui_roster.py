"""Remove… in the Models panel (pytest-qt, offscreen), real SmolLM2: each roster entry's card asks first (a
window-modal box that says the GGUF stays on disk, and where), then takes the entry out of the saved roster,
unloading it first when loaded; Cancel changes nothing; the benchmark's refusal is the status bar's notice; a
GGUF found in models_dir is listed without Remove."""
from __future__ import annotations

import asyncio
import shutil
import tomllib

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.gui.panels.models import AvailableCard, ModelCard  # noqa: E402
from tests.app.qtasync import desktops, until  # noqa: E402


@pytest.fixture(scope="module")
def env(loop, assets, tmp_path_factory):
    """The default model and "held" loaded, "spare" and "idle" roster entries not loaded, and a GGUF of the
    tiny model in models_dir (listed, no roster entry)."""
    tmp = tmp_path_factory.mktemp("gui-roster")
    (tmp / "models").mkdir()
    shutil.copy(assets["tiny"], tmp / "models" / "ondisk.gguf")
    roster = "".join(f'[[models]]\nname = "{name}"\npath = "{assets["smollm2"]}"\nctx = 512\nstreams = 1\n{extra}'
                     for name, extra in (("held", ""), ("spare", "preload = false\n"), ("idle", "preload = false\n")))
    args = ["--model", str(assets["smollm2"]), "--ctx", "512", "--streams", "1", "--threads", "1", "--cache-disk", "0"]
    with desktops(loop, tmp, roster, args, "Models") as env:
        yield env


@pytest.fixture
def panel(env):
    panel = env.first.window.panels["Models"]
    panel.refresh()
    return panel


def saved_names(env) -> list[str]:
    return [m["name"] for m in tomllib.loads(env.first.host.config.path.read_text()).get("models", [])]


def ask_and_answer(env, panel, name: str, button: QMessageBox.StandardButton,
                   done=lambda: True) -> tuple[QMessageBox, str]:
    """Click the card's Remove…, then the confirmation's button, with the loop running; wait until done(). The
    box and what it said."""
    async def go() -> tuple[QMessageBox, str]:
        panel.cards_by_name()[name].remove_button.click()
        box = panel.remove_dialog
        assert box.isVisible() and box.windowModality() == Qt.WindowModality.WindowModal
        text = box.informativeText().replace("\u200b", "")
        box.button(button).click()
        await until(done)
        return box, text
    return env.run(go())


def test_only_roster_entries_offer_remove(env, panel):
    cards = panel.cards_by_name()
    assert {"held", "spare", "idle", "ondisk"} <= cards.keys()
    assert isinstance(cards["held"], ModelCard) and isinstance(cards["spare"], AvailableCard)
    assert cards["held"].remove_button is not None and cards["spare"].remove_button is not None
    assert cards["ondisk"].remove_button is None  # found in models_dir: forgetting it would change nothing


def test_cancel_changes_nothing(env, panel):
    before = env.first.host.config.path.read_bytes()
    box, _ = ask_and_answer(env, panel, "spare", QMessageBox.StandardButton.Cancel)
    assert not box.isVisible()
    env.run(asyncio.sleep(0.2))  # a forget, had one started, would have saved by now
    assert env.first.host.config.path.read_bytes() == before and "spare" in panel.cards_by_name()


def test_removing_an_unloaded_entry_keeps_its_file_and_says_where(env, panel, assets):
    box, said = ask_and_answer(env, panel, "spare", QMessageBox.StandardButton.Yes,
                               lambda: "spare" not in saved_names(env))
    assert str(assets["smollm2"]) in said and "not deleted" in said
    assert box.button(QMessageBox.StandardButton.Yes).text() == "Remove"
    assert assets["smollm2"].is_file() and "held" in saved_names(env)
    env.run(until(lambda: "spare" not in panel.cards_by_name()))
    assert "spare" not in {m["id"] for m in env.first.bridge.models()}


def test_removing_a_loaded_entry_unloads_it(env, panel):
    roster = env.first.host.service.roster
    assert "held" in roster.loaded
    _, said = ask_and_answer(env, panel, "held", QMessageBox.StandardButton.Yes, lambda: "held" not in roster.loaded)
    assert "unloaded now" in said
    env.run(until(lambda: "held" not in saved_names(env) and "held" not in panel.cards_by_name()))
    assert "removed held" in env.first.window.statusBar().currentMessage()


def test_the_benchmark_refuses_removing_a_loaded_model_and_the_notice_says_so(env, panel):
    bridge, roster = env.first.bridge, env.first.host.service.roster
    default = roster.default_id

    async def go() -> None:
        bridge.run_bench(default)
        await until(lambda: env.first.host.service.bench.running)
        panel.cards_by_name()[default].remove_button.click()
        panel.remove_dialog.button(QMessageBox.StandardButton.Yes).click()
        await until(lambda: "not removed" in env.first.window.statusBar().currentMessage())
        bridge.cancel_bench()
        await until(lambda: not env.first.host.service.bench.running, 60)
    env.run(go())
    assert "while the benchmark runs" in env.first.window.statusBar().currentMessage()
    assert default in roster.loaded and default in saved_names(env)
