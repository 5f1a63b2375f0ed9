"""Record Gemma 3's masks over image tokens and the attention outputs they
give: the reference for chapter 16's image-block mask function.

Runs only in the fixture environment (``scripts/requirements-fixtures.txt``:
PyTorch and ``transformers``); the unit tests load what it writes with
NumPy alone. Never run by ``make test``. Usage::

    python scripts/record_image_block_fixtures.py

It writes ``tests/fixtures/gemma3_image_blocks.npz``: for a tiny Gemma 3
text model (the ``gemma3`` family of ``record_hf_fixtures.py``: layer 0
sliding 4, layer 1 full) and two rows of ``token_type_ids`` (1: an image
token), HF's own masks from ``create_masks_for_vision_model`` (its full and
sliding layers' masks, as booleans) and each layer's attention output and
input gradient in float64 with those masks (``sum(out * dy)``), with the
layer's weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_hf_fixtures import (  # noqa: E402
    BASE,
    attention_module,
    decoder_layers,
    float64_everywhere,
    redraw,
)

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
TOKEN_TYPES = [
    [0, 0, 1, 1, 1, 0, 1, 1, 0, 0],  # two images inside text
    [1, 1, 1, 1, 0, 0, 0, 1, 1, 1],  # an image first and one last
]


def main() -> int:
    try:
        import torch
        import transformers
        from transformers.models.gemma3 import modeling_gemma3 as g3
    except ImportError as err:
        print(f"needs the fixture environment (torch): {err}")
        return 2
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    tt = torch.tensor(TOKEN_TYPES)
    B, L = tt.shape
    with float64_everywhere():
        config = transformers.Gemma3TextConfig(
            **BASE,
            query_pre_attn_scalar=24,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                },
                "full_attention": {
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                },
            },
        )
        model = transformers.AutoModel.from_config(
            config, attn_implementation="eager"
        )
        model = model.to(torch.float64).eval()
        d = config.hidden_size
        x = torch.randn(B, L, d, generator=gen)
        dy = torch.randn(B, L, d, generator=gen)
        emb = torch.randn(B, L, d, generator=gen)
        blocks = g3.get_block_sequence_ids_for_mask(tt)
        masks = g3.create_masks_for_vision_model(
            config,
            emb,
            None,
            None,
            torch.arange(L)[None],
            blocks,
        )
        arrays = {
            "x": x.numpy(),
            "dy": dy.numpy(),
            "token_type_ids": tt.numpy(),
        }
        for kind, m in masks.items():  # eager: 0 where allowed, else min
            if m.dtype == torch.bool:
                raise TypeError(f"{kind}: a bool mask, not eager's floats")
            arrays[f"mask.{kind}"] = (m == 0).numpy()
        for i in range(config.num_hidden_layers):
            mod = attention_module(decoder_layers(model)[i])
            redraw(mod, gen)
            for name, p in mod.named_parameters():
                arrays[f"layer{i}.param.{name}"] = p.detach().numpy().copy()
            got = {}

            def pre(m, args, kwargs, __got=got):
                kwargs["hidden_states"] = __got["x"]
                return args, kwargs

            def post(m, args, kwargs, out, __got=got):
                __got["out"] = out[0]

            got["x"] = x.clone().requires_grad_(True)
            h1 = mod.register_forward_pre_hook(pre, with_kwargs=True)
            h2 = mod.register_forward_hook(post, with_kwargs=True)
            try:
                model(inputs_embeds=emb, attention_mask=masks)
            finally:
                h1.remove()
                h2.remove()
            (dx,) = torch.autograd.grad(got["out"], [got["x"]], dy)
            arrays[f"layer{i}.out"] = got["out"].detach().numpy().copy()
            arrays[f"layer{i}.grad.x"] = dx.numpy().copy()
    meta = dict(
        transformers=transformers.__version__,
        torch=torch.__version__,
        layer_types=config.layer_types,
        sliding_window=config.sliding_window,
        notes="Gemma 3 text layers under create_masks_for_vision_model's "
        "masks: full OR(causal, image block), sliding AND(window, "
        "OR(causal, image block))",
    )
    arrays["config"] = np.array(config.to_json_string(use_diff=False))
    arrays["meta"] = np.array(json.dumps(meta))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "gemma3_image_blocks.npz"
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
