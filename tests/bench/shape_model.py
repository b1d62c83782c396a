"""A random-weight GGUF with the exact shape of a real model, for benchmarks on more than one model shape.

Compute and memory cost depend on the shape (layers, widths, heads, vocabulary), not on the weights, so a
random Qwen2.5-0.5B costs what the real one costs; its text is gibberish, which a throughput benchmark does
not read. The tokenizer is byte-level BPE (256 byte tokens, then merges of printable-ASCII pairs and triples up
to the vocabulary size) with ChatML's special tokens and template, so chat requests render and tokenize as on
the real model. 2-D weights are written as Q8_0 (quantized here with gguf-py), norms and biases as F32.

  python tests/bench/shape_model.py qwen2.5-0.5b [--dest DIR]   -> DIR/qwen2.5-0.5b-shape-q8_0.gguf
Cached: a second call returns the existing file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", embd=896, layers=24, heads=14, kv_heads=2, ff=4864, vocab=151936,
                         ctx=32768, rope_base=1e6, rms_eps=1e-6, qkv_bias=True, pre="qwen2"),
    "smollm2-135m": dict(arch="llama", embd=576, layers=30, heads=9, kv_heads=3, ff=1536, vocab=49152,
                         ctx=8192, rope_base=1e5, rms_eps=1e-5, qkv_bias=False, pre="smollm"),
}


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value (bytes that print stand for themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def vocabulary(size: int) -> tuple[list[str], list[str]]:
    """(tokens, merges): bytes, then pair merges of printable ASCII by commonness, then pair+char triples."""
    alphabet = byte_alphabet()
    common = " etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,'\"-:;!?()\n\t"
    order = list(dict.fromkeys([alphabet[ord(c)] for c in common] + [alphabet[b] for b in range(32, 127)]))
    rank = {c: i for i, c in enumerate(order)}
    wanted = size - 256 - len(SPECIALS)
    pairs = sorted(((a, b) for a in order for b in order), key=lambda p: (rank[p[0]] + rank[p[1]], rank[p[0]]))
    merges = [f"{a} {b}" for a, b in pairs[:wanted]]
    tokens = [a + b for a, b in pairs[:wanted]]
    seen = set(tokens) | set(alphabet)
    for (a, b) in pairs[:6000]:
        if len(merges) >= wanted:
            break
        for c in order:
            if a + b + c not in seen and len(merges) < wanted:
                seen.add(a + b + c)
                merges.append(f"{a}{b} {c}")
                tokens.append(a + b + c)
    assert len(merges) == wanted, (len(merges), wanted)
    return alphabet + tokens + SPECIALS, merges


def write(shape: str, path: Path, seed: int = 1234) -> Path:
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    e, heads, kv, ff, vocab = s["embd"], s["heads"], s["kv_heads"], s["ff"], s["vocab"]
    head_dim = e // heads
    tmp = path.with_suffix(".part")
    w = gguf.GGUFWriter(str(tmp), s["arch"])
    w.add_name(f"{shape}-shape-random")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(e)
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_vocab_size(vocab)
    tokens, merges = vocabulary(vocab)
    special = {name: len(tokens) - len(SPECIALS) + i for i, name in enumerate(SPECIALS)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(s["pre"])
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS))
    w.add_token_merges(merges)
    w.add_bos_token_id(special["<|endoftext|>"])
    w.add_eos_token_id(special["<|im_end|>"])
    w.add_pad_token_id(special["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def matrix(name: str, rows: int, cols: int) -> None:  # numpy (out, in) is ggml's ne = [in, out]
        data = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
        q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(name: str, n: int, value: float | None = None) -> None:
        w.add_tensor(name, np.full(n, value, np.float32) if value is not None
                     else rng.standard_normal(n, dtype=np.float32) * 0.02)

    matrix("token_embd.weight", vocab, e)
    vector("output_norm.weight", e, 1.0)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", e, 1.0)
        matrix(p + "attn_q.weight", heads * head_dim, e)
        matrix(p + "attn_k.weight", kv * head_dim, e)
        matrix(p + "attn_v.weight", kv * head_dim, e)
        if s["qkv_bias"]:
            vector(p + "attn_q.bias", heads * head_dim)
            vector(p + "attn_k.bias", kv * head_dim)
            vector(p + "attn_v.bias", kv * head_dim)
        matrix(p + "attn_output.weight", e, heads * head_dim)
        vector(p + "ffn_norm.weight", e, 1.0)
        matrix(p + "ffn_gate.weight", ff, e)
        matrix(p + "ffn_up.weight", ff, e)
        matrix(p + "ffn_down.weight", e, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def ensure(shape: str, dest: Path) -> Path:
    path = dest / f"{shape}-shape-q8_0.gguf"
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        print(f"writing {path.name} (random weights, {shape} shape; once)", file=sys.stderr)
        write(shape, path)
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--dest", type=Path, default=Path.home() / ".cache/llamadesk/bench-models")
    print(ensure(ap.parse_args().shape, ap.parse_args().dest))
