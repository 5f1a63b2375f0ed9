"""attention_from_hf against Hugging Face transformers' own modules.

The fixtures (tests/fixtures/*.npz, recorded in float64 with HF's float32
islands removed by scripts/record_hf_fixtures.py, transformers 5.24.0) hold
HF's config, the layer's weights, an input, HF's output, every gradient
and a chunked decode. Here NumPy alone rebuilds the layer from the config
and the state dict and compares.
"""

import copy
import json
from pathlib import Path

import numpy as np
import pytest

import attn_np
from attn_np.hf.build import (
    attention_from_hf,
    attention_layers_from_hf,
    fixture_errors,
)
from attn_np.hf.families import layer_settings
from attn_np.hf.weights import indexer_to_hf
from attn_np.refinements import RefinedAttention

FIXTURES = Path(__file__).parent / "fixtures"
# float64 rounding: the worst error seen is ~1e-14 of the largest entry
TOL = 1e-12

# family -> the layers whose fixtures attention_from_hf must match
BUILT = {
    "llama": [0],
    "mistral": [0],
    "qwen2": [0, 1],
    "qwen3": [0],
    "gemma2": [0, 1],
    "gemma3": [0, 1],
    "gemma3_linear": [0, 1],
    # chapter 16: EmbeddingGemma, bidirectional (0: a symmetric window)
    "embeddinggemma": [0, 1],
    "olmo2": [0],
    "gpt_oss": [0, 1],
    "deepseek_v3": [0],
    "deepseek_v2": [0],
    "falcon_mqa": [0],
    "falcon_new": [0],
    "falcon_alibi": [0],
    "qwen3_next": [0, 1],  # 0: chapter 12's Gated DeltaNet
    "llama4": [0, 1],
    # chapter 11's scaled RoPE
    "llama31": [0],
    "gpt_oss_yarn": [0, 1],
    "deepseek_v3_yarn": [0],
    # chapter 13: DSA (the indexer's top-k as the main attention's mask)
    "deepseek_v32": [0],
}
CASES = [(name, i) for name, layers in BUILT.items() for i in layers]


def config_of(name):
    return json.loads(str(np.load(FIXTURES / f"{name}.npz")["config"]))


@pytest.mark.parametrize("name,i", CASES)
def test_forward_gradients_and_decode_match_hf(name, i):
    errors = fixture_errors(FIXTURES / f"{name}.npz", layer_idx=i)
    assert len(errors) >= 5  # forward, dx, >= 2 weights, decode
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad


def test_the_details_matter():
    """Without its detail a family's layer misses HF by far more than
    rounding: the fixtures can fail."""
    f = np.load(FIXTURES / "gemma2.npz")
    state = {
        k.split("param.")[1]: f[k] for k in f.files if "layer1.param" in k
    }
    layer = attention_from_hf(config_of("gemma2"), 1, state)
    layer.score_mods = ()  # drop the soft-cap
    y = layer.forward(f["x"])
    assert np.max(np.abs(y - f["layer1.out"])) > 1e-3


def test_every_fixture_names_its_transformers_version():
    paths = sorted(FIXTURES.glob("*.npz"))
    assert len(paths) >= 20
    for path in paths:
        meta = json.loads(str(np.load(path)["meta"]))
        if path.name != "flex_attention.npz":  # torch alone records it
            assert meta["transformers"] == "5.24.0", path.name
        assert meta["torch"].startswith("2.13.0"), path.name


def test_both_rope_spellings_give_the_same_layer():
    new = config_of("qwen3_next")
    old = copy.deepcopy(new)
    rope = old.pop("rope_parameters")
    old["rope_theta"] = rope["rope_theta"]
    old["partial_rotary_factor"] = rope["partial_rotary_factor"]
    a, b = attention_from_hf(new, 1), attention_from_hf(old, 1)
    assert (a.rope_base, a.rotary_dim) == (b.rope_base, b.rotary_dim)
    assert (a.rope_base, a.rotary_dim) == (10000.0, 4)


def test_text_config_and_a_folder(tmp_path):
    cfg = config_of("gemma3")
    wrapped = {"model_type": "gemma3", "text_config": cfg}
    layer = attention_from_hf(wrapped, 1)
    assert layer.rope_base == 1e6 and layer.window is None
    assert attention_from_hf(cfg, 0).window == 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert attention_from_hf(tmp_path, 0).rope_base == 1e4
    assert attention_from_hf(tmp_path / "config.json", 0).window == 4


def test_random_weights_without_a_state_dict():
    layer = attention_from_hf(config_of("gpt_oss"), 0)
    x = np.random.default_rng(0).standard_normal((1, 5, 64))
    assert layer.forward(x).shape == (1, 5, 64)
    assert set(layer.params) >= {"W_q", "b_q", "sinks", "b_o"}


