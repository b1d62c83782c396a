"""installer/gpu_check.py's parts that need no GPU: the F32 copy it compares exactly, and its verdict on answers
that part (a near tie the GPU took the other way, or a real difference)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import llama_cpp
import numpy
import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "installer" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

# what lavapipe and the CPU answered for "Name three colours of the rainbow." (SmolLM2 Q4_1), and the CPU's two
# likeliest tokens where they part
CPU = "The rainbow is often associated with three colours"
GPU = "The rainbow is a beautiful sight"
TOP2 = [(" often", -1.702), (" a", -1.741)]


def test_answers_parted_at_a_near_tie_agree():
    assert gpu_check.parted_at_a_tie(GPU, CPU, 14, TOP2, tie=0.25)


@pytest.mark.parametrize("gpu, cpu, start, top2, tie", [
    (GPU, CPU, 14, TOP2, 0.01),  # the two tokens are further apart than allowed
    (GPU, CPU, 14, [(" often", -0.1), (" a", -2.9)], 0.25),  # the CPU was sure: the GPU got it wrong
    ("The rainbow is the sky", CPU, 14, TOP2, 0.25),  # the GPU took neither of the CPU's choices
    ("A rainbow is a beautiful sight", CPU, 14, TOP2, 0.25),  # they differ before that token
    (GPU, CPU, 14, [(" often", -1.702)], 0.25),  # no second choice to compare with
])
def test_answers_parted_otherwise_do_not(gpu, cpu, start, top2, tie):
    assert not gpu_check.parted_at_a_tie(gpu, cpu, start, top2, tie)


def test_the_f32_copy_holds_every_tensor_in_f32_and_answers_as_the_model(assets, tmp_path):
    source = assets["smollm2"]
    copy = gpu_check.dequantized(source, tmp_path / "f32.gguf")
    original, f32 = gguf.GGUFReader(source), gguf.GGUFReader(copy)
    assert {t.name: list(t.shape) for t in f32.tensors} == {t.name: list(t.shape) for t in original.tensors}
    assert {t.tensor_type for t in f32.tensors} == {gguf.GGMLQuantizationType.F32}
    assert f32.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    assert f32.fields["tokenizer.chat_template"].contents() == original.fields["tokenizer.chat_template"].contents()
    logits = []
    for path in (source, copy):
        llm = llama_cpp.Llama(str(path), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
        try:
            llm.eval(llm.tokenize(b"The capital of France is"))
            logits.append(numpy.array(llm.scores[llm.n_tokens - 1]))
            paris = llm.tokenize(b" Paris", add_bos=False)
        finally:
            llm.close()
    # the same weights: only the CPU kernels' rounding of the activations (Q8_1 for Q4_1 weights) sets them apart
    assert logits[0].argmax() == logits[1].argmax() == paris[0]
    assert numpy.corrcoef(logits[0], logits[1])[0, 1] > 0.99
