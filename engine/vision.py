"""Images in chat: a model's vision projector, the images of a request decoded and bounded, and the prompt a
chat with images becomes.

The rendered chat text holds a media marker where each image goes (engine/chat.py); libmtmd splits it into
text tokens and image chunks (engine/llama.py's VisionTower), and each image chunk's projector rows stand at
as many prompt positions. Those positions hold placeholder ids derived from the image's bytes, above the
vocabulary: the scheduler's prefix reuse, the shared KV cells and the prompt cache compare them like tokens,
so an identical image with identical text reuses its KV and any other image never does (a prefix is only
kept through a whole image: engine/core/request.py's Request.reusable). Decoding (Pillow) runs on the caller's
thread (a prep thread, never the event loop); tokenizing and encoding run on the projector's own worker,
whose rows the scheduler then prefills chunk by chunk like text.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from engine.chat import MEDIA_MARKER, image_urls
from engine.core.promptcache import model_key
from engine.core.request import ImageSpan, Prompt
from engine.errors import InvalidRequest, ModelLoadError, PayloadTooLarge
from engine.llama import ImageChunk, LlamaModel, VisionTower
from engine.threads import compute, lower_priority

log = logging.getLogger("llamadesk.vision")
MAX_IMAGE_MB = 20  # per image, as the file was sent (OpenAI's bound for chat images)
MAX_MEGAPIXELS = 50  # per image, decoded (a 48 MP phone photo fits; Pillow itself warns from 89 MP on)
ROWS_CACHE_BYTES = 64 << 20  # encoded images kept for the next request that sends them again
ID_LIMIT = 0x110000  # prompt ids stay below this: the prefix index keys a prompt as one character per id


@dataclass(frozen=True)
class DecodedImage:
    """An image of a request: the SHA-256 of its bytes as sent, its size, its pixels as RGB bytes."""

    digest: str
    width: int
    height: int
    rgb: bytes


def decode_image(url: str, n: int) -> DecodedImage:
    """The n-th image of a request (1-based, for messages) from its data: URI; InvalidRequest for one that is
    not base64 or no image Pillow reads, PayloadTooLarge beyond MAX_IMAGE_MB or MAX_MEGAPIXELS."""
    header, comma, payload = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise InvalidRequest(f"image {n} is not a base64 data URI (data:image/png;base64,...)", "messages")
    payload = "".join(payload.split())
    if len(payload) * 3 // 4 > MAX_IMAGE_MB << 20:
        raise PayloadTooLarge(f"image {n} is {len(payload) * 3 / 4 / (1 << 20):.1f} MB; an image may have at most "
                              f"{MAX_IMAGE_MB} MB", "messages")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"image {n} is not valid base64", "messages") from None
    try:
        im = Image.open(io.BytesIO(raw))
    except Image.DecompressionBombError:
        raise PayloadTooLarge(f"image {n} has more than {MAX_MEGAPIXELS} megapixels", "messages") from None
    except UnidentifiedImageError:
        raise InvalidRequest(f"image {n} is not an image format Pillow reads (PNG, JPEG, WebP, GIF, BMP, ...)",
                             "messages") from None
    with im:
        width, height = im.size
        if width * height > MAX_MEGAPIXELS * 1_000_000:
            raise PayloadTooLarge(f"image {n} is {width}x{height} pixels ({width * height / 1e6:.0f} megapixels); an "
                                  f"image may have at most {MAX_MEGAPIXELS}", "messages")
        try:  # the header read; the pixels are decoded here, and a cut or corrupt file fails here
            rgb = ImageOps.exif_transpose(im).convert("RGB")
        except Exception as e:  # Pillow's decoders raise OSError, ValueError, SyntaxError, EOFError, ...
            raise InvalidRequest(f"image {n} could not be decoded ({im.format}): {e}", "messages") from None
    return DecodedImage(hashlib.sha256(raw).hexdigest(), rgb.width, rgb.height, rgb.tobytes())


def placeholders(key: str, n: int, n_vocab: int) -> list[int]:
    """n prompt ids above the vocabulary derived from key (an image's digest and chunk): the same image gives
    the same ids, another image others (all n of an image's ids matching by chance: about 1e-6 ** n)."""
    raw = np.frombuffer(hashlib.shake_256(key.encode()).digest(4 * n), dtype="<u4")
    return (n_vocab + raw % (ID_LIMIT - n_vocab)).tolist()


class Projector:
    """A model's vision projector: prompts with images made on its own worker thread, the encoded rows of
    recent images kept (an image sent again is not encoded again)."""

    def __init__(self, path: Path, model: LlamaModel, threads: int, gpu: str):
        if model.n_vocab >= ID_LIMIT // 2:
            raise ModelLoadError(f"model {model.path.name} has {model.n_vocab} tokens: too many to give images "
                                 "placeholder ids beside them")
        # half the cores: while it encodes, the decode loop runs one thread fewer (engine/threads.py)
        self.tower = VisionTower(path, model, max(1, threads // 2), gpu, MEDIA_MARKER)
        self.n_vocab = model.n_vocab
        self.whole = self.tower.non_causal  # its images prefill in one decode each
        # in every placeholder key: the prompt cache on disk is per model file, and another projector (or
        # another version of this one) makes other rows of the same image
        self.identity = model_key(path, "mmproj")
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="llamadesk-vision", initializer=lower_priority)
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()  # by image digest and chunk, LRU
        self._rows_bytes = 0
        log.info("vision projector %s: rows of %d, %s attention over an image", path.name, self.tower.n_embd,
                 "two-way" if self.whole else "causal")

    def prompt(self, text: str, messages: list[dict[str, Any]], add_special: bool) -> Prompt:
        """The prompt of rendered chat text whose markers stand for the images of messages (blocking: from a
        prep thread)."""
        images = [decode_image(url, i + 1) for i, url in enumerate(image_urls(messages))]
        return self._worker.submit(self._prompt, text, images, add_special).result()

    def _prompt(self, text: str, images: list[DecodedImage], add_special: bool) -> Prompt:
        ids: list[int] = []
        spans: list[ImageSpan] = []
        seen: Counter[str] = Counter()  # an image cut into several chunks (tiles): one key per chunk
        bitmaps = [(im.width, im.height, im.rgb, im.digest) for im in images]
        with self.tower.tokenized(text, bitmaps, add_special) as parts:
            for part in parts:
                if isinstance(part, list):
                    ids += part
                    continue
                key = f"{part.id}:{seen[part.id]}"
                seen[part.id] += 1
                rows = self._encoded(key, part)
                spans.append(ImageSpan(len(ids), rows, self.whole))
                ids += placeholders(f"{self.identity}:{key}", len(rows), self.n_vocab)
        if spans and spans[-1].end == len(ids):
            raise InvalidRequest("the prompt ends with an image; text must follow it (the chat template's "
                                 "generation prompt does)", "messages")
        return Prompt(ids, tuple(spans))

    def _encoded(self, key: str, chunk: ImageChunk) -> np.ndarray:
        rows = self._rows.get(key)
        if rows is not None:
            self._rows.move_to_end(key)
            return rows
        with compute.speech_job():  # the cores' share another compute job takes: the decode loop runs one fewer
            rows = chunk.encode()
        rows.setflags(write=False)  # shared by every request that sends the image
        self._rows[key] = rows
        self._rows_bytes += rows.nbytes
        while self._rows_bytes > ROWS_CACHE_BYTES and len(self._rows) > 1:
            self._rows_bytes -= self._rows.popitem(last=False)[1].nbytes
        return rows

    def free(self) -> None:
        """Release the projector once its worker is idle (no request is encoding)."""
        self._worker.shutdown(wait=True)
        self.tower.free()
