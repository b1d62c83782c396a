"""Stand-ins for the ASR families no package registry carries (NeMo CTC, SenseVoice, Paraformer, NeMo
parakeet TDT, icefall zipformer transducer, Moonshine), in the layout of sherpa-onnx's release folders: the same file names, the
metadata its loaders read and each family's inputs and outputs. Whatever audio they hear, they emit
logits spelling PHRASE, so a test can check that sherpa-onnx ran the model through the configuration
llamadesk built (features, batching, the family's decoder, tokens) and that the text comes back.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.assets.onnx_util import const, save

PHRASE = "hello world"
FEAT = 80          # fbank bins sherpa-onnx computes for these families
LFR = (7, 6)       # SenseVoice/Paraformer low-frame-rate window and shift: 80 x 7 = 560 inputs per frame


def _rows(ids: list[int], vocab: int, fill: int) -> np.ndarray:
    """Logits whose argmax is ids[i] at step i, and `fill` after the last one."""
    table = np.full((len(ids) + 1, vocab), -10.0, np.float32)
    for i, t in enumerate(ids + [fill]):
        table[i, t] = 10.0
    return table


def _spell(ids: list[int], vocab: int, fill: int, batch: str, steps: str, out: str) -> list[onnx.NodeProto]:
    """out[b, i] = the row of _rows for step min(i, len(ids)) — (B, steps, vocab) from int64 scalars."""
    return [
        const("table", _rows(ids, vocab, fill)), const("zero_i", 0, np.int64), const("one_i", 1, np.int64),
        const("last_i", len(ids), np.int64), const("vocab", [vocab], np.int64),
        helper.make_node("Range", ["zero_i", steps, "one_i"], ["step"]),
        helper.make_node("Min", ["step", "last_i"], ["row"]),
        helper.make_node("Gather", ["table", "row"], ["spelled"], axis=0),        # (steps, vocab)
        helper.make_node("Unsqueeze", ["spelled", "axis0"], ["spelled_1"]),       # (1, steps, vocab)
        const("axis0", [0], np.int64),
        helper.make_node("Reshape", [batch, "minus1"], ["batch_1"]), const("minus1", [-1], np.int64),
        helper.make_node("Reshape", [steps, "minus1"], ["steps_1"]),
        helper.make_node("Concat", ["batch_1", "steps_1", "vocab"], ["out_shape"], axis=0),
        helper.make_node("Expand", ["spelled_1", "out_shape"], [out]),
    ]


def _batch_and_frames(features: str, time_axis: int) -> list[onnx.NodeProto]:
    """Scalars `batch` and `frames`: the sizes of axes 0 and time_axis of features."""
    return [
        helper.make_node("Shape", [features], ["dims"]),
        const("i0", [0], np.int64), const("i_time", [time_axis], np.int64),
        helper.make_node("Gather", ["dims", "i0"], ["batch"]),
        helper.make_node("Gather", ["dims", "i_time"], ["frames_1"]),
        helper.make_node("Squeeze", ["frames_1"], ["frames"]),
    ]


def _zero_encoder(features: str, time_axis: int, lengths: str, sub: int, dim: int, out: str, out_lengths: str,
                  channels_first: bool) -> list[onnx.NodeProto]:
    """A transducer encoder's outputs: zeros of (B, dim, T / sub) or (B, T / sub, dim), and lengths / sub."""
    order = ["batch_1", "dim", "steps_1"] if channels_first else ["batch_1", "steps_1", "dim"]
    return _ordered(_batch_and_frames(features, time_axis) + [
        const("sub", sub, np.int64), const("dim", [dim], np.int64), const("zero_f", [0.0]),
        const("minus1", [-1], np.int64),
        helper.make_node("Div", ["frames", "sub"], ["steps"]),
        helper.make_node("Reshape", ["batch", "minus1"], ["batch_1"]),
        helper.make_node("Reshape", ["steps", "minus1"], ["steps_1"]),
        helper.make_node("Concat", order, ["enc_shape"], axis=0),
        helper.make_node("Expand", ["zero_f", "enc_shape"], [out]),
        helper.make_node("Div", [lengths, "sub"], [out_lengths]),
    ])


