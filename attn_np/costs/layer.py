"""What an attention layer costs: parameters, FLOPs and activation memory
(chapters 2 to 4).

Every formula is a function of the batch size ``B``, the sequence length
``L``, the model width ``d_model``, the number of query heads ``n_heads``,
the number of key/value heads ``n_kv_heads`` (``n_heads`` for multi-head
attention, 1 for multi-query, anything dividing ``n_heads`` for
grouped-query) and the head dimensions ``d_k`` and ``d_v`` (both ``d_model //
n_heads`` by default). They count exactly what
:class:`attn_np.GroupedQueryAttention` does, so a measurement can sit next to
each of them.

Conventions
-----------
* Self-attention: queries and keys come from the same ``L`` positions (``L_q
  = L_k = L``).
* FLOPs count matrix products only: ``[m, k] @ [k, n]`` costs ``2 m n k`` (a
  multiply and an add per term). The softmax, the scaling, the masking and
  the row sums of the backward are elementwise work, ``O(B h L^2)``
  operations against the matmuls' ``O(B h L^2 (d_k + d_v))``; they are not
  counted.
* A causal mask does not reduce the count: the layer computes every score
  densely and then masks it. A kernel that skipped the masked half would do
  about half the attention-matmul work.
* Memory is in bytes; ``bytes_per_element`` is 4 for float32, 8 for float64.
"""

from __future__ import annotations

from .._checks import check_head_dims, check_positive_int


def head_dims(d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None):
    """Validated ``(d_model, n_heads, n_kv_heads, d_k, d_v)`` with the
    layer's defaults filled in (the layer's own check)."""
    return check_head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)


# ---------------------------------------------------------------------------
# -- parameters
def param_count(
    d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> int:
    """Number of weights: ``d h d_k + d n_kv d_k + d n_kv d_v + h d_v d`` (no
    biases).

    For multi-head attention (``n_kv = h``) this is ``2 d h d_k + 2 d h
    d_v``, which is ``4 d^2`` when ``h d_k = h d_v = d``.
    """
    d, h, n_kv, d_k, d_v = head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)
    return d * h * d_k + d * n_kv * d_k + d * n_kv * d_v + h * d_v * d


# ---------------------------------------------------------------------------
# ------- FLOPs
def matmul_flops(
    B, L_q, L_k, d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> dict[str, int]:
    """Matmul FLOPs of one forward pass of ``L_q`` queries over ``L_k``
    keys, term by term (``2 m n k`` per ``[m, k] @ [k, n]``).

    The one FLOP formula of the book: training (``L_q = L_k = L``) and
    decoding (``L_q`` new positions over a cache) both use it.
    """
    B = check_positive_int(B, "B")
    L_q, L_k = check_positive_int(L_q, "L_q"), check_positive_int(L_k, "L_k")
    d, h, n_kv, d_k, d_v = head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)
    return {
        # [B*L_q, d] @ [d, h*d_k]
        "Q projection": 2 * B * L_q * d * h * d_k,
        # [B*L_q, d] @ [d, n_kv*(d_k + d_v)]
        "K, V projections": 2 * B * L_q * d * n_kv * (d_k + d_v),
        # per query head: [L_q, d_k] @ [d_k, L_k]
        "scores Q K^T": 2 * B * h * L_q * L_k * d_k,
        # per query head: [L_q, L_k] @ [L_k, d_v]
        "weights @ V": 2 * B * h * L_q * L_k * d_v,
        # [B*L_q, h*d_v] @ [h*d_v, d]
        "output projection": 2 * B * L_q * h * d_v * d,
    }


