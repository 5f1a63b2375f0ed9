"""Serving many requests (chapter 15): a paged key/value cache
(:class:`PagedKVCache`, :func:`paged_attention`; Kwon et al. 2023),
continuous batching with chunked prefill and prefix caching
(:class:`Engine`; Zheng et al. 2024), and the reference it is checked
against, one request alone with chapter 4's cache (:func:`generate_alone`).
"""

from .engine import Engine, ModelParts, Request, generate_alone
from .paged import PagedKVCache, page_hashes, paged_attention

__all__ = [
    "Engine",
    "ModelParts",
    "PagedKVCache",
    "Request",
    "generate_alone",
    "page_hashes",
    "paged_attention",
]
