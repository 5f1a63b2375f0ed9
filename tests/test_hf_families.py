"""Issue 44: every decoder family attention_from_hf admits beyond chapter
10's, against Hugging Face transformers 5.24.0's own modules.

tests/fixtures/families/<model_type>.npz are recorded like the top-level
fixtures (scripts/record_hf_fixtures.py, float64 with HF's float32
islands removed): HF's config, the layer's state dict, an input, HF's
output, every gradient and a chunked decode. NumPy alone rebuilds each
recorded layer from the config and the state dict and compares; the
families the library cannot build are refused, naming what is missing.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np.hf.build import attention_from_hf, fixture_errors
from attn_np.hf.families import NAMES, layer_settings

FAMILY_FIXTURES = Path(__file__).parent / "fixtures" / "families"
# float64 rounding: the worst error recorded is ~3e-15 of the largest entry
TOL = 1e-10


def _cases():
    for path in sorted(FAMILY_FIXTURES.glob("*.npz")):
        meta = json.loads(str(np.load(path)["meta"]))
        for i in meta["layers"]:
            yield pytest.param(path, i, id=f"{path.stem}-layer{i}")


def _config(name):
    f = np.load(FAMILY_FIXTURES / f"{name}.npz")
    return json.loads(str(f["config"]))


def test_every_fixture_is_an_admitted_family():
    names = {p.stem for p in FAMILY_FIXTURES.glob("*.npz")}
    assert len(names) >= 30
    for name in names:
        assert _config(name)["model_type"] == name
        assert name in NAMES  # FAMILIES, or a layer of its own (MLA)


@pytest.mark.parametrize("path,i", list(_cases()))
def test_family_matches_hf(path, i):
    errors = fixture_errors(path, layer_idx=i)
    assert {"forward", "grad x", "decode"} <= set(errors)
    assert any(k.startswith("grad ") and k != "grad x" for k in errors)
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad


def _kw(config, i=0):
    return {"use_rope": True, **layer_settings(config, i)[2]}


def test_the_details_are_read():
    """The keys each family reads change the layer as HF's code does."""
    assert _kw(_config("seed_oss"))["biases"] == ("q", "k", "v", "o")
    no_out = {**_config("seed_oss"), "attention_out_bias": False}
    assert _kw(no_out)["biases"] == ("q", "k", "v")
    assert _kw(_config("glm4_moe"))["biases"] == ("q", "k", "v")
    assert _kw(_config("ernie4_5"))["rope_layout"] == "interleaved"
    assert _kw(_config("granite"))["scale"] == 0.1
    smol = _config("smollm3")
    assert [_kw(smol, i)["use_rope"] for i in (0, 1)] == [True, False]
    # Cohere 2 and EXAONE 4: RoPE on the window layers only
    for name in ("cohere2", "exaone4", "kolibri1", "flint"):
        cfg = _config(name)
        assert [_kw(cfg, i)["use_rope"] for i in (0, 1)] == [True, False]
    # EXAONE 4 without any window: every layer turns
    flat = {**_config("exaone4"), "sliding_window": None}
    flat["layer_types"] = ["full_attention"] * 2
    assert [_kw(flat, i)["use_rope"] for i in (0, 1)] == [True, True]
    # Cohere 2's pattern when layer_types is not written: every 4th full
    c2 = {**_config("cohere2"), "num_hidden_layers": 8}
    del c2["layer_types"]
    windows = [_kw(c2, i)["window"] for i in range(8)]
    assert windows == [4, 4, 4, None] * 2
    assert [_kw(c2, i)["use_rope"] for i in range(8)] == [
        w is not None for w in windows
    ]
    # Qwen3-MoE: the window on every layer, only with use_sliding_window
    q3 = _config("qwen3_moe")
    assert _kw(q3)["window"] == 4
    assert _kw({**q3, "use_sliding_window": False})["window"] is None


def _bare(name):
    """The family's fixture config without any RoPE key."""
    cfg = _config(name)
    for key in ("rope_parameters", "rope_theta", "partial_rotary_factor"):
        cfg.pop(key, None)
    return cfg


