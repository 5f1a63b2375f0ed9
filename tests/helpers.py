"""Test doubles and fixture readers that several test files share (imported by name: pytest puts
tests/ on the path).

Written apart from attn_np on purpose: the tests check the library's seams against them, so they
must not be the library's own code (attn_np.refinements.SoftCap is chapter 10's)."""

import json
from pathlib import Path

import numpy as np


class SoftCap:
    """Gemma 2's logit soft-capping, s -> c tanh(s / c), as a score mod with its backward twin."""

    def __init__(self, cap):
        self.cap = cap

    def forward(self, s, ctx):
        t = np.tanh(s / self.cap)
        return self.cap * t, t

    def backward(self, ds, t):
        return ds * (1 - t * t)


FAMILY_FIXTURES = Path(__file__).parent / "fixtures" / "families"


def family_fixture(name, layer=0):
    """``(npz, config, state_dict)`` of layer ``layer`` of
    tests/fixtures/families/NAME.npz, as recorded from transformers."""
    f = np.load(FAMILY_FIXTURES / f"{name}.npz")
    cfg = json.loads(str(f["config"]))
    pre = f"layer{layer}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return f, cfg, state


def close(a, b, rtol=1e-12):
    """``a`` equals ``b`` to ``rtol`` of the larger of 1 and ``b``'s largest entry."""
    return np.abs(a - b).max() <= rtol * max(1.0, np.abs(b).max())


def check_linear_decode_state(f, layer):
    """A delta-rule layer (chapter 12) decoding the fixture's chunks: after the
    prefill, its state and its convolution's last inputs are the ones HF caches
    (HF keeps K inputs per channel, the first never read again); every chunk's
    output is HF's."""
    chunks = json.loads(str(f["meta"]))["chunks"]
    x, cache, outs, t = f["x"], layer.new_cache(), [], 0
    for n in chunks:
        outs.append(layer.forward(x[:, t : t + n], kv_cache=cache))
        t += n
        if t == chunks[0]:
            assert close(
                cache.state, f["layer0.decode.state.recurrent_state"]
            )
            conv = np.concatenate(cache.conv, axis=-1).transpose(0, 2, 1)
            assert close(conv, f["layer0.decode.state.conv_state"][..., 1:])
    assert close(np.concatenate(outs, axis=1), f["layer0.decode.out"])