def forward_flops_breakdown(
    B, L, d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> dict[str, int]:
    """Matmul FLOPs of one forward pass of self-attention over ``L``
    positions, term by term: :func:`matmul_flops` with ``L_q = L_k = L``."""
    return matmul_flops(B, L, L, d_model, n_heads, n_kv_heads, d_k, d_v)


def backward_flops_breakdown(
    B, L, d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> dict[str, int]:
    """Matmul FLOPs of one backward pass, term by term.

    Every forward product ``C = A B`` needs two products in the backward,
    ``dA = dC B^T`` and ``dB = A^T dC``, of the same size, so the backward
    costs twice the forward.
    """
    B, L = check_positive_int(B, "B"), check_positive_int(L, "L")
    d, h, n_kv, d_k, d_v = head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)
    # output columns of W_q, W_k, W_v together
    proj = h * d_k + n_kv * d_k + n_kv * d_v
    return {
        # o^T dy and dy W_o^T
        "dW_o and d(concat)": 2 * (2 * B * L * h * d_v * d),
        "dV = P^T dO and dP = dO V^T": 2 * (2 * B * h * L * L * d_v),
        "dQ = dS K and dK = dS^T Q": 2 * (2 * B * h * L * L * d_k),
        # x^T dq ... and dq W_q^T + ...
        "dW_q, dW_k, dW_v and dx": 2 * (2 * B * L * d * proj),
    }


def forward_flops(
    B, L, d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> int:
    """Matmul FLOPs of one forward pass: ``2 B L d (h d_k + n_kv (d_k + d_v)
    + h d_v) + 2 B h L^2 (d_k + d_v)``."""
    return sum(
        forward_flops_breakdown(
            B, L, d_model, n_heads, n_kv_heads, d_k, d_v
        ).values()
    )


def backward_flops(
    B, L, d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> int:
    """Matmul FLOPs of one backward pass: twice :func:`forward_flops`."""
    return sum(
        backward_flops_breakdown(
            B, L, d_model, n_heads, n_kv_heads, d_k, d_v
        ).values()
    )


def training_flops(
    B, L, d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> int:
    """Forward plus backward: three times the forward's matmul FLOPs."""
    args = (B, L, d_model, n_heads, n_kv_heads, d_k, d_v)
    return forward_flops(*args) + backward_flops(*args)


# ---------------------------------------------------------------------------
# ------- memory
def activation_bytes(
    B,
    L,
    d_model,
    n_heads,
    n_kv_heads=None,
    d_k=None,
    d_v=None,
    *,
    bytes_per_element: int = 4,
) -> dict[str, int]:
    """Bytes the forward allocates and keeps for the backward, tensor by
    tensor.

    The layer's cache holds the per-head queries, keys and values, the
    per-head outputs, the concatenated heads that meet ``W_o``, and the
    attention weights ``[B, h, L, L]``: the only term that grows with
    ``L^2``. The input ``x`` is also kept, but it is not allocated by this
    layer (in a stack it is the previous layer's output), so it is not
    counted here.
    """
    B, L = check_positive_int(B, "B"), check_positive_int(L, "L")
    d, h, n_kv, d_k, d_v = head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)
    e = check_positive_int(bytes_per_element, "bytes_per_element")
    return {
        "queries [B, h, L, d_k]": B * h * L * d_k * e,
        "keys [B, n_kv, L, d_k]": B * n_kv * L * d_k * e,
        "values [B, n_kv, L, d_v]": B * n_kv * L * d_v * e,
        "head outputs [B, h, L, d_v]": B * h * L * d_v * e,
        "concatenated heads [B, L, h*d_v]": B * L * h * d_v * e,
        "attention weights [B, h, L, L]": B * h * L * L * e,
    }


def attention_weights_bytes(
    B, L, n_heads, *, bytes_per_element: int = 4
) -> int:
    """Bytes of the ``[B, h, L, L]`` attention weights alone."""
    return (
        check_positive_int(B, "B")
        * check_positive_int(n_heads, "n_heads")
        * check_positive_int(L, "L") ** 2
        * check_positive_int(bytes_per_element, "bytes_per_element")
    )


def forward_retained_bytes(
    B,
    L,
    d_model,
    n_heads,
    n_kv_heads=None,
    d_k=None,
    d_v=None,
    *,
    bytes_per_element: int = 4,
) -> int:
    """Bytes still allocated after a forward: the activations kept for the
    backward plus ``y``."""
    kept = activation_bytes(
        B,
        L,
        d_model,
        n_heads,
        n_kv_heads,
        d_k,
        d_v,
        bytes_per_element=bytes_per_element,
    )
    return sum(kept.values()) + B * L * d_model * bytes_per_element


def weights_crossover_length(
    d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None
) -> float:
    """The ``L`` above which the attention weights take more memory than all
    other activations.

    The other kept activations grow like ``L`` times a fixed number of
    elements per position, ``c = h d_k + n_kv d_k + n_kv d_v + 2 h d_v`` (see
    :func:`activation_bytes`); the weights grow like ``h L^2``. They are
    equal at ``L* = c / h``, whatever ``B`` and the bytes per element. For
    multi-head attention with ``h d_k = h d_v = d`` that is ``L* = 5 d / h =
    5 d_k``.
    """
    kept = activation_bytes(
        1, 1, d_model, n_heads, n_kv_heads, d_k, d_v, bytes_per_element=1
    )
    per_position = (
        sum(kept.values()) - kept["attention weights [B, h, L, L]"]
    )
    return (
        per_position / head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)[1]
    )
