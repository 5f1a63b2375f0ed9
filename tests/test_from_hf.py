"""attention_from_hf against Hugging Face transformers' own modules.

The fixtures (tests/fixtures/*.npz, recorded in float64 with HF's float32
islands removed by scripts/record_hf_fixtures.py, transformers 5.24.0) hold
HF's config, the layer's weights, an input, HF's output, every gradient
and a chunked decode. Here NumPy alone rebuilds the layer from the config
and the state dict and compares.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import attn_np
from attn_np.from_hf import attention_from_hf

FIXTURES = Path(__file__).parent / "fixtures"
# float64 rounding: outputs are O(1); the worst seen is ~1e-14
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
    "olmo2": [0],
    "gpt_oss": [0, 1],
    "falcon_mqa": [0],
    "falcon_new": [0],
    "falcon_alibi": [0],
    "qwen3_next": [1],
    "llama4": [0, 1],
}


def load(name):
    f = np.load(FIXTURES / f"{name}.npz")
    return f, json.loads(str(f["config"])), json.loads(str(f["meta"]))


def state(f, i):
    pre = f"layer{i}.param."
    return {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}


def worst(a, b):
    """Largest error relative to the reference's largest entry."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


CASES = [(name, i) for name, layers in BUILT.items() for i in layers]


@pytest.mark.parametrize("name,i", CASES)
def test_forward_gradients_and_decode_match_hf(name, i):
    f, config, meta = load(name)
    assert meta["transformers"] == "5.24.0"
    layer = attention_from_hf(config, layer_idx=i, state_dict=state(f, i))
    x, dy = f["x"], f["dy"]
    y = layer.forward(x)
    errors = {"forward": worst(y, f[f"layer{i}.out"])}
    dx = layer.backward(dy)
    errors["grad x"] = worst(dx, f[f"layer{i}.grad.x"])
    grads = layer.to_hf(layer.grads)
    assert set(grads) == set(state(f, i))
    for hf_name, g in grads.items():
        errors[f"grad {hf_name}"] = worst(g, f[f"layer{i}.grad.{hf_name}"])
    cache, outs, start = layer.new_cache(), [], 0
    for c in meta["chunks"]:
        outs.append(layer.forward(x[:, start : start + c], kv_cache=cache))
        start += c
    errors["decode"] = worst(
        np.concatenate(outs, axis=1), f[f"layer{i}.decode.out"]
    )
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad


def test_every_fixture_names_its_transformers_version():
    for path in sorted(FIXTURES.glob("*.npz")):
        meta = json.loads(str(np.load(path)["meta"]))
        assert meta["transformers"] == "5.24.0", path.name
        assert meta["torch"].startswith("2.13.0"), path.name


def test_the_export():
    assert attn_np.attention_from_hf is attention_from_hf