def dynamic(cfg):
    cfg = copy.deepcopy(cfg)
    cfg["rope_parameters"] = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "rope_theta": 10000.0,
    }
    return cfg


@pytest.mark.parametrize(
    "cfg,match",
    [
        (lambda: dynamic(config_of("llama")), "rope_type 'dynamic'"),
        (
            lambda: dict(config_of("qwen2"), use_mrope=True),
            "use_mrope=True",
        ),
        (
            lambda: dict(config_of("deepseek_v3"), model_type="deepseek_v4"),
            "model_type='deepseek_v4'",
        ),
    ],
)
def test_unimplemented_rope_and_models_are_refused_by_name(cfg, match):
    with pytest.raises(ValueError, match=match):
        attention_from_hf(cfg(), 0)


def test_a_scaling_key_it_does_not_know_is_refused():
    cfg = config_of("llama31")
    cfg["rope_parameters"]["beta_fast"] = 32.0  # a YaRN key
    with pytest.raises(ValueError, match="'beta_fast' is not used"):
        attention_from_hf(cfg, 0)


def fixture_out(name, i, change):
    """The layer's forward on the fixture's x after ``change(layer)``,
    minus HF's output, relative to HF's largest entry."""
    f = np.load(FIXTURES / f"{name}.npz")
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    layer = attention_from_hf(config_of(name), i, state)
    change(layer)
    ref = f[f"layer{i}.out"]
    return np.max(np.abs(layer.forward(f["x"]) - ref)) / np.max(np.abs(ref))


@pytest.mark.parametrize(
    "name,i", [("llama31", 0), ("gpt_oss_yarn", 1), ("deepseek_v3_yarn", 0)]
)
def test_the_scaling_matters(name, i):
    """Plain RoPE in place of the scaled one misses HF by far more than
    rounding (the frequencies; gpt-oss's factor on cos/sin)."""
    assert fixture_out(name, i, lambda ly: None) < TOL
    assert fixture_out(name, i, unscale) > 1e-4


def unscale(layer):
    layer.rope_scaling = None


def test_deepseek_yarn_temperature_is_in_the_softmax_scale():
    """mscale_all_dim enters the scale (HF's softmax_scale), squared;
    without it the layer misses HF."""
    cfg = config_of("deepseek_v3_yarn")["rope_parameters"]
    layer = attention_from_hf(config_of("deepseek_v3_yarn"), 0)
    m = 0.1 * cfg["mscale_all_dim"] * np.log(cfg["factor"]) + 1.0
    assert layer.scale == pytest.approx(m * m / np.sqrt(12.0), rel=1e-15)

    def plain(ly):
        ly.scale = 12**-0.5

    assert fixture_out("deepseek_v3_yarn", 0, plain) > 1e-3


def test_linear_attention_layer_is_refused_outside_qwen3_next():
    """Only Qwen3-Next's linear_attention layers are chapter 12's Gated
    DeltaNet; another family's layer of that type is refused by name."""
    cfg = dict(config_of("llama"), layer_types=["linear_attention"] * 2)
    with pytest.raises(ValueError, match="'linear_attention'"):
        attention_from_hf(cfg, 0)


def test_unknown_keys_and_bad_state_dicts_are_refused():
    cfg = dict(config_of("llama"), attention_temperature=2.0)
    with pytest.raises(ValueError, match="attention_temperature"):
        attention_from_hf(cfg, 0)
    cfg = config_of("llama")
    cfg["rope_parameters"] = dict(cfg["rope_parameters"], warp=3)
    with pytest.raises(ValueError, match="warp"):
        attention_from_hf(cfg, 0)
    with pytest.raises(ValueError, match="layer_idx"):
        attention_from_hf(config_of("llama"), 2)
    f = np.load(FIXTURES / "llama.npz")
    state = {
        k.split("param.")[1]: f[k] for k in f.files if "layer0.param" in k
    }
    with pytest.raises(ValueError, match="q_proj.bias"):
        attention_from_hf(
            config_of("llama"), 0, dict(state, **{"q_proj.bias": 0})
        )
    del state["o_proj.weight"]
    with pytest.raises(ValueError, match="o_proj.weight"):
        attention_from_hf(config_of("llama"), 0, state)
    with pytest.raises(ValueError, match="model_type"):
        attention_from_hf({"model_type": "bert"}, 0)


def test_the_export():
    assert attn_np.attention_from_hf is attention_from_hf


