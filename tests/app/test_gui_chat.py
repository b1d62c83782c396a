"""The Chat panel offscreen (pytest-qt): threads kept in the data dir across a restart, code blocks with Copy,
regenerate, edit-and-resend, the stats line per reply, errors that never widen the window; real SmolLM2."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

pytest.importorskip("PySide6")  # a dependency: always installed by `make test`

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QAbstractButton, QLineEdit, QMessageBox  # noqa: E402

from app.gui.threads import ThreadStore, default_path  # noqa: E402
from tests.app.qtasync import desktops, next_signal  # noqa: E402

LONG_LINE = "result = compute(" + ", ".join(f"argument_{i}" for i in range(60)) + ")"
REPLY_WITH_CODE = f"""Here is the script:

```python
import sys

def main() -> None:
    print("hi")
```

And a long one:

~~~bash
{LONG_LINE}
echo done
~~~

That is all."""


@pytest.fixture(scope="module")
def env(loop, assets, tmp_path_factory):
    """A starter of desktop apps serving SmolLM2 over one data dir (a restart is a quit and another start)."""
    with desktops(loop, tmp_path_factory.mktemp("gui-chat"), "", ["--model", str(assets["smollm2"])], "Chat") as env:
        yield env


@pytest.fixture
def chat(env):
    panel = env.first.window.panels["Chat"]
    panel.new_chat()
    panel.preset.setCurrentText("None")
    panel.temperature.setValue(0)
    panel.max_tokens.setValue(12)
    return panel


def ask(env, panel, text: str | None = None, start=None) -> dict:
    """Send text (or run start()) and wait for the reply to end; chat_done's info."""
    async def go():
        done = next_signal(env.first.bridge.chat_done)
        if start is None:
            panel.input.setPlainText(text)
            panel.send()
        else:
            start()
        info = (await done)[1]
        await asyncio.sleep(0.05)  # the last redraw and the layout
        return info
    return env.run(go())


async def prompt_tokens(desktop, messages: list[dict]) -> int:
    """How many prompt tokens the server counts for messages (over HTTP): what a reply to them was sent."""
    body = {"model": "", "messages": messages, "temperature": 0, "max_tokens": 1}
    req = urllib.request.Request(desktop.host.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    reply = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(req, timeout=60).read()))
    return reply["usage"]["prompt_tokens"]


def shown_roles(panel) -> list[str]:
    return [v.role for v in panel.transcript.views]


def test_threads_are_kept_listed_searched_renamed_and_deleted(env, chat):
    ask(env, chat, "Plan a trip to the sea.\nMention zanzibar somewhere.")
    first = chat.thread.id
    chat.new_chat()
    assert chat.thread.id != first and chat.messages == []  # New chat keeps the old thread
    ask(env, chat, "Name a fruit.")
    second = chat.thread.id
    titles = chat.thread_titles()
    assert titles[:2] == ["Name a fruit.", "Plan a trip to the sea."]  # the most recent first
    count = len(titles)
    chat.new_chat()
    chat.new_chat()  # an empty thread is reused, not piled up
    assert len(chat.thread_titles()) == count + 1

    chat.search.setText("zanzibar")  # in a message, not in the title
    assert chat.thread_titles() == ["Plan a trip to the sea."]
    chat.search.setText("FRUIT")
    assert chat.thread_titles() == ["Name a fruit."]
    chat.search.setText("nothing says this")
    assert chat.thread_titles() == [] and chat.no_match.isVisibleTo(chat)
    chat.search.setText("")

    trip = next(chat.thread_list.item(i) for i in range(chat.thread_list.count())
                if chat.thread_list.item(i).text() == "Plan a trip to the sea.")
    chat.thread_list.setCurrentItem(trip)
    assert chat.thread.id == first and shown_roles(chat) == ["user", "assistant"]  # opened with its messages
    assert "zanzibar" in chat.transcript.views[0].content
    chat.rename_current()
    editor = chat.thread_list.viewport().findChild(QLineEdit)
    assert editor is not None and editor.text() == "Plan a trip to the sea."
    editor.setText("Holiday ideas")
    QTest.keyClick(editor, Qt.Key.Key_Return)
    env.run(asyncio.sleep(0.05))  # the delegate commits the edit queued
    assert trip.text() == "Holiday ideas"

    fruit = next(chat.thread_list.item(i) for i in range(chat.thread_list.count())
                 if chat.thread_list.item(i).text() == "Name a fruit.")
    chat.thread_list.setCurrentItem(fruit)
    chat.delete_button.click()
    assert chat.confirm.isVisible()
    chat.confirm.button(QMessageBox.StandardButton.Yes).click()
    assert "Name a fruit." not in chat.thread_titles() and chat.thread.id != second

    on_disk = ThreadStore(default_path())  # what a restart will read
    try:
        kept = {t.id: t.title for t in on_disk.threads()}
        assert kept[first] == "Holiday ideas" and second not in kept
        assert [m["role"] for m in on_disk.messages(first)] == ["user", "assistant"]
        assert on_disk.messages(second) == []
    finally:
        on_disk.close()


