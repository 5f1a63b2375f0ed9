"""Issue 41: bad input to chapters 10-14 gets a clear error (a ValueError
or TypeError naming the argument, config key or state-dict entry): no
silent wrong number, no NaN, no leaked Python error."""

import json
from pathlib import Path

import numpy as np
import pytest

import attn_np
from attn_np.hf.build import attention_from_hf
from attn_np.hf.weights import gated_deltanet_from_hf
from attn_np.refinements import RefinedAttention, SoftCap

FIXTURES = Path(__file__).parent / "fixtures"
DATA = Path(__file__).parent / "data" / "hf_configs"


def fixture(name, i=0):
    f = np.load(FIXTURES / f"{name}.npz")
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return json.loads(str(f["config"])), state


def scout():
    """Llama 4 Scout's config.json as released, at small widths: the keys
    these tests read (layer_types, no_rope_layers, attention_chunk_size,
    the temperature) are the release's; the widths only size the random
    weights, which at Scout's 5,120 took most of these tests' time."""
    cfg = json.loads((DATA / "llama4_scout_17b_16e.json").read_text())
    cfg["text_config"].update(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    return cfg


# ------------------------------------------------ silently wrong: configs
FLAGS = [
    ("falcon_alibi", "alibi"),
    ("falcon_alibi", "bias"),
    ("falcon_mqa", "multi_query"),
    ("falcon_new", "new_decoder_architecture"),
    ("llama", "attention_bias"),
    ("llama4", "use_qk_norm"),
    ("llama4", "attn_temperature_tuning"),
    ("deepseek_v3", "rope_interleave"),
]


@pytest.mark.parametrize("name,key", FLAGS)
def test_string_false_is_not_true(name, key):
    cfg, _ = fixture(name)
    text = cfg.get("text_config", cfg)
    text[key] = "false"
    with pytest.raises(ValueError, match=key):
        attention_from_hf(cfg)


def test_llama4_as_released_is_chunked_on_its_rope_layers():
    cfg = scout()
    for i in range(4):
        layer = attention_from_hf(cfg, i)
        assert layer.use_rope == (i != 3)
        assert layer.chunk == (8192 if i != 3 else None)


def test_llama4_empty_no_rope_layers_keeps_the_nope_layer():
    cfg = scout()
    cfg["text_config"].pop("attention_chunk_size")
    cfg["text_config"]["layer_types"] = ["full_attention"] * 48
    layer = attention_from_hf(cfg, 3)
    assert not layer.use_rope


def test_llama4_defaults_floor_and_attn_scale():
    layer = attention_from_hf(scout(), 3)
    assert layer.query_temperature == (8192.0, 0.1, 1)


@pytest.mark.parametrize(
    "flags", [[1, 1, 1], [1] * 49, ["1"] * 48, [True] * 48, [2] * 48]
)
def test_no_rope_layers_of_wrong_length_or_kind(flags):
    cfg = scout()
    cfg["text_config"]["no_rope_layers"] = flags
    with pytest.raises(ValueError, match="no_rope_layers"):
        attention_from_hf(cfg, 0)


def test_bidirectional_is_built_for_gemma3_only():
    cfg, _ = fixture("gemma3")
    cfg["use_bidirectional_attention"] = True
    layer = attention_from_hf(cfg)  # EmbeddingGemma: an encoder layer
    assert layer.bidirectional and layer.symmetric_window == 3
    with pytest.raises(ValueError, match="no cache"):
        layer.new_cache()
    with pytest.raises(ValueError, match="whole sequence"):
        layer.forward(np.zeros((1, 3, 64)), causal=False)
    cfg, _ = fixture("llama")
    cfg["use_bidirectional_attention"] = True
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        attention_from_hf(cfg)


@pytest.mark.parametrize(
    "types",
    [
        ["full_attention"],
        ["full_attention"] * 3,
        ["full_attention", 7],
        ["full_attention", "flash"],
        "full_attention",
    ],
)
def test_layer_types_of_wrong_length_or_kind(types):
    cfg, _ = fixture("qwen2")
    cfg["num_hidden_layers"] = 2
    cfg["layer_types"] = types
    with pytest.raises(ValueError, match="layer_types"):
        attention_from_hf(cfg, 0)


def test_a_sliding_layer_needs_a_window():
    cfg, _ = fixture("gemma2")
    cfg["sliding_window"] = None
    cfg["layer_types"] = ["sliding_attention"] * cfg["num_hidden_layers"]
    with pytest.raises(ValueError, match="sliding_window"):
        attention_from_hf(cfg, 0)


def test_qwen3_next_without_layer_types_builds_its_linear_layers():
    cfg, _ = fixture("qwen3_next")
    cfg.pop("layer_types", None)
    cfg["num_hidden_layers"] = 4
    assert isinstance(attention_from_hf(cfg, 0), attn_np.GatedDeltaNet)


# ------------------------------------------------ silently wrong: weights
@pytest.mark.parametrize(
    "name,entry",
    [
        ("deepseek_v2", "kv_b_proj.weight"),
        ("deepseek_v3", "q_b_proj.weight"),
        ("deepseek_v3", "kv_b_proj.weight"),
    ],
)
def test_mla_transposed_fused_weight_is_refused(name, entry):
    cfg, state = fixture(name)
    a = state[entry]
    assert a.shape[0] != a.shape[1]
    state[entry] = np.ascontiguousarray(a.T)
    with pytest.raises(ValueError, match=entry.replace(".", r"\.")):
        attention_from_hf(cfg, 0, state)


def test_gated_deltanet_loader_refuses_nan_and_extra_keys():
    cfg, state = fixture("qwen3_next", 0)
    bad = dict(state, **{"A_log": state["A_log"] * np.nan})
    with pytest.raises(ValueError, match="A_log"):
        gated_deltanet_from_hf(cfg, bad)
    extra = dict(state, extra_thing=np.zeros(3))
    with pytest.raises(ValueError, match="extra_thing"):
        gated_deltanet_from_hf(cfg, extra)
    strings = dict(state, **{"A_log": state["A_log"].astype(str)})
    with pytest.raises(TypeError, match="A_log"):
        gated_deltanet_from_hf(cfg, strings)


# ------------------------------------------------ valid input refused
@pytest.mark.parametrize(
    "name,key,value",
    [
        ("deepseek_v3", "auto_map", {"AutoConfig": "x.y"}),
        ("llama4", "for_llm_compressor", False),
        ("qwen3_next", "full_attention_interval", 2),
    ],
)
def test_harmless_keys_are_read(name, key, value):
    cfg, _ = fixture(name)
    cfg.get("text_config", cfg)[key] = value
    attention_from_hf(cfg, 1 if name == "qwen3_next" else 0)


def test_numpy_layer_idx():
    cfg, _ = fixture("llama")
    attention_from_hf(cfg, np.int64(0))
    with pytest.raises(TypeError, match="layer_idx"):
        attention_from_hf(cfg, 0.0)


def test_dynamic_ntk_is_refused_saying_why():
    cfg, _ = fixture("llama")
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0}
    with pytest.raises(ValueError, match="dynamic.*current length"):
        attention_from_hf(cfg)


