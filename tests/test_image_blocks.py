"""Gemma 3's image tokens as a mask function (chapter 16): causal text,
each run of image tokens bidirectional, against Hugging Face's own masks
and the attention outputs and gradients they give (the fixture
gemma3_image_blocks.npz, recorded in float64 by
scripts/record_image_block_fixtures.py, transformers 5.24.0)."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import GroupedQueryAttention
from attn_np.hf.build import attention_from_hf
from attn_np.masks import (
    and_masks,
    causal_mod,
    create_mask,
    image_block_ids,
    image_block_mod,
    or_masks,
    window_mod,
)

F = np.load(Path(__file__).parent / "fixtures" / "gemma3_image_blocks.npz")
TT = F["token_type_ids"]
B, L = TT.shape
IMAGES = or_masks(causal_mod, image_block_mod(TT))
MODS = {  # layer -> (HF's mask, ours)
    0: ("sliding_attention", and_masks(window_mod(4), IMAGES)),
    1: ("full_attention", IMAGES),
}


def test_block_ids_number_each_run_of_image_tokens():
    ids = image_block_ids([[0, 1, 1, 0, 1, 0], [1, 0, 0, 1, 1, 1]])
    assert ids.tolist() == [[-1, 0, 0, -1, 1, -1], [0, -1, -1, 1, 1, 1]]


@pytest.mark.parametrize("bad", [[0, 1, 1], [[0.0, 1.0]]])
def test_block_ids_refuse_what_is_not_a_row_of_ints(bad):
    with pytest.raises(ValueError, match="token_type_ids must be"):
        image_block_ids(bad)


@pytest.mark.parametrize("i", [0, 1])
def test_masks_equal_hugging_faces(i):
    kind, mod = MODS[i]
    ours = create_mask(mod, B, 1, L, L)
    assert np.array_equal(ours, F[f"mask.{kind}"])


@pytest.mark.parametrize("i", [0, 1])
def test_outputs_and_gradients_equal_hugging_faces(i):
    config = json.loads(str(F["config"]))
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: F[k] for k in F.files if k.startswith(pre)}
    layer = attention_from_hf(config, i, state)
    layer.window = None  # the window is inside the mask function
    # the grouped layer itself: an image block is not a decoder's mask
    y = GroupedQueryAttention.forward(layer, F["x"], mask=MODS[i][1])
    want = F[f"layer{i}.out"]
    assert np.abs(y - want).max() / np.abs(want).max() < 1e-12
    dx = layer.backward(F["dy"])
    want = F[f"layer{i}.grad.x"]
    assert np.abs(dx - want).max() / np.abs(want).max() < 1e-12


def test_an_image_mask_is_needed():
    """With the causal mask alone, the image tokens miss what follows
    them in their block: the output moves far beyond rounding."""
    config = json.loads(str(F["config"]))
    state = {
        k[len("layer1.param.") :]: F[k]
        for k in F.files
        if k.startswith("layer1.param.")
    }
    layer = attention_from_hf(config, 1, state)
    y = layer.forward(F["x"])
    assert np.abs(y - F["layer1.out"]).max() > 1e-3