def test_a_file_without_rope_keys_gets_the_class_defaults():
    """What each configuration class of transformers 5.24.0 fills in
    (checked there when this was written)."""
    assert _kw(_bare("mixtral"))["rope_base"] == 1e6
    assert _kw(_bare("apertus"))["rope_base"] == 1.2e7
    assert _kw(_bare("glm4"))["rotary_dim"] == 8  # 0.5 of head_dim 16
    assert _kw(_bare("stablelm"))["rotary_dim"] == 4  # 0.25
    assert _kw(_bare("arcee"))["rope_base"] == 1e4
    # MiniMax-M2's released files: rotary_dim, not partial_rotary_factor
    assert _kw({**_bare("minimax_m2"), "rotary_dim": 8})["rotary_dim"] == 8
    # Mellum: 5e5 on full layers, 1e4 on sliding ones
    mellum = _bare("mellum")
    assert [_kw(mellum, i)["rope_base"] for i in (0, 1)] == [1e4, 5e5]


def test_a_missing_detail_shows():
    """Without its detail a family's layer misses HF by far more than
    rounding (the fixtures can fail)."""
    path = FAMILY_FIXTURES / "ernie4_5.npz"
    f = np.load(path)
    config = {**_config("ernie4_5"), "model_type": "llama"}
    del config["use_bias"]
    config["attention_bias"] = True
    state = {
        k[len("layer0.param.") :]: f[k] for k in f.files if ".param." in k
    }
    layer = attention_from_hf(config, 0, state)  # half-split RoPE
    err = np.max(np.abs(layer.forward(f["x"]) - f["layer0.out"]))
    assert err > 1e-3 * np.max(np.abs(f["layer0.out"]))


@pytest.mark.parametrize(
    "name,change,match",
    [
        ("olmo", {"clip_qkv": -8.0}, "clip_qkv"),
        ("olmoe", {"clip_qkv": "8"}, "clip_qkv"),
        ("stablelm", {"qk_layernorm": "yes"}, "qk_layernorm"),
        ("cohere", {"layer_norm_eps": -1.0}, "layer_norm_eps"),
        ("gemma", {"use_bidirectional_attention": True}, "bidirectional"),
        (
            "phimoe",
            {"rope_parameters": {"rope_type": "longrope"}},
            "rope_type 'longrope'",
        ),
        ("nemotron", {"some_new_key": 1}, "some_new_key"),
    ],
)
def test_an_admitted_family_refuses_what_it_lacks(name, change, match):
    with pytest.raises(ValueError, match=match):
        layer_settings({**_config(name), **change}, 0)


@pytest.mark.parametrize(
    "model_type,match",
    [
        ("zaya", "convolutions on q and k"),
        ("doge", "a dynamic mask from the values"),
        ("dory", "sqk"),
    ],
)
def test_a_family_that_needs_a_missing_part_is_refused(model_type, match):
    config = {**_config("arcee"), "model_type": model_type}
    with pytest.raises(ValueError, match=match) as err:
        layer_settings(config, 0)
    assert model_type in str(err.value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("qkv_bias", True),
        ("use_bias", True),
        ("attention_multiplier", 0.5),
        ("attention_out_bias", True),
        ("no_rope_layers", [0, 1]),
        ("alibi", True),
    ],
)
def test_a_key_another_family_reads_is_refused_by_name(key, value):
    """Llama's layer would ignore these: a Llama config that sets one is
    refused naming it, not built without it."""
    top = FAMILY_FIXTURES.parent / "llama.npz"
    config = json.loads(str(np.load(top)["config"]))
    config[key] = value
    with pytest.raises(ValueError, match=key):
        attention_from_hf(config, 0)
    config[key] = None  # unset: harmless
    attention_from_hf(config, 0)


@pytest.mark.parametrize(
    "family", ["mistral", "mixtral", "ministral", "cwm"]
)
def test_attention_bias_is_ignored_where_hf_ignores_it(family):
    """These HF classes write bias=False on every projection: a file's
    attention_bias: true changes nothing there, and nothing here."""
    top = FAMILY_FIXTURES.parent / "llama.npz"
    config = json.loads(str(np.load(top)["config"]))
    config.update(model_type=family, attention_bias=True)
    _, _, kw, _ = layer_settings(config, 0)
    assert kw["biases"] == ()