def test_older_configs_without_layer_types_follow_the_window_rules():
    qwen2 = config_of("qwen2")
    del qwen2["layer_types"]  # use_sliding_window, max_window_layers 1
    assert attention_from_hf(qwen2, 0).window is None
    assert attention_from_hf(qwen2, 1).window == 4
    gemma2 = config_of("gemma2")
    del gemma2["layer_types"]  # Gemma 2: every other layer, from 0
    assert attention_from_hf(gemma2, 0).window == 4
    assert attention_from_hf(gemma2, 1).window is None
    mistral = config_of("mistral")  # no layer_types: every layer
    assert attention_from_hf(mistral, 1).window == 4
    qwen2["use_sliding_window"] = False
    assert attention_from_hf(qwen2, 1).window is None


def test_gemma3_older_rope_spelling():
    new = config_of("gemma3_linear")
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    old.update(
        rope_theta=1e6,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        rope_local_base_freq=1e4,
    )
    for i, (base, factor) in enumerate([(1e4, 1.0), (1e6, 8.0)]):
        for cfg in (new, old):
            layer = attention_from_hf(cfg, i)
            assert (layer.rope_base, layer.rope_factor) == (base, factor)
    del old["rope_local_base_freq"]  # HF's default for the local layers
    assert attention_from_hf(old, 0).rope_base == 1e4
    with pytest.raises(ValueError, match="rope_local_base_freq"):
        attention_from_hf(dict(new, rope_local_base_freq=1e4), 0)


def test_released_configs_read_or_refused_by_name():
    """The published config.json files of the calculator's tests: every
    key is known, and what is not implemented is named. With chapter
    11's scalings (YaRN: DeepSeek-V3, gpt-oss) every one is built."""
    import test_catalogue_hf as published

    built = refused = 0
    for name in dir(published):
        cfg = getattr(published, name)
        if not (name.isupper() and isinstance(cfg, dict)):
            continue
        if "model_type" not in cfg:
            continue
        try:  # layer_settings: the same reading, no weights drawn
            layer_settings(cfg, 0)
            built += 1
        except ValueError as err:
            assert "not implemented" in str(err), (name, err)
            refused += 1
    assert built >= 11 and refused == 0


def test_a_whole_qwen3_next_stack_from_its_config_and_weights():
    """Both layer types of the fixture's Qwen3-Next, built in order from
    its config and state dicts: layer 0 is chapter 12's Gated DeltaNet
    (built by gated_deltanet_from_hf), layer 1 the gated full attention.
    Each runs, backpropagates and decodes with its own cache, as HF's."""
    f = np.load(FIXTURES / "qwen3_next.npz")
    cfg = config_of("qwen3_next")
    assert cfg["layer_types"] == ["linear_attention", "full_attention"]
    states = [
        {
            k.split(".param.")[1]: f[k]
            for k in f.files
            if k.startswith(f"layer{i}.param.")
        }
        for i in range(2)
    ]
    layers = attention_layers_from_hf(cfg, states)
    assert isinstance(layers[0], attn_np.GatedDeltaNet)
    assert isinstance(layers[1], RefinedAttention)
    x, dy = f["x"], f["dy"]
    caches = [layer.new_cache() for layer in layers]
    assert isinstance(caches[0], attn_np.StateCache)
    chunks = json.loads(str(f["meta"]))["chunks"]
    for i, layer in enumerate(layers):
        ref = f[f"layer{i}.out"]
        scale = np.max(np.abs(ref))
        assert np.max(np.abs(layer.forward(x) - ref)) < TOL * scale
        dx = layer.backward(dy)
        want = f[f"layer{i}.grad.x"]
        assert np.max(np.abs(dx - want)) < TOL * np.max(np.abs(want))
        for name, g in layer.to_hf(layer.grads).items():
            want = f[f"layer{i}.grad.{name}"]
            err = np.max(np.abs(g - want)) / np.max(np.abs(want))
            assert err < TOL, (i, name, err)
    outs, t = [[], []], 0
    for n in chunks:  # the stack decodes chunk by chunk, layer by layer
        for i, layer in enumerate(layers):
            outs[i].append(
                layer.forward(x[:, t : t + n], kv_cache=caches[i])
            )
        t += n
    for i in range(2):
        ref = f[f"layer{i}.decode.out"]
        got = np.concatenate(outs[i], axis=1)
        assert np.max(np.abs(got - ref)) < TOL * np.max(np.abs(ref))
    assert len(caches[0]) == len(caches[1]) == x.shape[1]
    # a residual stack of the two runs forward and backward
    h = x + layers[0].forward(x)
    y = h + layers[1].forward(h)
    dh = dy + layers[1].backward(dy)
    dx = dh + layers[0].backward(dh)
    assert y.shape == dx.shape == x.shape
    assert np.isfinite(y).all() and np.isfinite(dx).all()


