"""What a benchmark's ``--help`` says about it: its module docstring's
first paragraph, on one line, without the ``python -m ...:`` it starts
with."""

from __future__ import annotations


def description(doc: str | None) -> str:
    """The first paragraph of ``doc``, its reST markup and its leading
    ``python -m attn_np.bench NAME:`` removed."""
    first = (doc or "").strip().split("\n\n")[0]
    text = " ".join(first.replace("``", "").split())
    head, sep, tail = text.partition(": ")
    if sep and head.startswith("python -m attn_np.bench"):
        text = tail[:1].upper() + tail[1:]
    return text