def test_code_block_copy_puts_exactly_the_code_on_the_clipboard(env, chat):
    window = env.first.window
    window.show()
    chat.from_json(json.dumps({"messages": [{"role": "user", "content": "a script please"},
                                            {"role": "assistant", "content": REPLY_WITH_CODE}]}))
    env.run(asyncio.sleep(0.1))
    blocks = chat.transcript.views[-1].body.code_blocks()
    assert [b.language.text() for b in blocks] == ["python", "bash"]
    QGuiApplication.clipboard().clear()
    blocks[0].copy_button.click()
    assert QGuiApplication.clipboard().text() == 'import sys\n\ndef main() -> None:\n    print("hi")'
    blocks[1].copy_button.click()
    assert QGuiApplication.clipboard().text() == f"{LONG_LINE}\necho done"
    # the long line scrolls inside its block; the transcript never scrolls sideways
    assert blocks[1].text.horizontalScrollBar().maximum() > 0
    assert blocks[0].text.horizontalScrollBar().maximum() == 0
    view = chat.transcript
    assert view.horizontalScrollBar().maximum() == 0
    assert view.widget().width() <= view.viewport().width()
    assert blocks[1].mapTo(view.viewport(), blocks[1].rect().topRight()).x() <= view.viewport().width()
    # the message's own Copy gives the whole reply
    chat.transcript.views[-1].copy_button.click()
    assert QGuiApplication.clipboard().text() == REPLY_WITH_CODE


def test_regenerate_replaces_the_last_reply(env, chat):
    first = ask(env, chat, "hello there")
    views = chat.transcript.views
    assert shown_roles(chat) == ["user", "assistant"]
    assert views[-1].regenerate_button.isVisibleTo(views[-1]) and not views[0].regenerate_button.isVisibleTo(views[0])
    chat.temperature.setValue(0.9)
    info = ask(env, chat, start=views[-1].regenerate_button.click)
    assert info["finish_reason"] in ("stop", "length")
    assert info["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]  # the old reply was not sent back
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]  # one reply for the turn
    assert shown_roles(chat) == ["user", "assistant"]
    assert chat.transcript.views[-1].content == chat.messages[-1]["content"] != ""
    store = ThreadStore(default_path())
    try:
        assert [m["role"] for m in store.messages(chat.thread.id)] == ["user", "assistant"]
    finally:
        store.close()


def test_edit_and_resend_cuts_the_conversation_and_sends_it_again(env, chat):
    ask(env, chat, "hello there")
    ask(env, chat, "Tell me a joke.")
    assert shown_roles(chat) == ["user", "assistant", "user", "assistant"]
    first = chat.transcript.views[0]
    first.edit_button.click()
    assert first.edit_box.isVisibleTo(first) and first.editor.toPlainText() == "hello there"
    first.editor.setPlainText("What is the capital of France?")
    info = ask(env, chat, start=first.resend_button.click)
    assert [(m["role"], m["content"]) for m in chat.messages][:1] == [("user", "What is the capital of France?")]
    assert shown_roles(chat) == ["user", "assistant"] and chat.reply_text()
    # the engine was sent the edited message alone: the turns after it were cut before sending
    alone = env.run(prompt_tokens(env.first, [{"role": "user", "content": "What is the capital of France?"}]))
    assert info["usage"]["prompt_tokens"] == alone


def test_the_stats_line_resets_when_the_next_reply_starts(env, chat):
    ask(env, chat, "hello there")
    assert "tok/s" in chat.status.full_text()
    seen = {}

    async def second_reply():
        first_delta = next_signal(env.first.bridge.chat_delta)
        done = next_signal(env.first.bridge.chat_done)
        chat.input.setPlainText("And how are you?")
        chat.send()
        await first_delta
        seen["streaming"] = (chat.status.full_text(), chat.status.text())
        await done
    env.run(second_reply())
    assert not any("tok/s" in shown for shown in seen["streaming"]), seen
    assert "tok/s" in chat.status.full_text()


def test_a_long_error_leaves_the_window_width_unchanged(env, chat):
    window = env.first.window
    window.resize(900, 600)
    window.show()
    env.run(asyncio.sleep(0.1))
    width = window.width()
    name = "no-such-model-" + "x" * 600
    chat.model.addItem(name, name)
    chat.model.setCurrentIndex(chat.model.count() - 1)

    async def go():
        failed = next_signal(env.first.bridge.chat_error)
        chat.input.setPlainText("hello")
        chat.send()
        message = (await failed)[1]
        await asyncio.sleep(0.1)
        return message
    message = env.run(go())
    chat.on_models_changed()  # drops the made-up entry again
    assert name in message  # the engine's own error, naming the model
    view = chat.transcript.views[-1]
    assert view.error.isVisibleTo(view) and name in view.error.toPlainText()
    assert chat.status.toolTip().endswith(message) and chat.status.is_elided()
    assert window.width() == width
    assert chat.transcript.horizontalScrollBar().maximum() == 0