# ------------------------------------------------ leaked errors: HF
@pytest.mark.parametrize("value", [0, -1.0, "224", True, float("inf")])
def test_query_pre_attn_scalar_is_checked(value):
    cfg, _ = fixture("gemma2")
    cfg["query_pre_attn_scalar"] = value
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        attention_from_hf(cfg)


@pytest.mark.parametrize(
    "key",
    ["rms_norm_eps", "attn_logit_softcapping", "query_pre_attn_scalar"],
)
def test_numeric_strings_are_not_numbers(key):
    cfg, _ = fixture("gemma2")
    cfg[key] = "0.5"
    with pytest.raises(ValueError, match=key):
        attention_from_hf(cfg)


@pytest.mark.parametrize(
    "name,entry",
    [
        ("falcon_new", "query_key_value.weight"),
        ("falcon_mqa", "query_key_value.weight"),
        ("qwen3_next", "q_proj.weight"),
        ("llama", "k_proj.weight"),
    ],
)
def test_fused_and_plain_shape_errors_name_the_hf_entry(name, entry):
    cfg, state = fixture(name, 1 if name == "qwen3_next" else 0)
    state[entry] = state[entry][:-1]
    with pytest.raises(ValueError, match=entry.replace(".", r"\.")):
        attention_from_hf(cfg, 1 if name == "qwen3_next" else 0, state)


