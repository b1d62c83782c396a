"""A tiny random-weight vision projector (an mmproj GGUF) that llama.cpp's libmtmd loads: a LLaVA-style `mlp`
projector over a 2-layer ViT, 64x64 images in 8x8 patches (64 image positions), its output rows as wide as
SmolLM2-135M's embeddings (576), so the two make a vision model for the tests.

The keys and tensor names are the ones tools/mtmd/clip-impl.h reads (clip.vision.*, v.blk.N.*, mm.0/mm.2);
`mlp` needs no special attention mask or M-RoPE positions, so its rows prefill like tokens.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VERSION = 1  # a new file name (tests/assets/prepare.py) when the recipe changes
IMAGE_SIZE = 64
PATCH_SIZE = 8
N_POS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # image positions per image: one row per patch, no class embedding
TEXT_EMBD = 576  # SmolLM2-135M's n_embd: the rows go straight into its first layer


def write(out: Path, n_embd_text: int = TEXT_EMBD, dim: int = 64, heads: int = 4, ff: int = 128, layers: int = 2,
          hidden: int = 128, seed: int = 0) -> None:
    """Write the projector to out."""
    rng = np.random.default_rng(seed)

    def rnd(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "clip")
    w.add_name("tiny-random-mlp-projector")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    w.add_uint32("clip.vision.embedding_length", dim)
    w.add_uint32("clip.vision.feed_forward_length", ff)
    w.add_uint32("clip.vision.block_count", layers)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    # numpy shapes are ggml's ne reversed: a conv kernel [out, in, kh, kw], a linear weight [out, in]
    # patches weigh more than positions, so that different images give clearly different rows
    w.add_tensor("v.patch_embd.weight", rnd(dim, 3, PATCH_SIZE, PATCH_SIZE, scale=0.2))
    w.add_tensor("v.patch_embd.bias", rnd(dim, scale=0.02))
    w.add_tensor("v.position_embd.weight", rnd(N_POS, dim, scale=0.02))
    for i in range(layers):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(p + name + ".weight", rnd(dim, dim, scale=0.1))
            w.add_tensor(p + name + ".bias", np.zeros(dim, np.float32))
        for name in ("ln1", "ln2"):
            w.add_tensor(p + name + ".weight", np.ones(dim, np.float32))
            w.add_tensor(p + name + ".bias", np.zeros(dim, np.float32))
        w.add_tensor(p + "ffn_up.weight", rnd(ff, dim, scale=0.1))
        w.add_tensor(p + "ffn_up.bias", np.zeros(ff, np.float32))
        w.add_tensor(p + "ffn_down.weight", rnd(dim, ff, scale=0.1))
        w.add_tensor(p + "ffn_down.bias", np.zeros(dim, np.float32))
    w.add_tensor("mm.0.weight", rnd(hidden, dim, scale=0.15))
    w.add_tensor("mm.0.bias", np.zeros(hidden, np.float32))
    w.add_tensor("mm.2.weight", rnd(n_embd_text, hidden, scale=0.1))
    w.add_tensor("mm.2.bias", np.zeros(n_embd_text, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
