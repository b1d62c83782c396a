"""Convert a sentence-transformers BERT checkpoint (safetensors + vocab) to a llama.cpp GGUF.

Needs only numpy and gguf (no torch): the header of a safetensors file is JSON followed by
raw little-endian arrays, and gguf's tensor-name map knows BERT's layout.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
_SKIP = {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            start, end = info["data_offsets"]
            out[name] = np.frombuffer(raw[start:end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def convert(model_dir: Path, out: Path) -> None:
    """Write model_dir's BERT as an f16 GGUF with mean pooling (sentence-transformers' default)."""
    hp = json.loads((model_dir / "config.json").read_text())
    arch = gguf.MODEL_ARCH.BERT
    n_layers = hp["num_hidden_layers"]
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("all-MiniLM-L6-v2")
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_block_count(n_layers)
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    added = json.loads((model_dir / "tokenizer.json").read_text()).get("added_tokens", [])
    special = {t["content"] for t in added if t.get("special")}
    tokens, types = [], []
    for t in vocab:
        if t in special:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL)
        else:  # llama.cpp's WordPiece marks word starts with a leading "▁" instead of "##" continuations
            tokens.append(t[2:] if t.startswith("##") else "\u2581" + t)
            types.append(gguf.TokenType.NORMAL)
    ids = {t: i for i, t in enumerate(vocab)}
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(hp.get("type_vocab_size", 2))
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_bos_token_id(ids["[CLS]"])
    w.add_mask_token_id(ids["[MASK]"])

    names = gguf.get_tensor_name_map(arch, n_layers)
    for name, data in _tensors(model_dir / "model.safetensors").items():
        name = name.removeprefix("bert.")
        if name in _SKIP:
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"cannot map BERT tensor {name}")
        data = np.ascontiguousarray(data.astype(np.float32))
        if data.ndim == 2 and not new.startswith(("token_types", "position_embd")):
            data = data.astype(np.float16)
        w.add_tensor(new, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
