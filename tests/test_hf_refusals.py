"""Every decoder family attention_from_hf refuses says why: the part its
attention needs (``_NOT_BUILT``), a key it refuses, or that a layer is
not attention, never only that its model type is not one it builds."""

import pytest

from attn_np.hf.families import layer_settings
from attn_np.hf.keys import _NOT_BUILT
from attn_np.instruments import atlas

_DECODER_KINDS = ("decoder", "decoder (multimodal wrapper)")
_TYPE_ONLY = "is not one attention_from_hf builds"


@pytest.fixture(scope="module")
def loaded():
    return atlas.load()


def test_every_refused_decoder_says_why(loaded):
    unnamed = []
    for row in loaded["families"]:
        if atlas.kind(row) not in _DECODER_KINDS:
            continue
        try:
            layer_settings(row["config"], 0)
        except (ValueError, TypeError) as err:
            if _TYPE_ONLY in str(err):
                unnamed.append(row["model_type"])
    assert not unnamed, unnamed


def test_no_decoder_row_is_unexamined(loaded):
    unexamined = [
        t["family"]
        for t in atlas.table_rows(loaded)
        if t["kind"] in _DECODER_KINDS
        and t["detail"] == "family not examined"
    ]
    assert not unexamined, unexamined


@pytest.mark.parametrize(
    ("model_type", "words"),
    [
        ("deepseek_v4", "kv_proj"),
        ("bailing_hybrid", "Kimi Delta Attention"),
        ("minimax", "lightning attention"),
    ],
)
def test_a_refusal_names_the_part(model_type, words):
    config = {"model_type": model_type, "hidden_size": 64}
    with pytest.raises(ValueError, match="its attention needs") as err:
        layer_settings(config, 0)
    assert words in str(err.value)
    assert "which the library lacks" in str(err.value)


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "falcon_mamba"])
def test_a_family_without_attention_says_so(model_type):
    with pytest.raises(ValueError, match="an attention layer, and it has"):
        layer_settings({"model_type": model_type, "hidden_size": 64}, 0)
    assert _NOT_BUILT["rwkv"].startswith("no attention layer: ")


def test_wrappers_are_refused_by_their_text_model(loaded):
    rows = {r["model_type"]: r for r in loaded["families"]}
    for wrapper in ("mllama", "qwen4_exp"):
        with pytest.raises(ValueError, match="its attention needs"):
            layer_settings(rows[wrapper]["config"], 0)