def test_state_dict_of_strings_is_refused():
    cfg, state = fixture("llama")
    state["k_proj.weight"] = state["k_proj.weight"].astype(str)
    with pytest.raises(TypeError, match=r"k_proj\.weight"):
        attention_from_hf(cfg, 0, state)


# ------------------------------------------------ layer constructors
R = RefinedAttention
X = np.random.default_rng(0).normal(size=(1, 12, 16))


def test_post_rope_qk_norm_without_rope_base_is_applied():
    kw = dict(qk_norm="head", qk_norm_after_rope=True, qk_norm_learned=False)
    a = R(16, 4, rope_base=None, **kw).forward(X)
    b = R(16, 4, use_rope=False, **kw).forward(X)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    assert np.abs(a - R(16, 4, rope_base=None).forward(X)).max() > 1e-3


@pytest.mark.parametrize(
    "kw,err,match",
    [
        (dict(biases="qk"), TypeError, "biases"),
        (dict(biases=("q", "q")), ValueError, "biases"),
        (dict(chunk=4, window=3), ValueError, "window.*chunk"),
        (dict(n_heads="4"), ValueError, "n_heads"),
        (dict(head_dim="4"), ValueError, "head_dim"),
        (dict(qk_norm_offset="1"), ValueError, "qk_norm_offset"),
        (dict(score_mods=3), TypeError, "score_mods"),
        (dict(query_temperature=(2.0, "a")), ValueError, "attn_scale"),
    ],
)
def test_refined_attention_constructor(kw, err, match):
    args = dict(d_model=16, n_heads=4)
    args.update(kw)
    with pytest.raises(err, match=match):
        R(**args)


# ------------------------------------------------ kernels: overflow, NaN
def test_softcap_does_not_hide_score_overflow():
    layer = R(16, 4, score_mods=(SoftCap(30.0),))
    with pytest.raises(ValueError, match="overflow"):
        layer.forward(X * 1e200)


def _norms():
    from attn_np.linear.gates import l2norm_forward
    from attn_np.norms import qk_norm_forward
    from attn_np.sparse import layernorm_forward

    one, zero = np.ones(8), np.zeros(8)
    return {
        "l2norm": lambda x, **k: l2norm_forward(x, **k),
        "layernorm": lambda x, **k: layernorm_forward(x, one, zero, **k),
        "qk_norm": lambda x, **k: qk_norm_forward(x, **k),
    }


@pytest.mark.parametrize("name", ["l2norm", "layernorm", "qk_norm"])
def test_norms_refuse_overflow_nan_and_bad_eps(name):
    f = _norms()[name]
    x = np.random.default_rng(1).normal(size=(3, 8))
    with pytest.raises(ValueError, match="overflow"):
        f(x * 1e160)
    with pytest.raises(ValueError, match="finite"):
        f(np.where(x > 0, np.nan, x))
    for eps in (-1e-6, float("nan"), "1e-6"):
        with pytest.raises(ValueError, match="eps"):
            f(x, eps=eps)
    with pytest.raises(ValueError, match="eps"):
        f(np.zeros((2, 8)), eps=0.0)


