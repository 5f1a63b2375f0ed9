"""Record PyTorch FlexAttention on the CPU in float64: the reference for
chapter 16's masks and score mods as functions.

Runs only in the fixture environment (``scripts/requirements-fixtures.txt``:
PyTorch); the unit tests load what it writes with NumPy alone. Never run by
``make test``. Usage::

    python scripts/record_flex_fixtures.py

It writes ``tests/fixtures/flex_attention.npz``: for each case, the inputs
``q, k, v [B, H, L, d]``, an upstream gradient ``dout``, FlexAttention's
output, and the gradients of ``sum(out * dout)`` in ``q``, ``k``, ``v``.
FlexAttention runs eagerly here (not compiled) and has no backward on the
CPU (torch 2.13 refuses it), so the gradients come from torch's autograd
through FlexAttention's definition written out, softmax(score_mod(q k^T /
sqrt(d)) where mask_mod, else -inf) v, whose forward is checked against
flex_attention's to 1e-13 before anything is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
B, H, L, D = 2, 4, 24, 8
CU = [0, 7, 15, 24]  # three packed documents
PREFIX, WINDOW, CAP = 6, 5, 2.0


def main() -> int:
    try:
        import torch
        from torch.nn.attention.flex_attention import (
            and_masks,
            create_block_mask,
            flex_attention,
            or_masks,
        )
    except ImportError as err:
        print(f"needs the fixture environment (torch): {err}")
        return 2
    torch.manual_seed(0)
    doc = torch.repeat_interleave(
        torch.arange(len(CU) - 1), torch.tensor(np.diff(CU))
    )
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])

    def causal(b, h, q, kv):
        return kv <= q

    def document(b, h, q, kv):
        return doc[q] == doc[kv]

    def prefix(b, h, q, kv):
        return kv < PREFIX

    def window(b, h, q, kv):
        return kv > q - WINDOW

    def softcap(score, b, h, q, kv):
        return CAP * torch.tanh(score / CAP)

    def alibi(score, b, h, q, kv):
        return score + slopes[h] * (kv - q)

    cases = {
        "causal_document": (and_masks(causal, document), None),
        "prefix_lm": (or_masks(causal, prefix), None),
        "window_document": (and_masks(causal, window, document), None),
        "softcap": (causal, softcap),
        "alibi": (causal, alibi),
    }
    arrays, meta = {}, {"cases": list(cases), "torch": torch.__version__}
    meta.update(B=B, H=H, L=L, D=D, cu_seqlens=CU, prefix=PREFIX)
    meta.update(window=WINDOW, cap=CAP, slopes=slopes.tolist())
    for name, (mask_mod, score_mod) in cases.items():
        q, k, v, dout = (
            torch.randn(B, H, L, D, dtype=torch.float64) for _ in range(4)
        )
        block = create_block_mask(mask_mod, B, H, L, L, device="cpu")
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block)
        for t in (q, k, v):
            t.requires_grad_(True)
        idx = [
            torch.arange(n).view(*s)
            for n, s in (
                (B, (B, 1, 1, 1)),
                (H, (1, H, 1, 1)),
                (L, (1, 1, L, 1)),
                (L, (1, 1, 1, L)),
            )
        ]
        scores = q @ k.transpose(-1, -2) / D**0.5
        if score_mod is not None:
            scores = score_mod(scores, *idx)
        allowed = mask_mod(*idx).expand(B, H, L, L)
        ref = (
            torch.softmax(
                scores.masked_fill(~allowed, float("-inf")), dim=-1
            )
            @ v
        )
        gap = (ref - out).abs().max().item() / out.abs().max().item()
        if not gap < 1e-13:
            raise AssertionError(f"{name}: the definition is {gap:.1e} off")
        (ref * dout).sum().backward()
        for key, t in dict(q=q, k=k, v=v, dout=dout, out=out).items():
            arrays[f"{name}.{key}"] = t.detach().numpy()
        for key, t in dict(q=q, k=k, v=v).items():
            arrays[f"{name}.grad.{key}"] = t.grad.numpy()
    arrays["meta"] = np.array(json.dumps(meta))
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "flex_attention.npz", **arrays)
    print(f"wrote {OUT / 'flex_attention.npz'} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
