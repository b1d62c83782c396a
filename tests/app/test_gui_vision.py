"""Images in the Chat panel offscreen (pytest-qt), against the real vision fixture (SmolLM2 with
tests/assets/mmproj_gguf.py's projector): attach, paste and drop an image, its thumbnail above the input and in
the transcript, the reply counting the image's positions, a model without vision refusing with the reason, and a
thread with an image reloading after a restart."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QImage  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.gui.chatview import image_of  # noqa: E402
from app.gui.panels.chat import NO_VISION  # noqa: E402
from tests.app.qtasync import desktops  # noqa: E402
from tests.assets import mmproj_gguf  # noqa: E402
from tests.engine.test_vision import gradient, noise  # noqa: E402


@pytest.fixture(scope="module")
def env(loop, assets, tmp_path_factory):
    """A starter of desktop apps serving SmolLM2 with its projector (the default) and without it ("text-only"),
    and roster entries not loaded with it ("eyes-later") and without ("plain-later"), over one data dir (a restart
    is a quit and another start)."""
    entries = {"text-only": "", "eyes-later": f'preload = false\nimage_mmproj = "{assets["mmproj"]}"\n',
               "plain-later": "preload = false\n"}
    roster = "".join(f'[[models]]\nname = "{name}"\npath = "{assets["smollm2"]}"\nctx = 1024\nstreams = 1\n{extra}'
                     for name, extra in entries.items())
    args = ["--model", str(assets["smollm2"]), "--image-mmproj", str(assets["mmproj"]), "--ctx", "1024",
            "--streams", "1", "--threads", "1"]
    with desktops(loop, tmp_path_factory.mktemp("gui-vision"), roster, args, "Chat") as env:
        yield env


@pytest.fixture
def chat(env):
    panel = env.first.window.panels["Chat"]
    panel.new_chat()
    panel.model.setCurrentIndex(panel.model.findData(env.first.host.service.roster.default_id))
    panel.preset.setCurrentText("None")
    panel.temperature.setValue(0)
    panel.max_tokens.setValue(6)
    return panel


def png(tmp_path, name: str = "gradient.png") -> str:
    path = tmp_path / name
    gradient().save(path)
    return str(path)


def send(env, panel, text: str) -> dict:
    """Send text with the attached images and wait for the reply to end; chat_done's info."""
    async def go():
        fut = asyncio.get_running_loop().create_future()

        def done(cid, info):
            if not fut.done():
                fut.set_result(info)

        def failed(cid, message):
            if not fut.done():
                fut.set_exception(AssertionError(message))
        bridge = env.first.bridge
        bridge.chat_done.connect(done)
        bridge.chat_error.connect(failed)
        panel.input.setPlainText(text)
        panel.send()
        try:
            return await fut
        finally:
            bridge.chat_done.disconnect(done)
            bridge.chat_error.disconnect(failed)
    info = env.run(go())
    env.run(asyncio.sleep(0.05))  # the last redraw and the layout
    return info