def _ordered(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Constants first, so every node's inputs exist before it (ONNX graphs are topologically sorted)."""
    return [n for n in nodes if n.op_type == "Constant"] + [n for n in nodes if n.op_type != "Constant"]


def _tokens(path: Path, symbols: list[str]) -> dict[str, int]:
    path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(symbols)), encoding="utf-8")
    return {s: i for i, s in enumerate(symbols)}


def make_nemo_ctc(out: Path) -> None:
    """Like sherpa-onnx-nemo-ctc-en-conformer-small/: model.int8.onnx (audio_signal (B, 80, T), length) ->
    logprobs (B, T / 4, V); BPE tokens with the blank last, as NeMo exports them."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokens(out / "tokens.txt", ["<unk>", "▁hel", "lo", "▁world", "<blk>"])
    blank = ids["<blk>"]
    spelled = [ids["▁hel"], blank, ids["lo"], blank, ids["▁world"]]
    nodes = _batch_and_frames("audio_signal", 2) + [
        const("sub", 4, np.int64),
        helper.make_node("Div", ["frames", "sub"], ["steps"]),
    ] + _spell(spelled, len(ids), blank, "batch", "steps", "logprobs")
    graph = helper.make_graph(
        _ordered(nodes), "nemo-ctc-standin",
        [helper.make_tensor_value_info("audio_signal", TensorProto.FLOAT, ["B", FEAT, "T"]),
         helper.make_tensor_value_info("length", TensorProto.INT64, ["B"])],
        [helper.make_tensor_value_info("logprobs", TensorProto.FLOAT, ["B", "T2", len(ids)])])
    save(graph, out / "model.int8.onnx", {
        "model_type": "EncDecCTCModelBPE", "vocab_size": len(ids), "subsampling_factor": 4,
        "normalize_type": "per_feature", "comment": "llamadesk test stand-in with NeMo CTC's interface"})


def _cmvn() -> dict[str, str]:
    n = FEAT * LFR[0]
    return {"neg_mean": ",".join(["0"] * n), "inv_stddev": ",".join(["1"] * n)}


def make_sense_voice(out: Path) -> None:
    """Like sherpa-onnx-sense-voice-zh-en-ja-ko-yue-2024-07-17/: model.int8.onnx (x (B, T, 560), x_length,
    language, text_norm) -> logits (B, T + 4, V) whose first four steps are the language, emotion, event and
    text-normalisation tags."""
    out.mkdir(parents=True, exist_ok=True)
    symbols = ["<unk>", "<s>", "</s>", "<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|withitn|>", "<|woitn|>",
               "<|zh|>", "<|ja|>", "<|ko|>", "<|yue|>", "<|nospeech|>", "▁hello", "▁world"]
    ids = _tokens(out / "tokens.txt", symbols)
    spelled = [ids["<|en|>"], ids["<|NEUTRAL|>"], ids["<|Speech|>"], ids["<|withitn|>"], ids["▁hello"], 0,
               ids["▁world"]]
    nodes = _batch_and_frames("x", 1) + [
        const("four", 4, np.int64),
        helper.make_node("Add", ["frames", "four"], ["steps"]),
    ] + _spell(spelled, len(ids), 0, "batch", "steps", "logits")
    graph = helper.make_graph(
        _ordered(nodes), "sense-voice-standin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", FEAT * LFR[0]]),
         helper.make_tensor_value_info("x_length", TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("language", TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("text_norm", TensorProto.INT32, ["B"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T4", len(ids)])])
    save(graph, out / "model.int8.onnx", {
        "model_type": "sense_voice_ctc", "vocab_size": len(ids), "lfr_window_size": LFR[0],
        "lfr_window_shift": LFR[1], "normalize_samples": 0, "with_itn": ids["<|withitn|>"],
        "without_itn": ids["<|woitn|>"], "lang_auto": 0, "lang_zh": ids["<|zh|>"], "lang_en": ids["<|en|>"],
        "lang_ja": ids["<|ja|>"], "lang_ko": ids["<|ko|>"], "lang_yue": ids["<|yue|>"], **_cmvn(),
        "comment": "llamadesk test stand-in with SenseVoice's interface"})


def make_paraformer(out: Path) -> None:
    """Like sherpa-onnx-paraformer-en-2024-03-09/: model.int8.onnx (speech (B, T, 560), speech_lengths) ->
    logits (B, N, V) read until </s>, and token_num."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokens(out / "tokens.txt", ["<blank>", "<s>", "</s>", "hello", "world", "<unk>"])
    nodes = _batch_and_frames("speech", 1) + [const("steps", 4, np.int64), const("two", [2], np.int32)] + _spell([ids["hello"], ids["world"]], len(ids), ids["</s>"], "batch", "steps", "logits") + [
        helper.make_node("Expand", ["two", "batch_1"], ["token_num"]),  # batch_1: (B,) made by _spell
    ]
    graph = helper.make_graph(
        _ordered(nodes), "paraformer-standin",
        [helper.make_tensor_value_info("speech", TensorProto.FLOAT, ["B", "T", FEAT * LFR[0]]),
         helper.make_tensor_value_info("speech_lengths", TensorProto.INT32, ["B"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "N", len(ids)]),
         helper.make_tensor_value_info("token_num", TensorProto.INT32, ["B"])])
    save(graph, out / "model.int8.onnx", {
        "model_type": "paraformer", "vocab_size": len(ids), "lfr_window_size": LFR[0], "lfr_window_shift": LFR[1],
        **_cmvn(), "comment": "llamadesk test stand-in with Paraformer's interface"})


