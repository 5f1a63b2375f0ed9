"""Serving many requests (chapter 15): a paged key/value cache
(:class:`PagedKVCache`; Kwon et al. 2023) and attention over it for a
ragged batch of sequences (:func:`paged_attention`, the dense gather; and
:func:`paged_attention_by_page`, page by page with an online softmax),
continuous batching with chunked prefill and prefix caching
(:class:`Engine`; Zheng et al. 2024), and the reference it is checked
against, one request alone with chapter 4's cache (:func:`generate_alone`).
"""

from .engine import Engine, ModelParts, Request, generate_alone
from .paged import (
    PagedKVCache,
    masked_attention,
    padded_tables,
    page_hashes,
    paged_attention,
    paged_attention_by_page,
)

__all__ = [
    "Engine",
    "ModelParts",
    "PagedKVCache",
    "Request",
    "masked_attention",
    "padded_tables",
    "generate_alone",
    "page_hashes",
    "paged_attention",
    "paged_attention_by_page",
]
