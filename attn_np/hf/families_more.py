"""More Hugging Face decoder families, each a difference from a layer
:mod:`attn_np.hf.families` already builds (chapter 10).

Read off each family's attention class in ``transformers`` 5.24.0
(``modeling_<model_type>.py``) and matched by
``tests/fixtures/families/<model_type>.npz``:

* Cohere 2 MoE: Cohere 2's layer (interleaved RoPE on the window layers
  only), except that a dense-MLP layer turns too when
  ``prefix_dense_sliding_window_pattern`` is 1 (HF's ``force_rope``);
* Granite SWA and Granite MoE SWA: gpt-oss's sinks (HF adds them as
  ``sigmoid(logsumexp(s) - sink)`` on the output, the same as one more
  logit in the softmax's denominator), Granite's
  ``attention_multiplier`` as the scale, windows from ``layer_types``
  and a RoPE base per layer (``layer_rope_theta``; 0 is a NoPE layer);
* multi-head latent attention under other model types: GLM-4.7-Flash
  (``glm4_moe_lite``), Youtu and Sarvam's MLA build DeepSeek-V3's
  module line for line; MiniCPM3 builds it with the rotate-half RoPE
  always (its forward never reads ``rope_interleave``).

:mod:`attn_np.hf.families` registers them; this module holds only the
differences.
"""

from __future__ import annotations

from .config import FULL, SLIDING, count, number

# ------------------------------------------------------ Cohere 2 MoE


def _cohere2_moe_rope(cfg, i, layer_type, kw, layout):
    """Cohere 2 MoE turns q and k on a window layer, and on a layer with
    a dense MLP (``mlp_layer_types[i] == "dense"``) when
    ``prefix_dense_sliding_window_pattern`` is 1 (its class's default):
    HF's ``force_rope``. Every other layer is NoPE."""
    key = "prefix_dense_sliding_window_pattern"
    pattern = count(cfg, key, required=False)
    mlp = cfg.get("mlp_layer_types")
    n = count(cfg, "num_hidden_layers")
    if mlp is None:
        if cfg.get("first_k_dense_replace") not in (None, 0):
            raise ValueError(
                "config key mlp_layer_types is missing for cohere2_moe but "
                "first_k_dense_replace is set: which layers are dense "
                "(and so turn q and k) is not written; refusing to guess"
            )
        mlp = ["sparse"] * n  # Cohere2MoeConfig without dense layers
    if not isinstance(mlp, list) or len(mlp) != n:
        raise ValueError(
            "config key mlp_layer_types must list one entry per layer "
            f"(num_hidden_layers={n}), got {mlp!r:.200}"
        )
    force = mlp[i] == "dense" and (pattern is None or pattern == 1)
    kw["use_rope"] = kw["window"] is not None or force


# ------------------------------------------------------ Granite SWA


def _granite_swa_types(cfg):
    """``layer_types`` as ``GraniteSWAConfig`` fills it when the file has
    none: layer ``i`` full when ``i % 4 == 0``, else sliding."""
    if cfg.get("layer_types") is not None:
        return cfg
    n = count(cfg, "num_hidden_layers")
    types = [FULL if i % 4 == 0 else SLIDING for i in range(n)]
    return {**cfg, "layer_types": types}


def _layer_theta(cfg, i):
    """``layer_rope_theta[i]``: layer ``i``'s RoPE base, 0 for NoPE (None
    when the file has no list: every layer takes the config's base)."""
    thetas = cfg.get("layer_rope_theta")
    if thetas is None:
        return None
    n = count(cfg, "num_hidden_layers")
    if not isinstance(thetas, list) or len(thetas) != n:
        raise ValueError(
            "config key layer_rope_theta must list one RoPE base per layer "
            f"(num_hidden_layers={n}), got {thetas!r:.200}"
        )
    theta = thetas[i]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ValueError(
            f"config key layer_rope_theta[{i}] must be a number (0: no "
            f"RoPE), got {theta!r}"
        )
    if theta < 0:
        raise ValueError(
            f"config key layer_rope_theta[{i}] must be 0 or positive, got "
            f"{theta!r}"
        )
    return float(theta)


def _granite_swa(cfg, i, layer_type, kw, layout):
    """Sinks, the scale ``attention_multiplier`` (class default 1.0), and
    layer ``i``'s RoPE base from ``layer_rope_theta`` (0: NoPE)."""
    kw["sinks"] = True
    kw["scale"] = number(cfg, "attention_multiplier", 1.0)
    theta = _layer_theta(cfg, i)
    if theta == 0.0:
        kw["use_rope"] = False
    elif theta is not None:
        kw["rope_base"] = theta


# ------------------------------------------------------------------ MLA
def _minicpm3_settings(cfg):
    """MiniCPM3's MLA: DeepSeek-V2's module with the rotate-half RoPE
    (its forward calls ``apply_rotary_pos_emb`` and never reads
    ``rope_interleave``, so a file's ``rope_interleave`` changes nothing
    there, and nothing here); ``v_head_dim`` defaults to ``hidden_size //
    num_attention_heads`` (``MiniCPM3Config``'s rule)."""
    cfg = {**cfg, "rope_interleave": False}
    if cfg.get("v_head_dim") is None:
        d = count(cfg, "hidden_size") // count(cfg, "num_attention_heads")
        cfg["v_head_dim"] = d
    return cfg