def test_gated_deltanet_overflow_is_not_zero():
    layer = attn_np.GatedDeltaNet(8, 2, 2, d_k=4, d_v=4)
    x = np.random.default_rng(2).normal(size=(1, 5, 8))
    with pytest.raises(ValueError, match="overflow"):
        layer.forward(x * 1e160)


# ------------------------------------------------ kernels' domains, NaN
from attn_np.linear.attention import linear_attention_forward  # noqa: E402
from attn_np.linear.chunked import gated_delta_chunked_forward  # noqa: E402
from attn_np.linear.recurrent import (  # noqa: E402
    gated_delta_recurrent_forward,
)
from attn_np.masks import chunked_mask, position_mask  # noqa: E402

RNG = np.random.default_rng(3)
Q, K, V = (RNG.normal(size=(2, 5, 4)) for _ in range(3))


@pytest.mark.parametrize("which", ["q", "k"])
def test_linear_attention_underflow_is_refused_not_nan(which):
    q, k = (Q - 1000.0, K) if which == "q" else (Q, K - 1000.0)
    with pytest.raises(ValueError, match="underflow"):
        linear_attention_forward(q, k, V)


def test_linear_attention_needs_a_feature():
    e = np.zeros((2, 5, 0))
    with pytest.raises(ValueError, match="d_k"):
        linear_attention_forward(e, e, V)


@pytest.mark.parametrize(
    "forward", [gated_delta_recurrent_forward, gated_delta_chunked_forward]
)
def test_delta_rule_refuses_decays_and_strengths_out_of_domain(forward):
    g, beta = -np.abs(RNG.normal(size=(2, 5))), np.full((2, 5), 0.5)
    forward(Q, K, V, g, beta)
    with pytest.raises(ValueError, match="g must be log decays"):
        forward(Q, K, V, -g, beta)
    for b in (beta - 1.0, beta + 3.0):
        with pytest.raises(ValueError, match="beta"):
            forward(Q, K, V, g, b)


def test_a_chunk_longer_than_the_input_is_one_chunk():
    g, beta = -np.abs(RNG.normal(size=(2, 5))), np.full((2, 5), 0.5)
    a, _ = gated_delta_chunked_forward(Q, K, V, g, beta, chunk_size=10**5)
    b, _ = gated_delta_recurrent_forward(Q, K, V, g, beta)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    p = np.arange(4)
    np.testing.assert_array_equal(
        chunked_mask(p, p, 10**30), position_mask(p, p)
    )


def test_unsigned_positions_do_not_wrap():
    p = np.arange(6)
    want = position_mask(p, p, window=2)
    got = position_mask(p.astype(np.uint32), p.astype(np.uint64), window=2)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------ caches
def test_state_cache_fed_by_a_second_layer_is_noticed():
    a = attn_np.GatedDeltaNet(8, 2, 2, d_k=4, d_v=4, seed=0)
    b = attn_np.GatedDeltaNet(8, 2, 2, d_k=4, d_v=4, seed=1)
    x = RNG.normal(size=(1, 3, 8))
    cache = a.new_cache()
    a.forward(x, kv_cache=cache)
    with pytest.raises(ValueError, match="another layer"):
        b.forward(x, kv_cache=cache)
    copy_of_a = attn_np.GatedDeltaNet(8, 2, 2, d_k=4, d_v=4, seed=0)
    copy_of_a.forward(x, kv_cache=cache)


def test_indexed_latent_cache_fed_by_a_second_layer_is_noticed():
    kw = dict(d_latent_q=8, index_n_heads=2, index_head_dim=8, index_topk=4)
    a = attn_np.SparseLatentAttention(16, 2, 8, 8, 4, seed=0, **kw)
    b = attn_np.SparseLatentAttention(16, 2, 8, 8, 4, seed=1, **kw)
    x = RNG.normal(size=(1, 3, 16))
    cache = a.new_cache()
    a.forward(x, kv_cache=cache)
    with pytest.raises(ValueError, match="another layer"):
        b.forward(x, kv_cache=cache)


