"""Bad input to the public functions of the costs, training and gradcheck
modules: a ValueError/TypeError naming the argument, or a correct finite
result. Property-based (hypothesis), and fast."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import costs
from attn_np.costs import ModelConfig, from_hf_config
from attn_np.instruments.gradcheck import (
    TOLERANCE,
    check_gradients,
    numerical_gradient,
    rel_error,
)
from attn_np.multihead import GroupedQueryAttention
from attn_np.training import (
    Adam,
    AssociativeRecall,
    Block,
    Embedding,
    FeedForward,
    Linear,
    RMSNorm,
    Transformer,
    clip_grad_norm,
    gelu_backward,
    linear_backward,
    linear_forward,
    lr_at,
)

FAST = settings(max_examples=25, deadline=None)
BAD_NUMBERS = [float("nan"), float("inf"), -float("inf"), 0.0, -1.0]
NOT_COUNTS = [0, -1, 2.5, True, "3", None, float("nan")]


# --- cause 3: the gradient check sees a NaN gradient ---------------------
@FAST
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1),
)
def test_rel_error_is_never_nan(values):
    a = np.array(values)
    err = rel_error(a, a[::-1])
    assert not math.isnan(err)
    if not np.isfinite(a).all():
        assert err == math.inf


def test_a_nan_returning_backward_fails_the_check():
    def forward(x, y):
        return x * y, (x, y)

    def backward(dout, cache):
        x, y = cache
        dx = dout * y
        return dx, np.full_like(x, np.nan)  # a broken dy

    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal(3), "y": rng.standard_normal(3)}
    errors = check_gradients(forward, backward, inputs)
    assert errors["x"] < TOLERANCE
    # the tests' idiom: max() skips a NaN that is not first; inf it keeps
    assert not max(errors.values()) < TOLERANCE


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"f": 3}, "f must be callable"),
        ({"x": [1.0, 2.0]}, "x must be a float64 ndarray"),
        ({"x": np.ones(2, np.float32)}, "float64"),
        ({"h": 0.0}, "h must be"),
        ({"h": float("nan")}, "h must be"),
        ({"dout": np.ones(3)}, "shape of dout"),
    ],
)
def test_numerical_gradient_checks_its_arguments(kwargs, match):
    x = np.ones(2)
    args = {"f": lambda: x * 2, "x": x, "dout": np.ones(2), "h": 1e-5}
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        numerical_gradient(args["f"], args["x"], args["dout"], args["h"])


# --- cause 12: backward before forward -----------------------------------
def small_layers():
    attn = GroupedQueryAttention(8, 2, 1, seed=0)
    return [
        Embedding(5, 4),
        Linear(3, 4),
        RMSNorm(4),
        FeedForward(4, 8),
        Block(attn, 16),
        Transformer(
            vocab_size=5,
            d_model=8,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            d_ff=16,
            max_len=4,
        ),
    ]


@pytest.mark.parametrize("layer", small_layers(), ids=type)
def test_backward_before_forward_is_a_runtime_error(layer):
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.ones((1, 2, 4)))


def test_a_cache_from_another_function_is_a_type_error():
    x, W, b = np.ones((2, 3)), np.ones((3, 4)), np.zeros(4)
    _, cache = linear_forward(x, W, b)
    with pytest.raises(TypeError, match="gelu_forward"):
        gelu_backward(np.ones((2, 4)), cache)
    with pytest.raises(TypeError, match="linear_forward"):
        linear_backward(np.ones((2, 4)), (x, W, b))


# --- cause 14: the optimiser, the schedule, the task ---------------------
@pytest.mark.parametrize("lr", BAD_NUMBERS + ["0.1", None])
def test_adam_refuses_a_learning_rate_it_cannot_use(lr):
    w = {"w": np.ones(3)}
    with pytest.raises(ValueError, match="lr"):
        Adam(w, lr=lr)
    opt = Adam(w)
    with pytest.raises(ValueError, match="lr"):
        opt.step({"w": np.ones(3)}, lr=lr if lr is not None else math.nan)


@FAST
@given(st.sampled_from([np.nan, np.inf, -np.inf]), st.integers(0, 2))
def test_adam_refuses_non_finite_gradients_and_changes_nothing(bad, i):
    w = {"a": np.ones(3), "b": np.ones(2)}
    opt = Adam(w)
    g = {"a": np.ones(3), "b": np.ones(2)}
    g["a"][i] = bad
    with pytest.raises(ValueError, match=r"grads\['a'\]"):
        opt.step(g)
    assert opt.t == 0 and np.all(w["a"] == 1) and np.all(w["b"] == 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"betas": (0.9,)}, "betas"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"eps": 0}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"params": {"w": [1.0]}}, r"params\['w'\]"),
        ({"params": [np.ones(2)]}, "params must be a dict"),
    ],
)
def test_adam_names_its_bad_argument(kwargs, match):
    args = {"params": {"w": np.ones(2)}, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        Adam(**args)


def test_adam_grads_of_the_wrong_kind():
    opt = Adam({"w": np.ones(2)})
    with pytest.raises(TypeError, match=r"grads\['w'\]"):
        opt.step({"w": [1.0, 2.0]})
    with pytest.raises(ValueError, match="missing"):
        opt.step({})


@pytest.mark.parametrize("max_norm", BAD_NUMBERS)
def test_clip_grad_norm_refuses_a_bad_max_norm(max_norm):
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm({"w": np.ones(2)}, max_norm)


def test_clip_grad_norm_refuses_non_finite_gradients():
    g = {"w": np.array([1.0, np.nan])}
    with pytest.raises(ValueError, match="NaN or inf"):
        clip_grad_norm(g, 1.0)
    big = {"w": np.array([1e300, 1e300])}  # the norm overflows to inf
    with pytest.raises(ValueError, match="NaN or inf"):
        clip_grad_norm(big, 1.0)


@FAST
@given(st.integers(1, 10**6), st.data())
def test_lr_at_is_finite_in_range(steps, data):
    step = data.draw(st.integers(0, steps - 1))
    warmup = data.draw(st.integers(0, steps))
    lr = lr_at(step, steps, 1e-3, warmup)
    assert 0 <= lr <= 1e-3 and math.isfinite(lr)


@pytest.mark.parametrize(
    "args, match",
    [
        ((5, 5, 1e-3, 1), "step < steps"),
        ((-1, 5, 1e-3, 1), "step"),
        ((0, 0, 1e-3, 0), "steps"),
        ((0, 5, 1e-3, 6), "warmup"),
        ((0, 5, float("nan"), 1), "lr"),
        ((0, 5, 1e-3, 2.5), "warmup"),
        ((True, 5, 1e-3, 1), "step"),
    ],
)
def test_lr_at_names_its_bad_argument(args, match):
    with pytest.raises(ValueError, match=match):
        lr_at(*args)


@pytest.mark.parametrize("eps", BAD_NUMBERS + ["1e-6", True])
def test_rmsnorm_eps(eps):
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=eps)


@pytest.mark.parametrize("bad", NOT_COUNTS)
@pytest.mark.parametrize("name", ["n_pairs", "n_queries", "n_keys"])
def test_recall_task_sizes(name, bad):
    with pytest.raises((ValueError, TypeError), match=name):
        AssociativeRecall(**{name: bad})


# --- the cost formulas ---------------------------------------------------
@pytest.mark.parametrize("bad", NOT_COUNTS)
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda v: costs.kv_cache_bytes("llama-3-8b", v), "seq_len"),
        (lambda v: costs.kv_cache_bytes("llama-3-8b", 8, v), "batch"),
        # 2.5 bytes is 20 bits, a cache a width can have: 0.3 is not
        (
            lambda v: costs.kv_bytes_per_token(
                "llama-3-8b", 0.3 if v == 2.5 else v
            ),
            "bytes_per",
        ),
        (lambda v: costs.state_bytes("llama-3-8b", v), "batch"),
        (lambda v: costs.indexer_cache_bytes("llama-3-8b", 8, v), "batch"),
        (lambda v: costs.max_context("llama-3-8b", 10**9, v), "batch"),
    ],
)
def test_cost_formulas_name_the_argument(call, name, bad):
    if bad == 0 and name == "seq_len":
        assert call(bad) == 0  # an empty cache is a correct answer
        return
    with pytest.raises((ValueError, TypeError), match=name):
        call(bad)


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf"), "8"])
def test_max_context_budget(budget):
    with pytest.raises(ValueError, match="memory_bytes"):
        costs.max_context("llama-3-8b", budget)


@FAST
@given(st.integers(1, 10**400))
def test_max_context_is_exact_for_any_budget(budget):
    per_token = costs.kv_bytes_per_token("llama-3-8b")
    assert costs.max_context("llama-3-8b", budget) == budget // per_token


@FAST
@given(st.integers(1, 10**40), st.integers(0, 10**40))
def test_huge_layer_counts_in_closed_form(n_layers, seq_len):
    cfg = ModelConfig(
        "huge", n_layers, 8, 2, 64, 512, None, "test", "", sliding_window=7
    )
    assert costs.cached_positions(cfg, seq_len) == n_layers * min(seq_len, 7)
    assert cfg.n_window_layers == n_layers


def test_layer_windows_refuses_a_huge_list():
    cfg = ModelConfig("huge", 10**9, 8, 2, 64, 512, None, "test", "")
    with pytest.raises(ValueError, match="n_layers"):
        _ = cfg.layer_windows


LLAMA = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


@FAST
@given(
    st.sampled_from(
        ["multi_query", "new_decoder_architecture", "use_sliding_window"]
    ),
    st.one_of(
        st.text(max_size=5), st.integers(), st.floats(), st.lists(st.none())
    ),
)
def test_flags_must_be_json_booleans(key, value):
    with pytest.raises(ValueError, match=key):
        from_hf_config({**LLAMA, key: value})


@FAST
@given(
    st.sampled_from(sorted(LLAMA)),
    st.one_of(
        st.floats(allow_nan=True),
        st.integers(max_value=0),
        st.text(max_size=3),
        st.booleans(),
    ),
)
def test_config_counts_must_be_positive_integers(key, value):
    with pytest.raises(ValueError, match=key):
        from_hf_config({**LLAMA, key: value})


@FAST
@given(st.integers(10**5 + 1, 10**40))
def test_huge_num_hidden_layers_never_builds_a_list(n):
    config = {**LLAMA, "num_hidden_layers": n, "sliding_window": 8}
    config["sliding_window_pattern"] = 2
    with pytest.raises(ValueError, match="num_hidden_layers"):
        from_hf_config(config)
    # without a per-layer list the count is exact
    cfg = from_hf_config({**LLAMA, "num_hidden_layers": n})
    assert costs.kv_bytes_per_token(cfg) == n * 2 * 8 * 128 * 2


@pytest.mark.parametrize("flag", ["no", 1, None, np.nan])
def test_cost_flags_must_be_booleans(flag):
    dims = dict(d_model=64, n_heads=4)
    with pytest.raises(TypeError, match="fused"):
        costs.decode_step_cost(1, 16, **dims, fused=flag)
    latent = (64, 4, 16, 32, 8)
    with pytest.raises(TypeError, match="absorb"):
        costs.latent_decode_step_cost(1, 16, *latent, absorb=flag)


@pytest.mark.parametrize("rate", ["3", True, 0, float("nan"), -1.0])
def test_rates_refuse_strings_and_non_positive_numbers(rate):
    with pytest.raises(ValueError, match="bandwidth"):
        costs.ridge_point(1e12, rate)
    with pytest.raises(ValueError, match="peak_flops"):
        costs.attainable_flops(10.0, rate, 1e11)


@pytest.mark.parametrize("work", [-1, float("inf"), "5", None])
def test_roofline_time_refuses_negative_work(work):
    with pytest.raises(ValueError, match="flops"):
        costs.roofline_time(work, 0, 1e12, 1e11)
    with pytest.raises(ValueError, match="nbytes"):
        costs.roofline_time(0, work, 1e12, 1e11)


@pytest.mark.parametrize(
    "n, error",
    [
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("3", TypeError),
        (None, TypeError),
        (True, TypeError),
        (10**400, ValueError),
    ],
)
def test_format_bytes_refuses_what_it_cannot_print(n, error):
    from attn_np.instruments.plotting import format_bytes

    with pytest.raises(error, match="n "):
        format_bytes(n)


@FAST
@given(st.integers(0, 2**900))
def test_format_bytes_prints_any_size_it_takes(n):
    from attn_np.instruments.plotting import format_bytes

    text = format_bytes(n)
    assert "nan" not in text and "inf" not in text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rounds": 0}, "rounds"),
        ({"rounds": 2.5}, "rounds"),
        ({"rounds": True}, "rounds"),
        ({"fns": {"a": 3}}, "fns"),
        ({"fns": [lambda: 0]}, "fns"),
    ],
)
def test_best_times_names_its_bad_argument(kwargs, match):
    from attn_np.instruments.measure import best_times

    args = {"fns": {"a": lambda: 0}, "rounds": 1, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        best_times(args["fns"], rounds=args["rounds"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_tokens": 0}, "n_tokens"),
        ({"lag": 0}, "lag"),
        ({"seq_len": 3}, "seq_len must be longer than lag"),
        ({"p_marker": 1.5}, "p_marker"),
        ({"p_marker": float("nan")}, "p_marker"),
        ({"p_marker": "0.1"}, "p_marker"),
    ],
)
def test_marked_copy_names_its_bad_argument(kwargs, match):
    from attn_np import MarkedCopy

    with pytest.raises(ValueError, match=match):
        MarkedCopy(**kwargs)