def make_parakeet_tdt(out: Path) -> None:
    """Like sherpa-onnx-nemo-parakeet-tdt-0.6b-v2-int8/: encoder, decoder (prediction network with LSTM states)
    and joiner .int8.onnx + tokens.txt, run by sherpa-onnx's NeMo TDT greedy search. The decoder's output is
    the one-hot of the last token and the joiner maps it to the next token of PHRASE (token and duration
    logits), so the words come out in order from the first frame, then blanks."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokens(out / "tokens.txt", ["<unk>", "▁hel", "lo", "▁world", "<blk>"])
    vocab, blank, dim, durations = len(ids), ids["<blk>"], 4, 5
    sub = 8
    encoder = helper.make_graph(_zero_encoder("audio_signal", 2, "length", sub, dim, "outputs", "encoded_lengths",
                                              channels_first=True), "parakeet-encoder-standin",
        [helper.make_tensor_value_info("audio_signal", TensorProto.FLOAT, ["B", FEAT, "T"]),
         helper.make_tensor_value_info("length", TensorProto.INT64, ["B"])],
        [helper.make_tensor_value_info("outputs", TensorProto.FLOAT, ["B", dim, "T2"]),
         helper.make_tensor_value_info("encoded_lengths", TensorProto.INT64, ["B"])])
    save(encoder, out / "encoder.int8.onnx", {
        "model_type": "EncDecRNNTBPEModel", "vocab_size": vocab - 1, "subsampling_factor": sub,  # NeMo: without blank
        "normalize_type": "per_feature", "pred_rnn_layers": 1, "pred_hidden": 2,
        "url": "https://huggingface.co/nvidia/parakeet-tdt-0.6b-v2",
        "comment": "llamadesk test stand-in with NeMo parakeet TDT's interface"})
    decoder = helper.make_graph([
        const("eye", np.eye(vocab, dtype=np.float32)), const("perm_shape", [0, 2, 1], np.int64),
        helper.make_node("Gather", ["eye", "targets"], ["onehot"], axis=0),          # (B, 1, V)
        helper.make_node("Transpose", ["onehot"], ["outputs"], perm=[0, 2, 1]),     # (B, V, 1)
        helper.make_node("Identity", ["target_length"], ["prednet_lengths"]),
        helper.make_node("Identity", ["states.1"], ["states"]),
        helper.make_node("Identity", ["onnx::Slice_3"], ["162"]),
    ], "parakeet-decoder-standin",
        [helper.make_tensor_value_info("targets", TensorProto.INT32, ["B", 1]),
         helper.make_tensor_value_info("target_length", TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("states.1", TensorProto.FLOAT, [1, "B", 2]),
         helper.make_tensor_value_info("onnx::Slice_3", TensorProto.FLOAT, [1, "B", 2])],
        [helper.make_tensor_value_info("outputs", TensorProto.FLOAT, ["B", vocab, 1]),
         helper.make_tensor_value_info("prednet_lengths", TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("states", TensorProto.FLOAT, [1, "B", 2]),
         helper.make_tensor_value_info("162", TensorProto.FLOAT, [1, "B", 2])])
    decoder.node.remove(decoder.node[1])  # the perm is an attribute, not an input
    save(decoder, out / "decoder.int8.onnx")
    follows = {blank: ids["▁hel"], ids["▁hel"]: ids["lo"], ids["lo"]: ids["▁world"]}  # else: blank
    table = np.full((vocab, vocab + durations), -10.0, np.float32)
    for last in range(vocab):
        table[last, follows.get(last, blank)] = 10.0
        table[last, vocab] = 10.0  # duration 0: stay on the frame after a token
    joiner = helper.make_graph([
        const("table", table), const("flat", [-1, vocab], np.int64), const("out_shape", [-1, 1, 1, vocab + durations],
                                                                            np.int64),
        helper.make_node("Reshape", ["decoder_outputs", "flat"], ["last"]),
        helper.make_node("MatMul", ["last", "table"], ["scores"]),
        helper.make_node("ReduceSum", ["encoder_outputs"], ["enc_sum"], keepdims=0),
        helper.make_node("Add", ["scores", "enc_sum"], ["scores_e"]),  # the encoder output (zeros) takes part
        helper.make_node("Reshape", ["scores_e", "out_shape"], ["logits"]),
    ], "parakeet-joiner-standin",
        [helper.make_tensor_value_info("encoder_outputs", TensorProto.FLOAT, ["B", dim, 1]),
         helper.make_tensor_value_info("decoder_outputs", TensorProto.FLOAT, ["B", vocab, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 1, 1, vocab + durations])])
    save(joiner, out / "joiner.int8.onnx")


def make_moonshine(out: Path) -> None:
    """Like sherpa-onnx-moonshine-tiny-en-int8/ (Moonshine v1): preprocess.onnx (audio -> features),
    encode.int8.onnx, uncached_decode.int8.onnx and cached_decode.int8.onnx (the last token and a cache in,
    logits and the cache out) + tokens.txt. The decoders map the last token to the next word of PHRASE,
    then </s>."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokens(out / "tokens.txt", ["<unk>", "<s>", "</s>", "▁hello", "▁world"])
    vocab, dim = len(ids), 4
    follows = {ids["<s>"]: ids["▁hello"], ids["▁hello"]: ids["▁world"]}  # else: </s>
    table = np.full((vocab, vocab), -10.0, np.float32)
    for last in range(vocab):
        table[last, follows.get(last, ids["</s>"])] = 10.0
    preprocess = helper.make_graph(_ordered([
        helper.make_node("Shape", ["args_0"], ["dims"]), const("i1", [1], np.int64), const("hop", [384], np.int64),
        const("one", [1], np.int64), const("dim", [dim], np.int64), const("zero_f", [0.0]),
        helper.make_node("Gather", ["dims", "i1"], ["samples"]),
        helper.make_node("Div", ["samples", "hop"], ["frames"]),
        helper.make_node("Concat", ["one", "frames", "dim"], ["shape"], axis=0),
        helper.make_node("Expand", ["zero_f", "shape"], ["features"]),
    ]), "moonshine-preprocess-standin", [helper.make_tensor_value_info("args_0", TensorProto.FLOAT, [1, "N"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, "T", dim])])
    save(preprocess, out / "preprocess.onnx")
    encode = helper.make_graph([helper.make_node("Identity", ["args_0"], ["encoded"])], "moonshine-encode-standin",
                               [helper.make_tensor_value_info("args_0", TensorProto.FLOAT, [1, "T", dim]),
                                helper.make_tensor_value_info("args_1", TensorProto.INT32, [1])],
                               [helper.make_tensor_value_info("encoded", TensorProto.FLOAT, [1, "T", dim])])
    save(encode, out / "encode.int8.onnx")

    def decoder(name: str, cached: bool) -> onnx.GraphProto:
        nodes = [const("table", table), const("flat", [-1], np.int64), const("logit_shape", [1, 1, vocab], np.int64),
                 helper.make_node("Cast", ["args_0"], ["last_64"], to=TensorProto.INT64),
                 helper.make_node("Reshape", ["last_64", "flat"], ["last"]),
                 helper.make_node("Gather", ["table", "last"], ["row"], axis=0),
                 helper.make_node("ReduceSum", ["args_1"], ["enc_sum"], keepdims=0),
                 helper.make_node("Add", ["row", "enc_sum"], ["row_e"]),  # the encoder output (zeros) takes part
                 helper.make_node("Reshape", ["row_e", "logit_shape"], ["logits"]),
                 helper.make_node("Cast", ["args_2"], ["cache_out"], to=TensorProto.FLOAT)]
        inputs = [helper.make_tensor_value_info("args_0", TensorProto.INT32, [1, 1]),
                  helper.make_tensor_value_info("args_1", TensorProto.FLOAT, [1, "T", dim]),
                  helper.make_tensor_value_info("args_2", TensorProto.INT32, [1])]
        if cached:
            inputs.append(helper.make_tensor_value_info("args_3", TensorProto.FLOAT, [1]))
        return helper.make_graph(nodes, name, inputs,
                                 [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, vocab]),
                                  helper.make_tensor_value_info("cache_out", TensorProto.FLOAT, [1])])
    save(decoder("moonshine-uncached-standin", False), out / "uncached_decode.int8.onnx")
    save(decoder("moonshine-cached-standin", True), out / "cached_decode.int8.onnx")


