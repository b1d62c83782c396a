"""Stand-ins for the TTS families no package registry carries (Kokoro, Kitten, Matcha + vocoder).

None of their weights can be had here (see README, "Test models"), so these are small real ONNX
graphs laid out like sherpa-onnx's release archives — the same file names, the same metadata keys
its loaders read (from its add_meta_data.py scripts), voices.bin with sherpa-onnx's layout, the
same inputs in the same order — run by the real sherpa-onnx. What they compute is a sine tone
instead of speech, built so that a test can check from the audio alone that the wiring is right:

- duration = number of phoneme tokens x HOP / speed (so phonemes reached the model, and speed did);
- pitch = the chosen voice's style row x 1000 Hz (so the speaker id picked the right voice).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.assets.onnx_util import const, save

HOP = 300            # samples per token (Kokoro/Kitten) or per vocoder frame group (Matcha)
RATE = 24000         # Kokoro and Kitten are 24 kHz models
MATCHA_RATE = 22050
MATCHA_FRAMES_PER_TOKEN = 4
MATCHA_HOP = 256     # samples per mel frame (HiFi-GAN)

KOKORO_VOICES = ("af_heart", "bf_emma", "ef_dora")       # American, British, Spanish speakers
KITTEN_VOICES = ("expr-voice-2-m", "expr-voice-2-f", "expr-voice-3-m")
VOICE_HZ = (220.0, 330.0, 440.0)                          # pitch of each voice's tone

# Symbols of the Kokoro/Kitten vocabulary: pad, punctuation, letters, IPA (as in their tokens.txt).
_PAD = "$"
_PUNCT = ';:,.!?¡¿—…"«»“” '
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_IPA = ("ɑɐɒæɓʙβɔɕçɗɖðʤəɘɚɛɜɝɞɟʄɡɠɢʛɦɧħɥʜɨɪʝɭɬɫɮʟɱɯɰŋɳɲɴøɵɸθœɶʘɹɺɾɻʀʁɽʂʃʈʧʉʊʋⱱʌɣɤʍχʎʏʑʐʒʔʡʕʢǀǁǂǃ"
        "ˈˌːˑʼʴʰʱʲʷˠˤ˞↓↑→↗↘'̩'ᵻ")


def _tokens_txt(path: Path) -> None:
    seen: list[str] = []
    for ch in _PAD + _PUNCT + _LETTERS + _IPA:
        if ch not in seen:
            seen.append(ch)
    path.write_text("".join(f"{ch} {i}\n" for i, ch in enumerate(seen)), encoding="utf-8")


def _tone_nodes(samples: str, hz: str, out: str, rate: int) -> list[onnx.NodeProto]:
    """out = 0.3 * sin(2 pi hz t / rate) for t in range(floor(samples)); samples and hz are float scalars."""
    return [
        const("zero", 0.0), const("one", 1.0), const("w", 2 * math.pi / rate), const("amp", 0.3),
        helper.make_node("Floor", [samples], ["n_samples"]),
        helper.make_node("Range", ["zero", "n_samples", "one"], ["t"]),
        helper.make_node("Mul", ["t", hz], ["t_hz"]),
        helper.make_node("Mul", ["t_hz", "w"], ["phase"]),
        helper.make_node("Sin", ["phase"], ["wave"]),
        helper.make_node("Mul", ["wave", "amp"], [out]),
    ]


def _token_count(tokens: str) -> list[onnx.NodeProto]:
    """n_tokens: the float length of a (1, N) int64 tensor."""
    return [
        helper.make_node("Shape", [tokens], ["tok_shape"]),
        const("axis1", [1], np.int64),
        helper.make_node("Gather", ["tok_shape", "axis1"], ["n_tok_i"]),
        helper.make_node("Cast", ["n_tok_i"], ["n_tok_1"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["n_tok_1"], ["n_tokens"], keepdims=0),
    ]


def _styled_graph(name: str, token_input: str, style_dim: int, output: str) -> onnx.GraphProto:
    """tokens (1, N), style (1, D), speed (1,) -> audio (T,): the Kokoro/Kitten signature."""
    nodes = _token_count(token_input) + [
        const("hop", float(HOP)), const("khz", 1000.0),
        helper.make_node("ReduceSum", ["speed"], ["speed_s"], keepdims=0),
        helper.make_node("Mul", ["n_tokens", "hop"], ["len_1x"]),
        helper.make_node("Div", ["len_1x", "speed_s"], ["len"]),
        helper.make_node("ReduceMean", ["style"], ["style_mean"], keepdims=0),
        helper.make_node("Mul", ["style_mean", "khz"], ["hz"]),
    ] + _tone_nodes("len", "hz", output, RATE)
    return helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(token_input, TensorProto.INT64, [1, "N"]),
         helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, style_dim]),
         helper.make_tensor_value_info("speed", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["T"])])


def _voices_bin(path: Path, rows: int, dim: int) -> None:
    """sherpa-onnx's voices.bin: float32 [speaker][row][dim]; every row of voice k = VOICE_HZ[k] / 1000."""
    styles = np.stack([np.full((rows, dim), hz / 1000.0, np.float32) for hz in VOICE_HZ])
    path.write_bytes(styles.astype("<f4").tobytes())


