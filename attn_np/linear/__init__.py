"""Linear attention, DeltaNet and Gated DeltaNet (chapter 12), laid out
per operation as flash-linear-attention lays out an op.

Softmax attention keeps every key and value. Linear attention replaces
``exp(q . k)`` by a product of features, ``phi(q) . phi(k)`` (Katharopoulos
et al. 2020), and the causal sum becomes a recurrence on a fixed-size
state ``S [d_k, d_v]``::

    S_t = S_{t-1} + phi(k_t) v_t^T          o_t = S_t^T phi(q_t)

The delta rule (DeltaNet; Schlag et al. 2021, Yang et al. 2024) writes
the *error* of what the state already returns for ``k_t``; Gated DeltaNet
(Yang, Kautz and Hatamizadeh, ICLR 2025) first decays the state by
``alpha_t = exp(g_t)``::

    S'_t = alpha_t S_{t-1}                                  decay
    u_t  = beta_t (v_t - S'_t^T k_t)                        [d_v]
    S_t  = S'_t + k_t u_t^T                                 [d_k, d_v]
    o_t  = S_t^T q_t                                        [d_v]

which is ``S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t
v_t^T``. ``g`` of shape ``[..., T]`` is one decay per head (Gated
DeltaNet); of shape ``[..., T, d_k]`` it is one per key channel,
``S'_t = Diag(alpha_t) S_{t-1}`` (Kimi Delta Attention, Kimi Team 2025).

Two forms compute it:

* :func:`gated_delta_recurrent_forward`: the loop over tokens; its
  backward is backpropagation through time and keeps all ``T + 1``
  states.
* :func:`gated_delta_chunked_forward`: chunks of ``C`` tokens. With
  ``Gamma_r`` the decay summed from the chunk's start, ``S_0`` the state
  entering it and ``<x, y>_ri = sum_d x_rd y_id exp(Gamma_rd - Gamma_id)``::

      A = -diag(beta) <K, K>   strictly lower     [C, C]
      T = (I - A)^{-1}         forward substitution
      W = T diag(beta) (K * e^Gamma)   U~ = T diag(beta) V
      U = U~ - W S_0                              [C, d_v]: the u_t
      O = (Q * e^Gamma) S_0 + (<Q, K> incl. diagonal) U
      S_C = e^Gamma_C S_0 + (K * e^(Gamma_C - Gamma))^T U

  (the WY/UT representation of Yang et al. 2024). Only ``S_0`` of each
  chunk and ``U`` (as large as ``V``) are kept; the backward recomputes
  the rest chunk by chunk (or, with :data:`KEEP_PARTS`, the forward
  keeps the chunks' intra-chunk matrices: about ``5 d_k + 5 C`` numbers
  per token and head).

:class:`GatedDeltaNet` is the released layer (Qwen3-Next's
``linear_attention``): short causal convolutions, L2-normalised ``q`` and
``k``, ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``,
more value heads than key heads and a gated RMSNorm. :class:`StateCache`
carries one state and the convolution's last inputs per sequence, for
decoding. :class:`KimiDeltaAttention` overrides its gates.

The modules:

* :mod:`~attn_np.linear.attention`: linear attention with a feature map;
* :mod:`~attn_np.linear.recurrent`: the gated delta rule token by token,
  the reference;
* :mod:`~attn_np.linear.chunked`: the chunked kernels;
* :mod:`~attn_np.linear.conv`, :mod:`~attn_np.linear.gates`: the small
  parts (short convolution and SiLU; sigmoid, softplus, L2 norm);
* :mod:`~attn_np.linear.cache`: the :class:`StateCache`;
* :mod:`~attn_np.linear.layers`: :class:`GatedDeltaNet` and
  :class:`KimiDeltaAttention` in named steps; importing it adds the
  ``"linear"`` kind to chapter 5's :class:`~attn_np.Transformer`.

Qwen3-Next's state dict is read by :mod:`attn_np.hf.weights`.
"""

from ..softmax import sigmoid
from .attention import (
    LinearAttentionCache,
    elu_feature_map,
    linear_attention_backward,
    linear_attention_forward,
)
from .cache import StateCache, state_bytes
from .chunked import (
    KEEP_PARTS,
    ChunkedCache,
    ChunkParts,
    chunk_group_backward,
    gated_delta_chunked_backward,
    gated_delta_chunked_forward,
    unit_lower_inverse,
)
from .conv import causal_conv_backward, causal_conv_forward, silu
from .gates import l2norm_backward, l2norm_forward, softplus
from .layers import KERNELS, GatedDeltaNet, KimiDeltaAttention
from .recurrent import (
    RecurrentCache,
    gated_delta_recurrent_backward,
    gated_delta_recurrent_forward,
)

__all__ = [
    "KEEP_PARTS",
    "KERNELS",
    "ChunkParts",
    "ChunkedCache",
    "GatedDeltaNet",
    "KimiDeltaAttention",
    "LinearAttentionCache",
    "RecurrentCache",
    "StateCache",
    "causal_conv_backward",
    "causal_conv_forward",
    "chunk_group_backward",
    "elu_feature_map",
    "gated_delta_chunked_backward",
    "gated_delta_chunked_forward",
    "gated_delta_recurrent_backward",
    "gated_delta_recurrent_forward",
    "l2norm_backward",
    "l2norm_forward",
    "linear_attention_backward",
    "linear_attention_forward",
    "sigmoid",
    "silu",
    "softplus",
    "state_bytes",
    "unit_lower_inverse",
]