def test_qwen35_reads_its_split_projections_and_text_positions():
    """Qwen3.5's Gated DeltaNet keeps in_proj_qkv, in_proj_z, in_proj_b
    and in_proj_a (Qwen3-Next's fused in_proj_qkvz and in_proj_ba are
    refused by name); multimodal RoPE's keys leave a text layer's
    rotation as it is."""
    path = FAMILY_FIXTURES / "qwen3_5_text.npz"
    f = np.load(path)
    cfg = json.loads(str(f["config"]))
    state = {
        k.split("param.")[1]: f[k] for k in f.files if "layer0.param" in k
    }
    assert "in_proj_qkv.weight" in state
    fused = dict(state, **{"in_proj_qkvz.weight": state["in_proj_z.weight"]})
    with pytest.raises(ValueError, match="unexpected.*in_proj_qkvz"):
        attention_from_hf(cfg, 0, fused)
    mm = dict(cfg)
    mm["rope_parameters"] = dict(
        cfg["rope_parameters"],
        mrope_section=[1, 1, 0],
        mrope_interleaved=True,
    )
    assert _kw(mm, 1) == _kw(cfg, 1)
    other = dict(cfg, model_type="qwen3_next")  # Qwen3-Next reads them not
    other["rope_parameters"] = mm["rope_parameters"]
    with pytest.raises(ValueError, match="mrope"):
        layer_settings(other, 1)


def test_afmoe_gates_from_its_own_projection_and_turns_window_layers():
    """AFMoE: RoPE on the window layers only, an elementwise output gate
    from gate_proj; without layer_types, global_attn_every_n_layers sets
    which layers are full, as AfmoeConfig writes them."""
    cfg = _config("afmoe")
    assert [_kw(cfg, i)["use_rope"] for i in (0, 1)] == [True, False]
    assert _kw(cfg, 0)["gate"] == "elementwise"
    assert layer_settings(cfg, 0)[3]["gate_proj"] == "gate_proj"
    flat = {**cfg, "num_hidden_layers": 6, "global_attn_every_n_layers": 3}
    del flat["layer_types"]
    windows = [_kw(flat, i)["window"] for i in range(6)]
    assert windows == [4, 4, None, 4, 4, None]
    assert [_kw(flat, i)["use_rope"] for i in range(6)] == [
        True,
        True,
        False,
        True,
        True,
        False,
    ]
    with pytest.raises(ValueError, match="global_attn_every_n_layers"):
        layer_settings({**_config("arcee"), "global_attn_every_n_layers": 2})


def test_ministral3_scales_its_queries_by_position():
    """Ministral 3's llama_4_scaling_beta: every query times 1 + b ln(1 +
    floor(p / M)) after RoPE (Llama 4's temperature, counted from p).
    Without it the layer misses HF's by far more than rounding."""
    path = FAMILY_FIXTURES / "ministral3.npz"
    cfg = _config("ministral3")
    assert _kw(cfg)["query_temperature"] == (4, 0.1, 0)
    f = np.load(path)
    state = {
        k.split("param.")[1]: f[k] for k in f.files if "layer0.param" in k
    }
    layer = attention_from_hf(cfg, 0, state)
    assert np.abs(layer.forward(f["x"]) - f["layer0.out"]).max() < 1e-12
    plain = dict(cfg, rope_parameters=dict(cfg["rope_parameters"]))
    del plain["rope_parameters"]["llama_4_scaling_beta"]
    off = attention_from_hf(plain, 0, state).forward(f["x"])
    assert np.abs(off - f["layer0.out"]).max() > 1e-3


@pytest.mark.parametrize(
    "name,reads",
    [("arcee", False), ("cohere", False), ("olmoe", False), ("phi", True)],
)
def test_a_partial_rotation_only_where_the_family_reads_it(name, reads):
    """transformers' rotary embedding of Llama-like families turns every
    feature whatever partial_rotary_factor says (their inv_freq keeps
    head_dim / 2 entries with 0.5 written): refused there, read where
    the family's class reads it (Phi)."""
    cfg = _config(name)
    rope = dict(cfg.get("rope_parameters") or {"rope_type": "default"})
    rope["partial_rotary_factor"] = 0.5
    cfg = {**cfg, "rope_parameters": rope}
    if reads:
        assert _kw(cfg)["rotary_dim"] == 8  # of head_dim 16
    else:
        with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
            layer_settings(cfg, 0)
