"""Images in chat: the scheduling of image rows (a fake runner), libmtmd with the test projector, and image
requests through the real engine (SmolLM2-135M with tests/assets/mmproj_gguf.py's projector), called as the
chat completions route calls it."""
from __future__ import annotations

import asyncio
import base64
import io
import threading
import time

import numpy as np
import pytest
from PIL import Image

from engine import config, vision
from engine.core.request import ImageSpan, Request, RequestState
from engine.core.scheduler import Scheduler
from engine.errors import InvalidRequest, ModelLoadError, PayloadTooLarge, UnsupportedByModel
from engine.llama import LlamaModel, VisionTower
from engine.requests import ChatRequest, SamplingParams
from tests.assets import mmproj_gguf
from tests.conftest import LiveServer

N_POS = mmproj_gguf.N_POS  # rows per image: (image side / patch side) squared, from the projector's recipe


# ---- images ------------------------------------------------------------------------------------------

def data_url(img: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def gradient() -> Image.Image:
    """Red to blue, left to right."""
    x = np.linspace(0, 255, 64, dtype=np.float32)
    rgb = np.stack([np.tile(255 - x, (64, 1)), np.zeros((64, 64)), np.tile(x, (64, 1))], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def noise(seed: int = 1, size: tuple[int, int] = (96, 80)) -> Image.Image:
    """Random pixels, not square (the projector resizes it)."""
    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(rgb, "RGB")


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


# ---- the policy: image rows in the scheduler (no llama.cpp) ---------------------------------------------

class FakeRunner:
    """Decodes a step by bookkeeping alone; samples a fixed token per stream (tests/engine/test_scheduler.py)."""

    def __init__(self, sched: Scheduler, max_new: int):
        self.sched, self.max_new, self.steps = sched, max_new, []

    def tick(self) -> bool:
        self.sched.admit()
        step = self.sched.schedule()
        if step.n_tokens == 0:
            return False
        self.steps.append(step)
        self.sched.advance(step)
        for s in list(step.decode) + [s for s, _ in step.prefill if self.sched.prompt_done(s)]:
            if s.state is RequestState.PREFILL:
                self.sched.start_decoding(s)
            s.generated.append(1000 + len(s.generated))
            if len(s.generated) >= self.max_new:
                self.sched.finish(s)
        return True


def with_image(name: str, before: int, n_image: int, after: int, whole: bool = False, key: int = 0) -> Request:
    """A request of `before` text ids, an image of n_image rows, `after` text ids (ids stand in for tokens)."""
    image = list(range(100_000 + key * 1000, 100_000 + key * 1000 + n_image))
    prompt = list(range(before)) + image + list(range(500, 500 + after))
    return Request(id=name, prompt=prompt, images=(ImageSpan(before, np.zeros((n_image, 4), np.float32), whole),))


def test_image_rows_prefill_in_their_own_slices_while_other_streams_decode():
    sched = Scheduler(n_seq=2, chunk=16)
    runner = FakeRunner(sched, max_new=200)
    sched.add(Request(id="text", prompt=list(range(900, 905))))
    runner.tick()  # its prompt, and its first token
    r = with_image("image", before=10, n_image=40, after=3)
    sched.add(r)
    while r.state is not RequestState.DECODE:
        runner.tick()
    steps = runner.steps[1:]
    assert all(s.decode and s.decode[0].id == "text" for s in steps)  # the text stream decodes every tick
    texts = [n for s in steps for q, n in s.prefill if q is r]
    images = [n for s in steps for q, n in s.images if q is r]
    assert texts == [10, 3] and images == [16, 16, 8]  # no slice crosses a text/image border; 16 per tick
    assert sched.seq_tokens[r.seq][:len(r.prompt)] == r.prompt


def test_an_image_decoded_whole_waits_for_a_tick_with_room_for_it():
    sched = Scheduler(n_seq=2, chunk=16)
    runner = FakeRunner(sched, max_new=50)
    long = Request(id="long", prompt=list(range(900, 940)))
    r = with_image("image", before=0, n_image=12, after=2, whole=True)
    sched.add(long)
    sched.add(r)
    for _ in range(4):
        runner.tick()
    assert [step.prefill for step in runner.steps[:3]] == [[(long, 16)], [(long, 16)], [(long, 8)]]
    assert not any(step.images for step in runner.steps[:3])  # 8 left in the third tick: not enough for 12
    assert runner.steps[3].images == [(r, 12)]  # all its rows at once


def test_a_cached_prefix_is_kept_through_whole_images_only():
    sched = Scheduler(n_seq=1, chunk=64)
    held = with_image("held", before=20, n_image=16, after=4)
    sched.seq_tokens[0] = held.prompt[:30]  # a request cancelled 10 rows into its image
    again = with_image("again", before=20, n_image=16, after=4)
    sched.add(again)
    (_, keep, _), = sched.admit()
    assert keep == 20  # not 30: the image's rows are recomputed from its start
    sched.finish(again)
    sched.seq_tokens[0] = held.prompt + [7]
    other = with_image("other", before=20, n_image=16, after=4, key=1)  # a different image, same text around it
    sched.add(other)
    (_, keep, _), = sched.admit()
    assert keep == 20
    sched.finish(other)
    sched.seq_tokens[0] = held.prompt + [7]
    same = with_image("same", before=20, n_image=16, after=6)
    sched.add(same)
    (_, keep, _), = sched.admit()
    assert keep == 20 + 16 + 4  # the whole image and the text after it that matches


# ---- libmtmd with the test projector -------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(assets):
    m = LlamaModel(assets["smollm2"], gpu="off")
    yield m
    m.free()


def decoded(img: Image.Image) -> tuple[int, int, bytes, str]:
    im = vision.decode_image(data_url(img), 1)
    return im.width, im.height, im.rgb, im.digest


def test_libmtmd_loads_the_test_projector_and_encodes_an_image(assets, smollm2):
    tower = VisionTower(assets["mmproj"], smollm2, threads=1, gpu="off", marker="<__media__>")
    try:
        assert tower.n_embd == smollm2.n_embd and not tower.non_causal
        rows = {}
        for name, img in (("gradient", gradient()), ("noise", noise())):
            with tower.tokenized("Look: <__media__> What is it?", [decoded(img)], add_special=False) as parts:
                assert [type(p).__name__ for p in parts] == ["list", "ImageChunk", "list"]
                assert parts[0] == smollm2.tokenize("Look: ", add_special=False)
                assert parts[1].n_rows == N_POS
                rows[name] = parts[1].encode()
        assert rows["gradient"].shape == (N_POS, smollm2.n_embd) and np.isfinite(rows["gradient"]).all()
        assert rows["gradient"].std() > 0.1 and not np.allclose(rows["gradient"], rows["noise"], atol=1e-3)
        with tower.tokenized("<__media__>.", [decoded(gradient())], add_special=False) as parts:
            np.testing.assert_array_equal(parts[0].encode(), rows["gradient"])  # deterministic
    finally:
        tower.free()


def test_a_projector_must_match_the_text_model(assets):
    tiny = LlamaModel(assets["tiny"], gpu="off")  # 64 wide, the projector's rows 576
    try:
        with pytest.raises(ModelLoadError, match="n_embd"):
            VisionTower(assets["mmproj"], tiny, threads=1, gpu="off", marker="<__media__>")
    finally:
        tiny.free()


def test_image_mmproj_in_the_roster_and_on_the_command_line(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[[models]]\nname = "v"\npath = "/m/a.gguf"\nimage_mmproj = "/m/mmproj-a.gguf"\n')
    assert config.load(["--config", str(toml)]).models[0].image_mmproj == "/m/mmproj-a.gguf"
    cfg = config.load(["--config", str(toml), "--model", "/m/b.gguf", "--image-mmproj", "/m/mmproj-b.gguf"])
    assert [(m.name, m.image_mmproj) for m in cfg.models] == [("b", "/m/mmproj-b.gguf"), ("v", "/m/mmproj-a.gguf")]
    with pytest.raises(config.ConfigError, match="--model"):
        config.load(["--config", str(toml), "--image-mmproj", "/m/mmproj-b.gguf"])


# ---- through the engine ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(assets, tmp_path_factory):
    """SmolLM2 with the test projector (also prefilling 16 positions per tick, with five streams, and with one
    stream and a host-RAM prompt cache) and without it."""
    toml = f"""
[[models]]
name = "vision"
path = "{assets['smollm2']}"
image_mmproj = "{assets['mmproj']}"
default = true
ctx = 1024
streams = 2

[[models]]
name = "vision-chunked"
path = "{assets['smollm2']}"
image_mmproj = "{assets['mmproj']}"
ctx = 1024
streams = 2
chunk = 16

[[models]]
name = "vision-cache"
path = "{assets['smollm2']}"
image_mmproj = "{assets['mmproj']}"
ctx = 1024
streams = 1
cache_ram = 64

[[models]]
name = "vision-busy"
path = "{assets['smollm2']}"
image_mmproj = "{assets['mmproj']}"
ctx = 1024
streams = 5

[[models]]
name = "text-only"
path = "{assets['smollm2']}"
ctx = 1024
streams = 1
"""
    # one thread: on a box shared with other work, llama.cpp's spinning threads wait out whole time slices
    s = LiveServer(["--cache-ram", "0", "--threads", "1"], toml, tmp_path_factory.mktemp("vision"))
    yield s
    s.stop()


def run(srv: LiveServer, coro, timeout: float = 120):
    return asyncio.run_coroutine_threadsafe(coro, srv.loop).result(timeout)


def request(content, model: str = "vision", max_tokens: int = 12, **sampling) -> ChatRequest:
    messages = content if isinstance(content, list) and content and "role" in content[0] else \
        [{"role": "user", "content": content}]
    return ChatRequest(model=model, messages=messages,
                       sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling))


def chat(srv: LiveServer, content, model: str = "vision", **kw) -> tuple[str, dict]:
    """(text, usage) of a greedy chat completion, as /v1/chat/completions gets it from the service."""
    async def go():
        gens = await srv.service.chat(request(content, model, **kw), 1)
        return await gens[0].text(), gens[0].usage
    return run(srv, go())


def test_an_image_request_runs_and_counts_the_image_positions(srv):
    question = "What is in this picture?"
    text, usage = chat(srv, [text_part(question), image_part(data_url(gradient()))])
    _, plain = chat(srv, [text_part(question)])
    assert text and usage["completion_tokens"] > 0
    assert usage["prompt_tokens"] == plain["prompt_tokens"] + N_POS
    model = srv.service.roster.loaded["vision"]
    assert model.vision and model.describe()["vision"]
    assert not srv.service.roster.loaded["text-only"].vision


def test_images_decide_the_greedy_output(srv):
    question = [text_part("Describe the image in one sentence.")]
    a = chat(srv, [*question, image_part(data_url(gradient()))])[0]
    b = chat(srv, [*question, image_part(data_url(noise(), "JPEG"))])[0]
    again = chat(srv, [*question, image_part(data_url(gradient()))])[0]
    assert a != b
    assert again == a


def test_the_same_image_and_text_reuse_the_prefix_and_another_image_does_not(srv):
    stats = srv.service.roster.loaded["vision"].stats
    content = [text_part("Name the colours you see."), image_part(data_url(noise(seed=7)))]
    before = stats.prefill_tokens
    cold, first = chat(srv, content)
    assert stats.prefill_tokens - before == first["prompt_tokens"] - first["cached_tokens"] >= N_POS
    before = stats.prefill_tokens
    warm, second = chat(srv, content)
    assert second["cached_tokens"] == second["prompt_tokens"] - 1 and stats.prefill_tokens - before == 1
    assert warm == cold  # a cached prefill gives what the cold one gave
    before = stats.prefill_tokens
    _, other = chat(srv, [content[0], image_part(data_url(noise(seed=8)))])
    assert other["prompt_tokens"] == first["prompt_tokens"]
    # the text before the image may come from the cache, none of the image's rows nor the text after them
    assert stats.prefill_tokens - before == other["prompt_tokens"] - other["cached_tokens"] > N_POS


def test_several_images_per_message_and_images_on_earlier_turns(srv):
    a, b, c = (data_url(img) for img in (gradient(), noise(2), noise(3, (64, 64))))
    conversation = [
        {"role": "user", "content": [text_part("Compare these two:"), image_part(a), image_part(b)]},
        {"role": "assistant", "content": "The first is smooth, the second is noisy."},
        {"role": "user", "content": [text_part("And this one?"), image_part(c)]},
    ]
    text, usage = chat(srv, conversation)
    plain = [{**m, "content": [p for p in m["content"] if p["type"] == "text"]} if isinstance(m["content"], list)
             else m for m in conversation]
    _, without = chat(srv, plain)
    assert text and usage["prompt_tokens"] == without["prompt_tokens"] + 3 * N_POS
    swapped = [{**conversation[0], "content": [text_part("Compare these two:"), image_part(b), image_part(a)]},
               *conversation[1:]]
    assert chat(srv, swapped)[0] != text  # the images are placed where their parts are


def _png_of_size(width: int, height: int) -> str:
    return data_url(Image.new("1", (width, height)))


@pytest.mark.parametrize("url, error, words", [
    ("data:image/png;base64," + base64.b64encode(b"this is not an image").decode(), InvalidRequest, "image 1"),
    ("data:image/png;base64,@@@@", InvalidRequest, "base64"),
    ("data:image/png,rawbytes", InvalidRequest, "base64"),
    ("https://example.com/cat.png", InvalidRequest, "remote URLs are never fetched"),
    ("http://127.0.0.1:1/x.jpg", InvalidRequest, "remote URLs are never fetched"),
])
def test_bad_images_are_refused_with_the_reason(srv, url, error, words):
    with pytest.raises(error, match=words) as e:
        chat(srv, [text_part("Look."), image_part(url)])
    assert e.value.param == "messages"


def test_a_cut_image_and_oversized_images_are_refused_and_the_engine_keeps_serving(srv):
    png = base64.b64decode(data_url(noise()).split(",", 1)[1])
    cut = "data:image/png;base64," + base64.b64encode(png[:len(png) // 2]).decode()
    with pytest.raises(InvalidRequest, match="could not be decoded"):
        chat(srv, [image_part(cut), text_part("?")])
    side = int((vision.MAX_MEGAPIXELS * 1_000_000) ** 0.5) + 100
    with pytest.raises(PayloadTooLarge, match="megapixels"):
        chat(srv, [image_part(_png_of_size(side, side)), text_part("?")])
    huge = "data:image/png;base64," + "A" * ((vision.MAX_IMAGE_MB << 20) * 4 // 3 + 8)
    with pytest.raises(PayloadTooLarge, match=f"at most {vision.MAX_IMAGE_MB} MB"):
        chat(srv, [image_part(huge), text_part("?")])
    with pytest.raises(InvalidRequest, match="image_url"):
        chat(srv, [{"type": "image_url", "image_url": "data:image/png;base64,AAAA"}])
    text, _ = chat(srv, [text_part("Still there?"), image_part(data_url(gradient()))])
    assert text


def test_a_model_without_a_projector_says_it_has_no_vision(srv):
    with pytest.raises(UnsupportedByModel, match="'text-only' has no vision"):
        chat(srv, [text_part("Look."), image_part(data_url(gradient()))], model="text-only")
    assert chat(srv, "Hello", model="text-only")[0]


def test_other_streams_keep_decoding_while_an_image_prefills(srv):
    """16 positions per tick: the image's 64 rows take four ticks, and the text stream decodes in each."""
    model = srv.service.roster.loaded["vision-chunked"]
    bctx = model.runner.bctx
    seen: list[int] = []

    async def go():
        text_gen, = await srv.service.chat(request("Count to a thousand.", "vision-chunked", 300, ignore_eos=True))
        chunks = text_gen.chunks()
        await chunks.__anext__()  # it is decoding
        original = bctx.run_rows

        def spy(slices, non_causal=False):  # on the scheduler thread, before each image decode
            seen.append(len(text_gen.request.generated))
            return original(slices, non_causal)
        bctx.run_rows = spy
        try:
            image_gen, = await srv.service.chat(request([text_part("And this?"),
                                                          image_part(data_url(noise(4)))], "vision-chunked", 4))
            await image_gen.text()
        finally:
            del bctx.run_rows
            text_gen.cancel()
            await chunks.aclose()
        return image_gen.usage
    usage = run(srv, go())
    assert usage["completion_tokens"] > 0
    assert len(seen) == N_POS // 16
    assert all(b > a for a, b in zip(seen, seen[1:]))  # tokens generated between every two image decodes


def test_images_are_encoded_on_the_projectors_worker(srv, monkeypatch):
    threads = []
    encode = vision.ImageChunk.encode

    def spy(chunk):
        threads.append(threading.current_thread().name)
        return encode(chunk)
    monkeypatch.setattr(vision.ImageChunk, "encode", spy)
    assert chat(srv, [text_part("A new one:"), image_part(data_url(noise(11)))])[0]
    assert threads and all(t.startswith("llamadesk-vision") for t in threads)  # never the event loop


TEXT_STREAMS = 4
ENCODE_HOLD_S = 10.0  # the longest an encode is held open waiting for the text streams to move


def test_four_text_streams_keep_decoding_while_an_image_is_encoded(srv, monkeypatch):
    """Around the projector's real encode, the model's decode calls and every text stream's tokens advance: the
    encode runs beside the scheduler thread, not on it (the encode is held open, after it ran, until they
    advance or ENCODE_HOLD_S passes, so the window is measurable however fast the encode is)."""
    runner = srv.service.roster.loaded["vision-busy"].runner
    windows = []
    encode = vision.ImageChunk.encode

    def progress() -> tuple[int, list[int]]:
        return runner.stats.decode_calls, [len(g.request.generated) for g in text_gens]

    def moved(entry: tuple[int, list[int]], now: tuple[int, list[int]]) -> bool:
        return now[0] - entry[0] >= 3 and all(b - a >= 3 for a, b in zip(entry[1], now[1]))

    def measured(chunk):
        entry = progress()
        rows = encode(chunk)
        deadline = time.monotonic() + ENCODE_HOLD_S
        while time.monotonic() < deadline and not moved(entry, progress()):
            time.sleep(0.01)
        windows.append((entry, progress()))
        return rows
    monkeypatch.setattr(vision.ImageChunk, "encode", measured)
    text_gens = []

    async def go():
        streams = []
        try:
            for i in range(TEXT_STREAMS):
                gen, = await srv.service.chat(request(f"Count to a thousand, list {i}.", "vision-busy", 600,
                                                      ignore_eos=True))
                text_gens.append(gen)
                streams.append(gen.chunks())
                await streams[-1].__anext__()  # it is decoding
            image_gen, = await srv.service.chat(request([text_part("And this?"), image_part(data_url(noise(31)))],
                                                        "vision-busy", 4))
            await image_gen.text()
        finally:
            for gen, stream in zip(text_gens, streams):
                gen.cancel()
                await stream.aclose()
        return image_gen.usage
    usage = run(srv, go())
    assert usage["completion_tokens"] > 0 and len(windows) == 1  # one image, encoded once
    assert moved(*windows[0]), windows  # several decodes, each of the four streams, during the encode
    assert runner.stats.max_streams_per_decode >= TEXT_STREAMS


def test_the_host_ram_prompt_cache_keys_images_by_their_bytes(srv):
    """One stream: a conversation the next prompt displaces is saved to RAM and restored when it comes back,
    for the same image only."""
    m = srv.service.roster.loaded["vision-cache"]
    content = [text_part("What do you see here?"), image_part(data_url(noise(21)))]
    cold, first = chat(srv, content, model="vision-cache")
    chat(srv, "Say something else entirely, please.", model="vision-cache")  # takes the only sequence
    warm, again = chat(srv, content, model="vision-cache")
    assert m.stats.ram_reused_tokens == again["cached_tokens"] == again["prompt_tokens"] - 1
    assert warm == cold
    chat(srv, "Say something else entirely, please.", model="vision-cache")
    _, other = chat(srv, [content[0], image_part(data_url(noise(22)))], model="vision-cache")
    assert m.stats.ram_reused_tokens == again["cached_tokens"]  # nothing restored for another image
    assert other["prompt_tokens"] - other["cached_tokens"] > N_POS


# ---- the projector in the memory estimate ------------------------------------------------------------------

def test_the_footprint_counts_the_projector(assets, tmp_path):
    import gguf

    from engine.config import ModelEntry
    from engine.models.manager import ModelManager
    toml = tmp_path / "llamadesk.toml"
    toml.write_text("")
    roster = ModelManager(config.load(["--config", str(toml), "--ctx", "1024", "--streams", "1"]), None, lambda _: None)
    plain = ModelEntry(name="text", path=str(assets["smollm2"]))
    with_tower = ModelEntry(name="vision", path=str(assets["smollm2"]), image_mmproj=str(assets["mmproj"]))
    before = roster.footprint(assets["smollm2"], roster.settings_for(plain))
    after = roster.footprint(assets["smollm2"], roster.settings_for(with_tower))
    tensor_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(assets["mmproj"]).tensors)
    assert after.weights - before.weights >= tensor_bytes > 0
    assert after.compute > before.compute and after.kv == before.kv
    assert after.total - before.total >= tensor_bytes

    bad = tmp_path / "mmproj-bad.gguf"
    bad.write_bytes(b"not a projector")
    with pytest.raises(ModelLoadError, match="vision projector"):
        roster.footprint(assets["smollm2"], roster.settings_for(ModelEntry(name="b", path=str(assets["smollm2"]),
                                                                           image_mmproj=str(bad))))
