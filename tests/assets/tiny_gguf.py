"""A tiny random-weight llama GGUF (2 layers, dim 64, byte-level BPE, ChatML template).

Real llama.cpp loads, tokenizes, chat-formats, generates and embeds with it in
milliseconds, which makes it the model for fast engine and server tests.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FIM = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "l l"]


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the printable symbol standing for each byte 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write(out: Path, layers: int = 2, dim: int = 64, heads: int = 4, kv_heads: int = 2, ff: int = 128,
          ctx: int = 8192, seed: int = 0, nan_output: bool = False, fim: bool = False) -> None:
    """Write the tiny model to out; nan_output: an output projection of NaNs (a broken model's logits); fim:
    with fill-in-the-middle tokens declared (as code models have them)."""
    specials = SPECIALS + (FIM if fim else [])
    tokens = specials + _byte_symbols() + [m.replace(" ", "") for m in MERGES]
    types = [gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * (len(tokens) - len(specials))
    rng = np.random.default_rng(seed)

    def rnd(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    head_dim = dim // heads
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    if fim:
        for key, tok in ((gguf.Keys.Tokenizer.FIM_PRE_ID, FIM[0]), (gguf.Keys.Tokenizer.FIM_SUF_ID, FIM[1]),
                         (gguf.Keys.Tokenizer.FIM_MID_ID, FIM[2])):
            w.add_uint32(key, tokens.index(tok))

    w.add_tensor("token_embd.weight", rnd(len(tokens), dim))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, np.float32))
        w.add_tensor(p + "attn_q.weight", rnd(dim, dim))
        w.add_tensor(p + "attn_k.weight", rnd(kv_heads * head_dim, dim))
        w.add_tensor(p + "attn_v.weight", rnd(kv_heads * head_dim, dim))
        w.add_tensor(p + "attn_output.weight", rnd(dim, dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(ff, dim))
        w.add_tensor(p + "ffn_up.weight", rnd(ff, dim))
        w.add_tensor(p + "ffn_down.weight", rnd(dim, ff))
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    output = rnd(len(tokens), dim)
    if nan_output:
        output[:] = np.nan
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
