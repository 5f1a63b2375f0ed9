"""Mistral Large 4's text model: indexed MLA without a query latent,
learned RoPE frequencies and a learned query scale per head and
position (attn_np.hf.families_mistral, gradient-checked in float64),
against transformers 5.24.0's fixture; the layers it does not build are
refused by name."""

import numpy as np
import pytest
from helpers import family_fixture

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.families_mistral import _MistralLargeLatentAttention
from attn_np.instruments.gradcheck import TOLERANCE


def _load():
    return family_fixture("mistral_large4_text")


def _layer(**kw):
    layer = _MistralLargeLatentAttention(
        16, 2, 4, 6, 4, d_head_v=3, seed=1, latent_norm=True,
        index_n_heads=2, index_head_dim=6, index_topk=3,
        rope_layout="interleaved", **kw,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    layer.params["qs_slope"] = 0.5 * rng.standard_normal(2)
    layer.params["qs_bias"] = 1 + 0.3 * rng.standard_normal(2)
    layer.set_rope_log_gain(0.3 * rng.standard_normal(2))
    return layer


@pytest.mark.parametrize("scaling", [None, {"rope_type": "yarn",
                                            "factor": 4.0,
                                            "original_max_position_"
                                            "embeddings": 4}])  # fmt: skip
def test_gradients_with_the_query_scale_and_learned_frequencies(scaling):
    layer = _layer(rope_scaling=scaling, latent_eps=1e-5)
    x = np.random.default_rng(0).standard_normal((2, 7, 16))
    errs = check_layer_gradients(layer, x, seed=4)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_the_indexer_picks_hfs_keys():
    f, cfg, state = _load()
    layer = attention_from_hf(cfg, 0, state)
    layer.forward(f["x"])
    idx = f["layer0.capture.indexer"]  # [B, L, 4]
    L = idx.shape[1]
    for b in range(idx.shape[0]):
        for t in range(L):
            hf = {int(s) for s in idx[b, t] if s <= t}  # visible ones
            assert hf == set(np.flatnonzero(layer.selected[b, t])), (b, t)


def test_the_scale_and_the_frequencies_matter():
    f, cfg, state = _load()
    want = f["layer0.out"]
    layer = attention_from_hf(cfg, 0, state)
    assert np.abs(layer.forward(f["x"]) - want).max() < 1e-12
    plain = attention_from_hf(cfg, 0, state)
    plain.params["qs_slope"][:] = 0
    plain.params["qs_bias"][:] = 1
    assert np.abs(plain.forward(f["x"]) - want).max() > 1e-3
    still = attention_from_hf(cfg, 0, state)
    still.set_rope_log_gain(np.zeros_like(still.rope_log_gain))
    assert np.abs(still.forward(f["x"]) - want).max() > 1e-3


def test_the_models_alpha_is_required_with_a_state_dict():
    _, cfg, state = _load()
    del state["rotary_emb.alpha"]
    with pytest.raises(ValueError, match="rotary_emb.alpha"):
        attention_from_hf(cfg, 0, state)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(no_rope_layers=[0, 1]), "no_rope_layers"),
        (dict(kv_source_layers=[0, 0]), "kv_source_layers"),
        (dict(indexer_types=["full", "shared"]), "shared"),
    ],
)
def test_the_layers_it_does_not_build_are_refused_by_name(change, match):
    _, cfg, _ = _load()
    i = 0 if "no_rope_layers" in change else 1
    with pytest.raises(ValueError, match=match):
        layer_settings(dict(cfg, **change), i)


def test_a_file_without_the_plan_gets_the_class_pattern():
    _, cfg, _ = _load()
    cfg = dict(cfg, num_hidden_layers=8)
    plan = ("no_rope_layers", "kv_source_layers", "indexer_types")
    for key in (*plan, "layer_types", "mlp_layer_types"):
        del cfg[key]
    layer_settings(cfg, 2)  # RoPE, its own latents, a full indexer
    with pytest.raises(ValueError, match="no_rope_layers"):
        layer_settings(cfg, 3)  # every 4th layer is NoPE
    with pytest.raises(ValueError, match="shared"):
        layer_settings(dict(cfg, index_topk_freq=2), 2)