def test_random_linear_layer_and_bad_state_dict():
    cfg = config_of("qwen3_next")
    layer = attention_from_hf(cfg, 0)
    x = np.random.default_rng(0).standard_normal((1, 5, 64))
    assert layer.forward(x).shape == (1, 5, 64)
    assert {"W_q", "W_z", "A_log", "conv_q"} <= set(layer.params)
    with pytest.raises(ValueError, match="unexpected"):
        attention_from_hf(cfg, 0, {"q_proj.weight": np.zeros((4, 64))})
    with pytest.raises(ValueError, match="hidden_act"):
        attention_from_hf(dict(cfg, hidden_act="gelu"), 0)
    with pytest.raises(ValueError, match="one entry per layer"):
        attention_layers_from_hf(cfg, [{}])


def test_deepseek_v32_selects_hfs_top_k():
    """The lightning indexer picks, for every query, the keys HF's
    indexer picked (layer0.capture.indexer, [B, L, top-k]); for a query
    with fewer visible keys than top-k, all of them (HF's extra indices
    point at masked future keys)."""
    f = np.load(FIXTURES / "deepseek_v32.npz")
    state = {
        k.split("param.")[1]: f[k] for k in f.files if "layer0.param" in k
    }
    layer = attention_from_hf(config_of("deepseek_v32"), 0, state)
    assert isinstance(layer, attn_np.SparseLatentAttention)
    assert layer.index_topk == 4 and layer.indexer.n_heads == 2
    layer.forward(f["x"])
    hf = f["layer0.capture.indexer"]  # [B, L, 4]
    B, L, k = hf.shape
    assert layer.selected.shape == (B, L, L)
    for b in range(B):
        for t in range(L):
            ours = set(np.flatnonzero(layer.selected[b, t]))
            theirs = {int(j) for j in hf[b, t] if j <= t}
            assert ours == theirs, (b, t, ours, theirs)
            assert len(ours) == min(k, t + 1)
    # the indexer's weights come back under HF's names
    back = indexer_to_hf(layer)
    for name, a in back.items():
        np.testing.assert_array_equal(a, state[name])


def test_deepseek_v32_sparsity_matters():
    """With top-k at least L the layer is dense MLA and misses HF's
    sparse output by far more than rounding."""

    def dense(ly):
        ly.index_topk = 9

    assert fixture_out("deepseek_v32", 0, dense) > 1e-3
    assert fixture_out("deepseek_v32", 0, lambda ly: None) < TOL


def test_deepseek_v32_config_is_checked():
    cfg = config_of("deepseek_v32")
    with pytest.raises(ValueError, match="index_topk"):
        attention_from_hf(dict(cfg, index_topk=0), 0)
    with pytest.raises(ValueError, match="q_lora_rank"):
        attention_from_hf(dict(cfg, q_lora_rank=None), 0)
    f = np.load(FIXTURES / "deepseek_v32.npz")
    state = {
        k.split("param.")[1]: f[k] for k in f.files if "layer0.param" in k
    }
    del state["indexer.wk.weight"]
    with pytest.raises(ValueError, match="indexer.wk.weight"):
        attention_from_hf(cfg, 0, state)


def test_deepseek_v32_with_yarn_scales_both_rotations():
    """A released V3.2 config has YaRN: the main rotation and the
    indexer's (HF hands both the model's one cos/sin) take the scaled
    frequencies, and the softmax scale its mscale_all_dim. Built from the
    parts checked above; no V3.2 YaRN fixture was recorded."""
    cfg = config_of("deepseek_v32")
    cfg["rope_parameters"] = config_of("deepseek_v3_yarn")["rope_parameters"]
    cfg["max_position_embeddings"] = 640
    layer = attention_from_hf(cfg, 0)
    yarn = attention_from_hf(config_of("deepseek_v3_yarn"), 0)
    assert layer.scale == yarn.scale != 12**-0.5
    assert layer.indexer.rotary.rope_scaling == yarn.rope_scaling
    assert layer.indexer.rotary.layout == "half"
    x = np.random.default_rng(1).standard_normal((1, 6, 64))
    assert np.isfinite(layer.forward(x)).all()


def test_nan_weights_and_a_zero_head_dim_are_refused_by_name():
    # before: NaN weights loaded silently and the forward blamed "x"
    # (the grouped core's queries), and head_dim 0 was read as "absent"
    f = np.load(FIXTURES / "qwen3.npz")
    cfg = json.loads(str(f["config"]))
    sd = {k.split("param.")[1]: f[k] for k in f.files if "layer0.param" in k}
    bad = dict(sd, **{"k_proj.weight": sd["k_proj.weight"] * np.nan})
    with pytest.raises(ValueError, match="k_proj.weight has .* NaN"):
        attention_from_hf(cfg, 0, bad)
    with pytest.raises(ValueError, match="head_dim"):
        attention_from_hf(dict(cfg, head_dim=0), 0)