# ------------------------------------------------ leaked errors: kernels
from attn_np.linear.attention import linear_attention_backward  # noqa: E402
from attn_np.linear.chunked import gated_delta_chunked_backward  # noqa: E402
from attn_np.linear.recurrent import (  # noqa: E402
    gated_delta_recurrent_backward,
)
from attn_np.norms import qk_norm_backward, rmsnorm_backward  # noqa: E402
from attn_np.refinements import (  # noqa: E402
    gate_backward,
    linear_backward,
    query_temperature_backward,
)
from attn_np.sparse import (  # noqa: E402
    layernorm_backward,
    sparse_mqa_backward,
    sparse_mqa_forward,
)
from attn_np.training.losses import cross_entropy_forward  # noqa: E402

BACKWARDS = [
    linear_attention_backward,
    gated_delta_chunked_backward,
    gated_delta_recurrent_backward,
    qk_norm_backward,
    rmsnorm_backward,
    gate_backward,
    linear_backward,
    query_temperature_backward,
    layernorm_backward,
    sparse_mqa_backward,
]


@pytest.mark.parametrize("backward", BACKWARDS, ids=lambda f: f.__name__)
def test_backward_given_the_wrong_cache_names_it(backward):
    _, wrong = linear_attention_forward(Q, K, V)
    if backward is linear_attention_backward:
        _, wrong = gated_delta_recurrent_forward(
            Q, K, V, np.zeros((2, 5)), np.ones((2, 5))
        )
    with pytest.raises(TypeError, match="cache must be what"):
        backward(np.ones((2, 5, 4)), wrong)


def test_sparse_mqa_forward_checks_its_arguments():
    q = RNG.normal(size=(1, 3, 2, 6))
    rows = RNG.normal(size=(1, 4, 6))
    idx = np.array([[[0, 1], [1, 2], [2, 3]]])
    valid = np.ones(idx.shape, dtype=bool)
    sparse_mqa_forward(q, rows, idx, valid, d_v=4, scale=0.5)
    cases = [
        (dict(q=q.astype(int)), TypeError, "q"),
        (dict(q=q * np.nan), ValueError, "q"),
        (dict(rows=rows * np.inf), ValueError, "rows"),
        (dict(idx=idx + 4), ValueError, "idx"),
        (dict(idx=idx.astype(float)), TypeError, "idx"),
        (dict(valid=valid.astype(int)), TypeError, "valid"),
        (dict(d_v=7), ValueError, "d_v"),
        (dict(d_v=0), ValueError, "d_v"),
        (dict(scale=-1.0), ValueError, "scale"),
    ]
    for change, err, match in cases:
        kw = dict(q=q, rows=rows, idx=idx, valid=valid, d_v=4, scale=0.5)
        kw.update(change)
        with pytest.raises(err, match=match):
            sparse_mqa_forward(**kw)


def test_cross_entropy_refuses_nan_logits():
    z = RNG.normal(size=(3, 5))
    z[1, 2] = np.nan
    with pytest.raises(ValueError, match="logits"):
        cross_entropy_forward(z, np.array([0, 1, 2]))


def test_kv_calculator_refuses_a_rope_factor_that_is_not_a_number(tmp_path):
    import subprocess
    import sys

    from attn_np.costs import from_hf_config

    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "rope_scaling": {"rope_type": "linear", "factor": "4"},
    }
    with pytest.raises(ValueError, match="rope_scaling.factor"):
        from_hf_config(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attn_np.memory",
            str(path),
            "--seq-len",
            "9",
        ],
        capture_output=True,
        text=True,
    )
    assert "rope_scaling.factor must be a number" in run.stderr + run.stdout
    assert "Traceback" not in run.stderr


# ------------------------------------------------ chapter 14's loader
def test_gguf_metadata_sizes_are_checked(tmp_path):
    import gguf

    from attn_np.pretrained.gguf_file import GGUFCheckpoint

    p = tmp_path / "zero_heads.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="head_count"):
        GGUFCheckpoint(p).config()