def make_kokoro(out: Path) -> None:
    """Like kokoro-multi-lang-v1_0/: model.onnx, voices.bin, tokens.txt."""
    out.mkdir(parents=True, exist_ok=True)
    rows, dim = 64, 16
    save(_styled_graph("kokoro-standin", "tokens", dim, "audio"), out / "model.onnx", {
        "model_type": "kokoro", "language": "multi-lang, e.g., English, Chinese", "has_espeak": 1,
        "sample_rate": RATE, "version": 2, "voice": "en-us", "style_dim": f"{rows},1,{dim}",
        "n_speakers": len(KOKORO_VOICES), "speaker_names": ",".join(KOKORO_VOICES),
        "comment": "llamadesk test stand-in with Kokoro v1.0's interface (a tone, not speech)"})
    _voices_bin(out / "voices.bin", rows, dim)
    _tokens_txt(out / "tokens.txt")


def make_kitten(out: Path) -> None:
    """Like kitten-nano-en-v0_2-fp16/: model.fp16.onnx, voices.bin, tokens.txt."""
    out.mkdir(parents=True, exist_ok=True)
    rows, dim = 1, 16
    save(_styled_graph("kitten-standin", "input_ids", dim, "waveform"), out / "model.fp16.onnx", {
        "model_type": "kitten-tts", "language": "English", "has_espeak": 1, "sample_rate": RATE,
        "version": 1, "voice": "en-us", "style_dim": f"{rows},{dim}", "n_speakers": len(KITTEN_VOICES),
        "speaker_names": ",".join(KITTEN_VOICES),
        "comment": "llamadesk test stand-in with kitten-tts-nano's interface (a tone, not speech)"})
    _voices_bin(out / "voices.bin", rows, dim)
    _tokens_txt(out / "tokens.txt")


