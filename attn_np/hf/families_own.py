"""The families whose layer is built by a function of its own from the
plain decoder's settings (chapter 10): MiMo-V2-Flash
(:mod:`attn_np.hf.families_mimo`), Laguna
(:mod:`attn_np.hf.families_laguna`) and Beam
(:mod:`attn_np.hf.families_beam`). Each builder reads the config as its
configuration class does (its sizes, layer rule and RoPE per layer type
where a file writes none), hands the result to
:func:`attn_np.hf.families.plain_decoder` and adds its parts."""

from __future__ import annotations

from .families_beam import _beam
from .families_laguna import _laguna
from .families_mimo import _mimo_v2_flash

# model_type -> builder(cfg, layer_idx, plain_decoder)
_BUILDERS = {
    "mimo_v2_flash": _mimo_v2_flash,
    "laguna": _laguna,
    "beam": _beam,
}


def _on_plain(plain_decoder, layer_index) -> dict:
    """``{model_type: build(cfg, model_type, layer_idx)}``, each layer
    index checked by ``layer_index``, for
    :data:`attn_np.hf.families._OWN_LAYERS`."""

    def own(build):
        return lambda cfg, t, i: build(
            cfg, layer_index(cfg, i), plain_decoder
        )

    return {t: own(b) for t, b in _BUILDERS.items()}