# ------------------------------------------------ every public kernel
def _public_kernels():
    from attn_np.linear.conv import causal_conv_forward
    from attn_np.linear.gates import l2norm_forward
    from attn_np.norms import qk_norm_forward, rmsnorm_forward
    from attn_np.refinements import (
        gate_forward,
        linear_forward,
        query_temperature_forward,
        softcap_forward,
    )
    from attn_np.sparse import layernorm_forward

    r = np.random.default_rng(0)

    def n(*s):
        return r.normal(size=s)

    q, g, beta = n(2, 5, 4), -np.abs(n(2, 5)), np.full((2, 5), 0.5)
    delta = dict(q=q, k=n(2, 5, 4), v=n(2, 5, 3), g=g, beta=beta)
    return [
        (linear_attention_forward, dict(q=q, k=n(2, 5, 4), v=n(2, 5, 3))),
        (gated_delta_recurrent_forward, delta),
        (gated_delta_chunked_forward, delta),
        (softcap_forward, dict(s=n(3, 4), cap=5.0)),
        (gate_forward, dict(o=n(3, 4), g=n(3, 4))),
        (linear_forward, dict(x=n(3, 4), W=n(4, 2), b=n(2))),
        (query_temperature_forward, dict(q=n(3, 4), positions=np.arange(3))),
        (qk_norm_forward, dict(t=n(3, 4), w=n(4))),
        (rmsnorm_forward, dict(x=n(3, 4), g=n(4))),
        (l2norm_forward, dict(x=n(3, 4))),
        (causal_conv_forward, dict(x=n(1, 5, 3), w=n(2, 3))),
        (layernorm_forward, dict(x=n(3, 4), g=n(4), b=n(4))),
        (attn_np.top_k_mask, dict(scores=n(3, 5), k=2)),
        (
            attn_np.block_top_n_mask,
            dict(q=n(1, 8, 4), k=n(1, 8, 4), block_size=2, n_blocks=2),
        ),
        (
            attn_np.cross_entropy_forward,
            dict(logits=n(3, 5), targets=[0, 1, 2]),
        ),
    ]


KERNEL_ARGS = [
    (f, key)
    for f, kw in _public_kernels()
    for key, v in kw.items()
    if isinstance(v, np.ndarray) and v.dtype.kind == "f"
]


@pytest.mark.parametrize(
    "f,key", KERNEL_ARGS, ids=[f"{f.__name__}-{k}" for f, k in KERNEL_ARGS]
)
def test_every_public_kernel_refuses_nan_and_integer_arrays(f, key):
    kw = dict(_public_kernels())[f]
    f(**kw)  # valid
    val = kw[key]
    nan = val.copy()
    nan.flat[0] = np.nan
    with pytest.raises(ValueError, match=key):
        f(**{**kw, key: nan})
    with pytest.raises(TypeError, match=key):
        f(**{**kw, key: np.round(val).astype(np.int64)})


LAYERS = [
    lambda: RefinedAttention(16, 4, 2, score_mods=(SoftCap(20.0),)),
    lambda: attn_np.GatedDeltaNet(16, 2, 2, d_k=4, d_v=4),
    lambda: attn_np.KimiDeltaAttention(16, 2, d_k=4, d_v=4),
    lambda: attn_np.LongContextAttention(16, 4, 2, rope_base=1e4),
    lambda: attn_np.SparseLatentAttention(
        16,
        2,
        8,
        8,
        4,
        d_latent_q=8,
        index_n_heads=2,
        index_head_dim=8,
        index_topk=4,
    ),
]


@pytest.mark.parametrize("make", LAYERS)
def test_every_new_layer_refuses_nan_and_integer_input(make):
    layer = make()
    x = np.random.default_rng(4).normal(size=(1, 6, 16))
    layer.forward(x)
    x[0, 2, 3] = np.nan
    with pytest.raises(ValueError, match="x"):
        layer.forward(x)
    with pytest.raises(TypeError, match="x"):
        layer.forward(np.ones((1, 6, 16), dtype=np.int64))