def make_matcha(out: Path) -> None:
    """Like matcha-icefall-en_US-ljspeech/ with a HiFi-GAN vocoder beside it: model-steps-3.onnx,
    hifigan_v2.onnx, tokens.txt. The acoustic model emits N x 4 / speed mel frames of ones, the vocoder
    256 samples of a 220 Hz tone per frame."""
    out.mkdir(parents=True, exist_ok=True)
    nodes = _token_count("x") + [
        const("fpt", float(MATCHA_FRAMES_PER_TOKEN)),
        helper.make_node("ReduceSum", ["length_scale"], ["ls"], keepdims=0),
        helper.make_node("Mul", ["n_tokens", "fpt"], ["frames_1x"]),
        helper.make_node("Mul", ["frames_1x", "ls"], ["frames_f"]),
        helper.make_node("Floor", ["frames_f"], ["frames_fl"]),
        helper.make_node("Cast", ["frames_fl"], ["frames"], to=TensorProto.INT64),
        const("mel_head", [1, 80], np.int64), const("axis0", [0], np.int64),
        helper.make_node("Unsqueeze", ["frames", "axis0"], ["frames_1"]),
        helper.make_node("Concat", ["mel_head", "frames_1"], ["mel_shape"], axis=0),
        const("one_f", [1.0]),
        helper.make_node("Expand", ["one_f", "mel_shape"], ["mel"]),
    ]
    acoustic = helper.make_graph(
        nodes, "matcha-standin",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, "N"]),
         helper.make_tensor_value_info("x_length", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("noise_scale", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("length_scale", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 80, "F"])])
    save(acoustic, out / "model-steps-3.onnx", {
        "model_type": "matcha-tts", "language": "English", "voice": "en-us", "has_espeak": 1, "jieba": 0,
        "n_speakers": 1, "sample_rate": MATCHA_RATE, "version": 1, "pad_id": 0, "use_eos_bos": 1,
        "comment": "llamadesk test stand-in with Matcha-TTS's interface"})
    vnodes = [
        helper.make_node("Shape", ["mel"], ["mel_dims"]),
        const("axis2", [2], np.int64),
        helper.make_node("Gather", ["mel_dims", "axis2"], ["n_frames_i"]),
        helper.make_node("Cast", ["n_frames_i"], ["n_frames_1"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["n_frames_1"], ["n_frames"], keepdims=0),
        const("mhop", float(MATCHA_HOP)), const("hz_per_unit", VOICE_HZ[0]),
        helper.make_node("Mul", ["n_frames", "mhop"], ["n_samp"]),
        helper.make_node("ReduceMean", ["mel"], ["mel_mean"], keepdims=0),
        helper.make_node("Mul", ["mel_mean", "hz_per_unit"], ["vhz"]),
    ] + _tone_nodes("n_samp", "vhz", "audio", MATCHA_RATE)
    vocoder = helper.make_graph(
        vnodes, "hifigan-standin",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 80, "F"])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["T"])])
    save(vocoder, out / "hifigan_v2.onnx", {"model_type": "hifigan", "comment": "llamadesk test stand-in"})
    _tokens_txt(out / "tokens.txt")


MMS_LETTERS = " abcdefghijklmnopqrstuvwxyz'"


def make_mms(out: Path) -> None:
    """Like vits-mms-eng/: a VITS model spelling text letter by letter (frontend = characters): model.onnx
    (x, x_length, noise_scale, length_scale, noise_scale_w) -> y, and tokens.txt of letters."""
    out.mkdir(parents=True, exist_ok=True)
    nodes = _token_count("x") + [
        const("hop", float(HOP)), const("hz", VOICE_HZ[0]),
        helper.make_node("ReduceSum", ["length_scale"], ["ls"], keepdims=0),
        helper.make_node("Mul", ["n_tokens", "hop"], ["len_1x"]),
        helper.make_node("Mul", ["len_1x", "ls"], ["len"]),
    ] + _tone_nodes("len", "hz", "y", RATE)
    graph = helper.make_graph(
        nodes, "mms-standin",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, "N"]),
         helper.make_tensor_value_info("x_length", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("noise_scale", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("length_scale", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("noise_scale_w", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T"])])
    save(graph, out / "model.onnx", {
        "model_type": "vits", "comment": "mms", "language": "English", "frontend": "characters", "add_blank": 1,
        "n_speakers": 1, "sample_rate": RATE, "punctuation": ""})
    (out / "tokens.txt").write_text("".join(f"{t} {i}\n" for i, t in enumerate(["_", *MMS_LETTERS])),
                                    encoding="utf-8")