def make_zipformer_transducer(out: Path) -> None:
    """Like sherpa-onnx-zipformer-en-2023-06-26/ (icefall): encoder, decoder (the last context_size tokens)
    and joiner .int8.onnx + tokens.txt, run by sherpa-onnx's batched greedy search (one token per frame at
    most). The decoder's output is the one-hot of the last token; the joiner maps it to the next token of
    PHRASE, then blank."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokens(out / "tokens.txt", ["<blk>", "<sos/eos>", "<unk>", "▁hel", "lo", "▁world"])
    vocab, dim, sub = len(ids), 4, 4
    encoder = helper.make_graph(_zero_encoder("x", 1, "x_lens", sub, dim, "encoder_out", "encoder_out_lens",
                                              channels_first=False), "zipformer-encoder-standin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", FEAT]),
         helper.make_tensor_value_info("x_lens", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, ["N", "T2", dim]),
         helper.make_tensor_value_info("encoder_out_lens", TensorProto.INT64, ["N"])])
    save(encoder, out / "encoder-epoch-99-avg-1.int8.onnx", {"model_type": "zipformer2", "comment": "stand-in"})
    decoder = helper.make_graph([
        const("eye", np.eye(vocab, dtype=np.float32)), const("last_col", [1], np.int64),
        helper.make_node("Gather", ["y", "last_col"], ["last_2d"], axis=1),      # (N, 1)
        helper.make_node("Squeeze", ["last_2d", "last_col"], ["last"]),           # (N,)
        helper.make_node("Gather", ["eye", "last"], ["decoder_out"], axis=0),     # (N, V)
    ], "zipformer-decoder-standin",
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", 2])],
        [helper.make_tensor_value_info("decoder_out", TensorProto.FLOAT, ["N", vocab])])
    save(decoder, out / "decoder-epoch-99-avg-1.int8.onnx", {"vocab_size": vocab, "context_size": 2})
    follows = {ids["<blk>"]: ids["▁hel"], ids["▁hel"]: ids["lo"], ids["lo"]: ids["▁world"]}  # else: blank
    table = np.full((vocab, vocab), -10.0, np.float32)
    for last in range(vocab):
        table[last, follows.get(last, ids["<blk>"])] = 10.0
    joiner = helper.make_graph([
        const("table", table),
        helper.make_node("MatMul", ["decoder_out", "table"], ["scores"]),
        helper.make_node("ReduceSum", ["encoder_out"], ["enc_sum"], keepdims=0),
        helper.make_node("Add", ["scores", "enc_sum"], ["logit"]),  # the encoder output (zeros) takes part
    ], "zipformer-joiner-standin",
        [helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, ["N", dim]),
         helper.make_tensor_value_info("decoder_out", TensorProto.FLOAT, ["N", vocab])],
        [helper.make_tensor_value_info("logit", TensorProto.FLOAT, ["N", vocab])])
    save(joiner, out / "joiner-epoch-99-avg-1.int8.onnx")