# ------------------------------------------------ property tests
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(
    heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (2, 1)]),
    biases=st.lists(st.sampled_from("qkvo"), unique=True, max_size=4),
    qk_norm=st.sampled_from([None, "head", "proj"]),
    gate=st.sampled_from([None, "elementwise", "headwise"]),
    local=st.sampled_from([None, ("window", 3), ("chunk", 3)]),
    use_rope=st.booleans(),
    rope_base=st.sampled_from([None, 10000.0]),
    L=st.integers(1, 9),
)
def test_refined_attention_options_property(
    heads, biases, qk_norm, gate, local, use_rope, rope_base, L
):
    h, kv = heads
    kw = dict(
        biases=tuple(biases),
        qk_norm=qk_norm,
        gate=gate,
        use_rope=use_rope,
        rope_base=rope_base,
    )
    if local is not None:
        kw[local[0]] = local[1]
    layer = RefinedAttention(16, h, kv, **kw)
    x = np.random.default_rng(L).normal(size=(2, L, 16))
    y = layer.forward(x)
    assert y.shape == x.shape and np.isfinite(y).all()
    # the same layer decoding token by token gives the same output
    cache, outs = layer.new_cache(), []
    for t in range(L):
        outs.append(layer.forward(x[:, t : t + 1], kv_cache=cache))
    np.testing.assert_allclose(np.concatenate(outs, 1), y, atol=1e-12)
    with pytest.raises(TypeError, match="biases"):
        RefinedAttention(16, h, kv, biases="".join(biases) or "q")
    with pytest.raises(ValueError, match="not both"):
        RefinedAttention(16, h, kv, window=2, chunk=2)


@given(
    T=st.integers(1, 12),
    chunk=st.one_of(st.integers(1, 16), st.just(10**5), st.just(10**30)),
    d_k=st.integers(1, 4),
    d_v=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_delta_rule_any_chunk_property(T, chunk, d_k, d_v, seed):
    r = np.random.default_rng(seed)
    x = dict(
        q=r.normal(size=(2, T, d_k)),
        k=r.normal(size=(2, T, d_k)) / np.sqrt(d_k),
        v=r.normal(size=(2, T, d_v)),
        g=-r.uniform(0, 2, size=(2, T)),
        beta=r.uniform(0, 1, size=(2, T)),
    )
    a, _ = gated_delta_recurrent_forward(**x)
    b, _ = gated_delta_chunked_forward(**x, chunk_size=chunk)
    np.testing.assert_allclose(a, b, atol=1e-10)


@given(
    n=st.integers(1, 6),
    types=st.lists(
        st.sampled_from(
            ["full_attention", "sliding_attention", "flash", 1, None]
        ),
        max_size=8,
    ),
)
def test_layer_types_property(n, types):
    cfg, _ = fixture("qwen2")
    cfg.update(num_hidden_layers=n, layer_types=types, sliding_window=4)
    cfg.pop("use_sliding_window", None)
    cfg.pop("max_window_layers", None)
    good = len(types) == n and all(
        t in ("full_attention", "sliding_attention") for t in types
    )
    if good:
        for i in range(n):
            layer = attention_from_hf(cfg, i)
            want = 4 if types[i] == "sliding_attention" else None
            assert layer.window == want
    else:
        with pytest.raises(ValueError, match="layer_types"):
            attention_from_hf(cfg, 0)


def test_llama4_attn_temperature_tuning_as_released():
    cfg = scout()
    cfg["text_config"]["attn_temperature_tuning"] = 4  # the released file
    assert attention_from_hf(cfg, 3).query_temperature == (8192.0, 0.1, 1)
    cfg["text_config"]["attn_temperature_tuning"] = False
    assert attention_from_hf(cfg, 3).query_temperature is None
