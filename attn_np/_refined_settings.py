"""The settings of chapter 10's :class:`~attn_np.refinements.
RefinedAttention`, checked before the layer is built: each error names
its keyword and what it got."""

from __future__ import annotations

from ._checks import (
    check_flag,
    check_number,
    check_positive_int,
    check_positive_number,
)


def _check_refined(**kw):
    """:class:`RefinedAttention`'s settings, checked (each error names
    its keyword); returns them as the layer keeps them."""
    biases = kw["biases"]
    if isinstance(biases, str) or not isinstance(biases, (tuple, list)):
        raise TypeError(
            "biases must be a tuple of names among 'q', 'k', 'v', 'o' "
            f"(such as ('q', 'k')), got {biases!r}"
        )
    bad = {b for b in biases if b not in ("q", "k", "v", "o")}
    if bad or len(set(biases)) != len(biases):
        bad = bad or biases
        raise ValueError(
            f"biases must name q, k, v or o, each at most once; got {bad}"
        )
    kw["biases"] = tuple(sorted(kw["biases"]))
    if kw["qk_norm"] not in (None, "head", "proj"):
        raise ValueError(
            f"qk_norm must be None, 'head' or 'proj', got {kw['qk_norm']!r}"
        )
    if kw["gate"] not in (None, "elementwise", "headwise"):
        raise ValueError(
            "gate must be None, 'elementwise' or 'headwise', got "
            f"{kw['gate']!r}"
        )
    for flag in ("qk_norm_learned", "qk_norm_after_rope", "use_rope"):
        kw[flag] = check_flag(kw[flag], flag)
    if kw["qk_norm"] and kw["qk_norm_after_rope"] and kw["qk_norm_learned"]:
        # the norm after RoPE is the position part's, which has no
        # weights: a learned gain there would be dropped without a word
        raise ValueError(
            "qk_norm_after_rope=True builds Llama 4's norm without weights:"
            " pass qk_norm_learned=False (HunYuan's learned gains after "
            "RoPE are attn_np.hf's layer)"
        )
    if kw["chunk"] is not None:
        kw["chunk"] = check_positive_int(kw["chunk"], "chunk")
    for name in ("rope_factor", "norm_eps"):
        kw[name] = float(check_positive_number(kw[name], name))
    if kw["clip_qkv"] is not None:
        kw["clip_qkv"] = check_positive_number(kw["clip_qkv"], "clip_qkv")
    kw["qk_norm_offset"] = check_number(
        kw["qk_norm_offset"], "qk_norm_offset"
    )
    temp = kw["query_temperature"]
    if temp is not None:
        try:
            floor_scale, attn_scale, *rest = temp
            (offset,) = rest or (1,)
        except (TypeError, ValueError):
            raise ValueError(
                "query_temperature must be (floor_scale, attn_scale) or "
                f"(floor_scale, attn_scale, offset), got {temp!r}"
            ) from None
        if offset not in (0, 1) or isinstance(offset, bool):
            raise ValueError(
                f"query_temperature's offset must be 0 or 1, got {offset!r}"
            )
        kw["query_temperature"] = (
            check_positive_number(floor_scale, "floor_scale"),
            check_number(attn_scale, "attn_scale"),
            int(offset),
        )
    return kw