def test_an_attached_image_reaches_the_engine_as_an_image_url_part(env, chat, tmp_path):
    assert not chat.attach_button.isEnabled() and chat.attach_button.toolTip() == "the model has no vision"
    png = tmp_path / "dot.png"
    image = QImage(4, 4, QImage.Format.Format_RGB32)
    image.fill(0x3366CC)
    assert image.save(str(png))
    chat.attach_image(str(png))
    assert chat.attach_box.isVisibleTo(chat) and "dot.png" in chat.attachments.full_text()

    async def go():
        failed = next_signal(env.first.bridge.chat_error)
        chat.input.setPlainText("What is in this picture?")
        chat.send()
        return (await failed)[1]
    message = env.run(go())
    assert "image_url" in message  # SmolLM2 has no vision: the engine names the part it was given
    assert chat.messages[-2]["images"][0].startswith("data:image/png;base64,")
    assert not chat.attach_box.isVisibleTo(chat) and chat.pending_images == []


def test_speaking_says_why_it_cannot_be_heard(env, chat):
    chat.messages.append({"role": "assistant", "content": "Please open the window.", "meta": ""})

    async def go():
        failed = next_signal(env.first.bridge.speech_error)
        chat.speaker_button.click()
        await failed
        await asyncio.sleep(0)
    env.run(go())
    assert chat.status.full_text().startswith("not spoken: no text-to-speech model")  # started without --tts


def test_buttons_use_icons_not_emoji(env, chat):
    for b in (chat.mic_button, chat.speaker_button, chat.attach_button, chat.new_button):
        assert not b.icon().isNull()
    for b in chat.findChildren(QAbstractButton):
        assert not any(ord(c) >= 0x2190 for c in b.text()), b.text()  # arrows, shapes, emoji


def test_presets_fill_the_system_prompt_and_the_custom_one_is_kept(env, chat):
    chat.preset.setCurrentText("Concise")
    assert chat.system.toPlainText().startswith("Answer as briefly as possible")
    chat.system.setPlainText("You are a pirate. Answer like one.")
    assert chat.preset.currentText() == "Custom"
    chat.save_custom_prompt()  # what the half-second pause after typing does
    chat.preset.setCurrentText("None")
    assert chat.system.toPlainText() == ""
    chat.preset.setCurrentText("Custom")
    assert chat.system.toPlainText() == "You are a pirate. Answer like one."


def test_a_restart_reopens_the_last_thread_with_every_thread_listed(env, chat):
    chat.system.setPlainText("You are a pirate. Answer like one.")
    ask(env, chat, "Where is the treasure?")
    before = (chat.thread_titles(), chat.thread.title, [(m["role"], m["content"]) for m in chat.messages])
    env.run(env.first.quit())

    again = env.start()  # a new window, bridge and store over the same data dir
    panel = again.window.panels["Chat"]
    assert panel is not chat
    assert panel.thread_titles() == before[0] and "Holiday ideas" in before[0]
    assert panel.thread.title == before[1] == "Where is the treasure?"
    assert [(m["role"], m["content"]) for m in panel.messages] == before[2]
    assert [v.content for v in panel.transcript.views] == [c for _, c in before[2]]
    assert panel.system.toPlainText() == "You are a pirate. Answer like one." and panel.preset.currentText() == "Custom"
    panel.preset.setCurrentText("None")
    panel.preset.setCurrentText("Custom")
    assert panel.system.toPlainText() == "You are a pirate. Answer like one."


def test_the_store_searches_literally_and_survives_a_bad_file(tmp_path):
    store = ThreadStore(tmp_path / "chats.sqlite3")
    a, b = store.create(), store.create()
    store.save(a.id, [{"role": "user", "content": "50% off_sale", "meta": ""}])
    store.save(b.id, [{"role": "user", "content": "500 of them", "meta": ""}])
    assert [t.id for t in store.threads("50%")] == [a.id]  # % and _ are text, not wildcards
    assert [t.id for t in store.threads("f_s")] == [a.id]
    assert store.save(12345, []) is False  # a deleted thread is not brought back
    store.close()

    bad = tmp_path / "bad.sqlite3"
    bad.write_bytes(b"not a database" * 100)
    kept = ThreadStore(bad)
    assert kept.problem is None and kept.threads() == [] and (tmp_path / "bad.sqlite3.corrupt").exists()
    kept.close()

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    memory = ThreadStore(blocked / "chats.sqlite3")  # its folder cannot be made: chat goes on, unsaved
    assert "chats are not saved" in memory.problem
    assert memory.create().title == "New chat" and len(memory.threads()) == 1
    memory.close()
