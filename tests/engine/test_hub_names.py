"""Reading Hugging Face GGUF repos: quant labels from real file names, model names, split sets, the default pick."""
from __future__ import annotations

import pytest

from engine.catalog.hub import HubFile, Spec, group, parse_spec, pick, quant_of
from engine.errors import InsufficientMemory, InvalidRequest, ModelNotFound


@pytest.mark.parametrize("name, quant", [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"),
    ("gemma-3-4b-it-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("Meta-Llama-3.1-8B-Instruct-IQ2_XXS.gguf", "IQ2_XXS"),
    ("Qwen3-30B-A3B-BF16-00001-of-00002.gguf", "BF16"),
    ("Llama-3.3-70B-Instruct-Q4_K_M-00002-of-00002.gguf", "Q4_K_M"),
    ("tinyllama-1.1b-chat-v1.0.Q4_0.gguf", "Q4_0"),
    ("mistral-7b-instruct-v0.2.Q5_K_S.gguf", "Q5_K_S"),
    ("ggml-model-f16.gguf", "F16"),
    ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
    ("Q8_0/phi-4-Q8_0.gguf", "Q8_0"),
    ("Qwen2-7B-Instruct.gguf", ""),
    ("model.gguf", ""),
])
def test_quant_from_real_file_names(name, quant):
    assert quant_of(name) == quant


@pytest.mark.parametrize("text, spec", [
    ("bartowski/Llama-3.2-1B-Instruct-GGUF", Spec("bartowski/Llama-3.2-1B-Instruct-GGUF")),
    ("bartowski/Llama-3.2-1B-Instruct-GGUF:q8_0", Spec("bartowski/Llama-3.2-1B-Instruct-GGUF", "Q8_0")),
    ("hf.co/unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL", Spec("unsloth/Qwen3-8B-GGUF", "UD-Q4_K_XL")),
    ("https://huggingface.co/a/b/sub/x-Q4_0.gguf", Spec("a/b", None, "sub/x-Q4_0.gguf")),
])
def test_model_names(text, spec):
    assert parse_spec(text) == spec


@pytest.mark.parametrize("text", ["llama3", "a/b/c", "a/b/x.gguf:Q4_0", "a/b/../x.gguf", "a/b:", "/a/b", "a b/c"])
def test_malformed_names_name_the_field(text):
    with pytest.raises(InvalidRequest) as e:
        parse_spec(text)
    assert e.value.param == "model"


def files(*names: str, size: int = 100) -> list[HubFile]:
    return [HubFile(n, size, "a" * 64) for n in names]


def test_split_sets_are_one_model_and_incomplete_sets_are_left_out():
    listing = group("o/r", files("m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf", "README.md",
                                 "m-Q8_0-00001-of-00003.gguf", "mmproj-m-f16.gguf", "m-Q2_K.gguf"))
    assert [(v.quant, [f.path for f in v.files]) for v in listing.variants] == [
        ("Q2_K", ["m-Q2_K.gguf"]),
        ("Q4_K_M", ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"])]
    assert [f.path for f in listing.vision] == ["mmproj-m-f16.gguf"]
    assert listing.incomplete == ["m-Q8_0 (1 of 3 parts)"]


def test_the_default_pick_is_the_preferred_quant_that_fits():
    listing = group("o/r", files("m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-Q2_K.gguf", "m-F16.gguf"))
    fits = {"Q8_0": "fits", "Q4_K_M": "too big", "Q2_K": "fits", "F16": "fits"}
    assert pick(listing, Spec("o/r"), lambda v: fits[v.quant]).quant == "Q8_0"  # Q4_K_M would not fit
    fits["Q4_K_M"] = "fits"
    assert pick(listing, Spec("o/r"), lambda v: fits[v.quant]).quant == "Q4_K_M"
    only_tight = {"Q8_0": "too big", "Q4_K_M": "too big", "Q2_K": "tight", "F16": "too big"}
    assert pick(listing, Spec("o/r"), lambda v: only_tight[v.quant]).quant == "Q2_K"
    with pytest.raises(InsufficientMemory, match="o/r:QUANT"):
        pick(listing, Spec("o/r"), lambda v: "too big")
    assert pick(listing, Spec("o/r", "F16"), lambda v: "too big").quant == "F16"  # asked for: taken anyway
    with pytest.raises(ModelNotFound, match="it has F16, Q2_K, Q4_K_M, Q8_0"):
        pick(listing, Spec("o/r", "IQ1_S"), lambda v: "fits")


def test_a_quant_two_models_share_must_be_named_by_file():
    listing = group("o/r", files("a-Q4_K_M.gguf", "b-Q4_K_M.gguf"))
    with pytest.raises(InvalidRequest, match="a-Q4_K_M.gguf, b-Q4_K_M.gguf"):
        pick(listing, Spec("o/r", "Q4_K_M"), lambda v: "fits")
    assert pick(listing, Spec("o/r", file="b-Q4_K_M.gguf"), lambda v: "fits").path == "b-Q4_K_M.gguf"
