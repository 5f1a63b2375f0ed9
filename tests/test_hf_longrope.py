"""LongRoPE (rope_type "longrope"; Phi-3's "su" and "yarn"): one factor
per rotated pair, the short list up to the trained length and the long
one past it, chosen at every call from its last position, and the
cos/sin scaled by sqrt(1 + ln s / ln L). Against transformers 5.24.0's
Phi-3 (tests/fixtures/phi3_longrope*.npz), gradient-checked in float64.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf, fixture_errors
from attn_np.hf.families import layer_settings
from attn_np.instruments.gradcheck import TOLERANCE
from attn_np.refinements import RefinedAttention
from attn_np.rope import rope_frequencies
from attn_np.rope_scaling import read_rope_scaling, scaled_frequencies

FIXTURES = Path(__file__).parent / "fixtures"
SHORT = [1.0, 1.1, 1.3, 1.6]
LONG = [1.0, 2.0, 4.0, 8.0]


def _scaling(**kw):
    return {
        "rope_type": "longrope",
        "short_factor": SHORT,
        "long_factor": LONG,
        "original_max_position_embeddings": 6,
        **kw,
    }


def _config(name):
    f = np.load(FIXTURES / f"{name}.npz")
    return f, json.loads(str(f["config"]))


@pytest.mark.parametrize("name", ["phi3_longrope", "phi3_longrope_short"])
def test_phi3_longrope_matches_hf(name):
    errors = fixture_errors(FIXTURES / f"{name}.npz", layer_idx=0)
    assert {"forward", "grad x", "decode", "grad qkv_proj.weight"} <= set(
        errors
    )
    assert max(errors.values()) < 1e-10, errors


def test_the_decode_switches_lists_as_hf_does():
    """Trained length 6: the whole input (9 positions) takes the long
    factors; the decode's chunks of positions 0-4 and 5 the short ones,
    6 and 7-8 the long, with the short keys still in the cache. HF's
    decode differs from its forward, and ours follows it."""
    f, _ = _config("phi3_longrope")
    assert np.abs(f["layer0.decode.out"] - f["layer0.out"]).max() > 0.1
    assert json.loads(str(f["meta"]))["chunks"] == [5, 1, 1, 2]


def test_frequencies_and_factor():
    theta = rope_frequencies(8, base=100.0)
    s = _scaling()
    for n, lam in ((None, SHORT), (6, SHORT), (7, LONG)):
        got, m = scaled_frequencies(
            8,
            base=100.0,
            rope_scaling=s,
            seq_len=n,
            max_position_embeddings=60,
        )
        np.testing.assert_allclose(got, theta / np.array(lam), rtol=1e-15)
        assert m == pytest.approx(math.sqrt(1 + math.log(10) / math.log(6)))
    _, m = scaled_frequencies(8, rope_scaling=_scaling(attention_factor=0.5))
    assert m == 0.5
    _, m = scaled_frequencies(8, rope_scaling=_scaling(factor=1.0))
    assert m == 1.0


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"short_factor": None}, "needs the key 'short_factor'"),
        ({"long_factor": "1, 2"}, "long_factor must be a list"),
        ({"short_factor": [1.0, -1.0, 1, 1]}, r"short_factor\[1\]"),
        ({"beta_fast": 32.0}, "'beta_fast' is not used"),
        ({"factor": None}, "needs 'factor' or 'attention_factor'"),
    ],
)
def test_bad_scaling_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        read_rope_scaling(_scaling(**{"factor": 2.0, **bad}))


def test_factor_lists_match_the_pairs():
    s = _scaling(factor=4.0)
    with pytest.raises(
        ValueError, match=r"short_factor must hold one .*\(8\)"
    ):
        scaled_frequencies(16, rope_scaling=s)


@pytest.mark.parametrize("n_kv", [1, 2])
def test_longrope_layer_gradients(n_kv):
    """The rotation's backward turns back by the same (long) table."""
    layer = RefinedAttention(
        8, 2, n_kv, 8, seed=1, rope_scaling=_scaling(factor=8.0)
    )
    x = np.random.default_rng(5).standard_normal((2, 7, 8))  # past 6
    errs = check_layer_gradients(layer, x, seed=2)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_phi3_reads_its_spellings():
    """su, yarn and longrope are one; the top-level trained length wins
    over the dict's (4096 when absent), as Phi3Config's."""
    _, cfg = _config("phi3_longrope")
    params = cfg["rope_parameters"]
    for kind in ("su", "yarn", "longrope"):
        got = {**cfg, "rope_parameters": {**params, "rope_type": kind}}
        del got["rope_parameters"]["type"]
        s = layer_settings(got, 0)[2]["rope_scaling"]
        assert s["rope_type"] == "longrope"
        assert s["original_max_position_embeddings"] == 6
    two = {**cfg, "rope_parameters": {**params, "rope_type": "longrope"}}
    two["rope_parameters"]["original_max_position_embeddings"] = 32
    s = layer_settings(two, 0)[2]["rope_scaling"]
    assert s["original_max_position_embeddings"] == 6
    del two["original_max_position_embeddings"]
    s = layer_settings(two, 0)[2]["rope_scaling"]
    assert s["original_max_position_embeddings"] == 4096
    mm = {**cfg, "model_type": "phi4_multimodal"}
    assert (
        layer_settings(mm, 0)[2]["rope_scaling"]
        == layer_settings(cfg, 0)[2]["rope_scaling"]
    )


def test_refusals_name_what_is_missing():
    f, cfg = _config("phi3_longrope")
    params = {k: v for k, v in cfg["rope_parameters"].items() if k != "type"}
    linear = {**cfg, "rope_parameters": {**params, "rope_type": "linear"}}
    with pytest.raises(ValueError, match="rope_type 'linear' is not read"):
        layer_settings(linear, 0)
    short = {**cfg, "rope_parameters": {**params, "short_factor": [1.0]}}
    with pytest.raises(ValueError, match="short_factor must hold one"):
        layer_settings(short, 0)
    llama = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "rope_parameters": {**params, "rope_theta": 1e4},
    }
    with pytest.raises(ValueError, match="Phi-3's 'longrope'"):
        layer_settings(llama, 0)


def test_state_dict_round_trip():
    f, cfg = _config("phi3_longrope")
    pre = "layer0.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    layer = attention_from_hf(cfg, 0, state)
    assert layer.rope_scaling["rope_type"] == "longrope"
    back = layer.to_hf(layer.params)
    assert all(np.array_equal(back[k], a) for k, a in state.items())
