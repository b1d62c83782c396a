"""A reranker GGUF made from SmolLM2-135M-Instruct, the way llama.cpp's converter makes Qwen3-Reranker ones.

A Qwen3-Reranker is a chat model asked whether a document answers a query: the converter copies the LM head's
rows for the answer tokens into `cls.output`, declares rank pooling (`qwen3.pooling_type = 4`, two classifier
labels) and ships the question as the `rerank` chat template; llama.cpp then scores the last token's hidden state
against those rows and softmaxes them, so the score is P(yes) over {yes, no}. llama.cpp loads `cls.output` for
Qwen3 (and BERT kin) but not for the llama architecture, so SmolLM2 is rewritten as a Qwen3 network that computes
the same function:

- Qwen3 ropes with the NeoX layout, llama with interleaved pairs: the rows of Q and K that llama's converter
  permuted are put back in Hugging Face's order (a row permutation, exact).
- Qwen3 RMS-normalises Q and K per head, which llama does not: Q and K are scaled by s = 2^-20 (exact in
  floating point), so that s²·mean(q²) is tiny against the norm's epsilon (1e-5), and the norm's weight
  sqrt(eps)/s undoes the scale: norm(s·q)·w = q·(1 - s²·mean(q²)/(2·eps) + ...). Q and K are stored as F32 (the
  scaled weights underflow F16 block scales); every other tensor is copied as it was.
- The head: SmolLM2 answers "Yes"/"No" (capitalised, with or without a leading space), so each label's row is
  the mean of the tied embedding rows for both spellings (a mean of logits: linear in the hidden state).

Checked when this was written: with every tensor and the KV cache in F32, SmolLM2 and its rewrite give the same
hidden states to 3e-5. As shipped (Q4_1, F16 KV cache) the scores differ from SmolLM2's own yes/no judgement by up
to 0.03, as Q and K are computed without the original's Q4_1 and 8-bit activation rounding.

The prompt (RERANK_TEMPLATE) and the head were picked among a few on a dozen short sets (a question, the sentence
that answers it, three on other subjects); on those and on a second dozen (the first eight are in
tests/server/test_rerank.py) the answering sentence scored highest in 23 of 24, by small margins: a 135M model is
a weak judge, but a real one.

Needs only numpy and gguf (no torch, no llama.cpp).
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VERSION = 1  # bumped when what convert() writes changes (the cached file is named by it)
ARCH = "qwen3"
SCALE = 2.0 ** -20
# The question the model is asked, with llama-server's placeholders ({query}, {document}); SmolLM2's own system
# prompt, as its chat template adds it.
RERANK_TEMPLATE = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nQuestion: {query}\nText: {document}\n"
                   "Does the text answer the question \"{query}\"? Answer yes or no.<|im_end|>\n"
                   "<|im_start|>assistant\n")
LABELS = {"yes": ("Yes", "\u0120Yes"), "no": ("No", "\u0120No")}  # GPT-2 BPE spells a leading space as "Ġ"
_SKIP = {"general.architecture", "general.name", "tokenizer.chat_templates"}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama's converter permutation of Q/K rows (interleaved rope pairs back to NeoX halves)."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _copy_metadata(r: gguf.GGUFReader, w: gguf.GGUFWriter) -> None:
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in _SKIP:
            continue
        if key.startswith("llama."):
            key = ARCH + key[len("llama"):]
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)


def _head(r: gguf.GGUFReader, embd: gguf.ReaderTensor) -> np.ndarray:
    """cls.output: a row per label, the mean of its spellings' embedding rows (tied LM head)."""
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    ids = {t: i for i, t in enumerate(tokens)}
    rows = []
    for spellings in LABELS.values():
        picked = np.stack([embd.data[ids[s]] for s in spellings])
        rows.append(gguf.quants.dequantize(picked, embd.tensor_type).astype(np.float32).mean(0))
    return np.stack(rows)


def convert(src: Path, out: Path) -> None:
    """Write SmolLM2 (a llama-architecture GGUF) at src as a Qwen3 reranker GGUF at out."""
    r = gguf.GGUFReader(str(src))
    if r.fields["general.architecture"].contents() != "llama":
        raise ValueError(f"{src} is not a llama-architecture GGUF")
    n_head = int(r.fields["llama.attention.head_count"].contents())
    n_head_kv = int(r.fields["llama.attention.head_count_kv"].contents())
    n_layer = int(r.fields["llama.block_count"].contents())
    head_dim = int(r.fields["llama.embedding_length"].contents()) // n_head
    eps = np.float32(r.fields["llama.attention.layer_norm_rms_epsilon"].contents())

    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("SmolLM2-135M-Instruct reranker")
    _copy_metadata(r, w)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(list(LABELS))
    w.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])

    norm = np.full(head_dim, np.sqrt(eps, dtype=np.float32) / np.float32(SCALE), dtype=np.float32)
    for t in r.tensors:
        kind = t.name.rsplit(".", 2)[-2] if t.name.startswith("blk.") else None
        if kind in ("attn_q", "attn_k"):
            heads = n_head if kind == "attn_q" else n_head_kv
            full = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, np.ascontiguousarray(_unpermute(full, heads) * np.float32(SCALE)))
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        if t.name == "token_embd.weight":
            w.add_tensor("cls.output.weight", _head(r, t))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", norm)
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", norm)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