def drop(target, mime: QMimeData) -> bool:
    """Drag mime onto target and drop it, as from another application: Qt gives the drag to target or the
    nearest of its parents that takes drops; whether that one took it."""
    while not target.acceptDrops():
        target = target.parentWidget()
    where, action = QPointF(10, 10), Qt.DropAction.CopyAction
    enter = QDragEnterEvent(where.toPoint(), action, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(target, enter)
    if not enter.isAccepted():
        return False
    QApplication.sendEvent(target, QDropEvent(where, action, mime, Qt.MouseButton.LeftButton,
                                              Qt.KeyboardModifier.NoModifier))
    return True


def shown_images(view) -> list[QImage]:
    return [label.pixmap().toImage() for label in view.images.labels if not label.pixmap().isNull()]


def test_an_attached_image_shows_above_the_input_and_in_the_transcript_and_is_answered(env, chat, tmp_path):
    assert chat.attach_button.isEnabled() and "Attach an image" in chat.attach_button.toolTip()
    width = env.first.window.width()
    chat.attach_image(png(tmp_path))
    assert chat.attach_box.isVisibleTo(chat) and "gradient.png" in chat.attachments.full_text()
    pending = chat.pending_view.labels
    assert len(pending) == 1 and pending[0].pixmap().size().toTuple() == (64, 64)  # the image, not scaled up
    info = send(env, chat, "What is in this picture?")
    plain = send(env, chat, "And now?")  # a turn without an image: the image stays in the conversation
    assert info["usage"]["prompt_tokens"] >= mmproj_gguf.N_POS
    assert plain["usage"]["prompt_tokens"] > info["usage"]["prompt_tokens"]
    user = chat.transcript.views[0]
    assert user.role == "user" and len(shown_images(user)) == 1
    assert shown_images(user)[0].pixelColor(2, 32).red() > 200  # the gradient's red left edge
    assert not chat.attach_box.isVisibleTo(chat) and chat.pending_images == []
    assert chat.transcript.views[1].content  # the reply arrived
    assert env.first.window.width() == width


def test_a_pasted_image_is_attached(env, chat):
    pixels = noise().tobytes()
    QGuiApplication.clipboard().setImage(QImage(pixels, 96, 80, 96 * 3, QImage.Format.Format_RGB888).copy())
    chat.input.setFocus()
    chat.input.paste()
    assert chat.input.toPlainText() == ""  # the image went to the attachments, not into the text
    assert len(chat.pending_images) == 1 and chat.pending_images[0].startswith("data:image/png;base64,")
    assert image_of(chat.pending_images[0]).size().toTuple() == (96, 80)
    assert "pasted image" in chat.attachments.full_text()
    info = send(env, chat, "Describe it.")
    assert info["usage"]["prompt_tokens"] >= mmproj_gguf.N_POS
    assert len(shown_images(chat.transcript.views[0])) == 1


def test_image_files_dropped_onto_the_chat_are_attached(env, chat, tmp_path):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(png(tmp_path, "a.png")), QUrl.fromLocalFile(png(tmp_path, "b.png")),
                  QUrl.fromLocalFile(str(tmp_path / "notes.txt"))])
    assert drop(chat.transcript.viewport(), mime)
    assert chat.attachments.full_text() == "attached: a.png, b.png" and len(chat.pending_view.labels) == 2
    assert drop(chat.input.viewport(), mime)  # onto the message box: attached too, not pasted in as text
    assert len(chat.pending_images) == 4 and chat.input.toPlainText() == ""
    chat.on_clear_attachments()
    assert not chat.attach_box.isVisibleTo(chat) and chat.pending_images == []


def test_a_model_without_vision_refuses_images_saying_why(env, chat, tmp_path):
    chat.model.setCurrentIndex(chat.model.findData("text-only"))
    assert not chat.attach_button.isEnabled() and chat.attach_button.toolTip() == NO_VISION
    QGuiApplication.clipboard().setImage(QImage(8, 8, QImage.Format.Format_RGB32))
    chat.input.paste()
    assert chat.pending_images == [] and NO_VISION in chat.status.full_text()
    chat.status.setText("")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(png(tmp_path))])
    assert drop(chat.transcript.viewport(), mime)
    assert chat.pending_images == [] and not chat.attach_box.isVisibleTo(chat)
    assert NO_VISION in chat.status.full_text()
    chat.model.setCurrentIndex(chat.model.findData(env.first.host.service.roster.default_id))
    assert chat.attach_button.isEnabled()


def test_attach_is_offered_for_an_unloaded_entry_with_a_projector_and_sending_loads_it(env, chat, tmp_path):
    roster = env.first.host.service.roster
    chat.model.setCurrentIndex(chat.model.findData("plain-later"))
    assert chat.model.currentData() == "plain-later" and not chat.attach_button.isEnabled()
    chat.model.setCurrentIndex(chat.model.findData("eyes-later"))
    assert "not loaded" in chat.model.currentText() and "eyes-later" not in roster.loaded
    assert chat.attach_button.isEnabled() and "Attach an image" in chat.attach_button.toolTip()
    chat.attach_image(png(tmp_path))
    info = send(env, chat, "What is in this picture?")  # loads it on demand, with its projector
    assert info["usage"]["prompt_tokens"] >= mmproj_gguf.N_POS and roster.loaded["eyes-later"].vision


def test_a_thread_with_an_image_reloads_after_a_restart(env, chat, tmp_path):
    chat.attach_image(png(tmp_path))
    send(env, chat, "Remember this picture.")
    sent = chat.messages[0]["images"]
    env.run(env.first.quit())

    again = env.start()  # a new window, bridge and store over the same data dir
    panel = again.window.panels["Chat"]
    env.first = again
    assert panel is not chat and panel.thread.title == "Remember this picture."
    assert panel.messages[0]["images"] == sent
    assert len(shown_images(panel.transcript.views[0])) == 1
    info = send(env, panel, "What was in it?")  # the image is sent again with the conversation
    assert info["usage"]["prompt_tokens"] >= mmproj_gguf.N_POS

    exported = panel.to_json()  # an exported conversation keeps its images; importing it opens them again
    panel.new_chat()
    panel.from_json(exported)
    assert panel.messages[0]["images"] == sent and len(shown_images(panel.transcript.views[0])) == 1
