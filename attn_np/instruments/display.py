"""Show attn_np's own source in a notebook, so the book never carries a
hand-typed copy."""

from __future__ import annotations

import inspect


def show_source(*objects):
    """Return the source of functions, classes or methods as a highlighted
    code block.

    In a notebook the block renders with syntax highlighting; its plain-text
    form is the source itself, so nbval fails the notebook if the displayed
    code and the library ever drift apart.
    """
    from IPython.display import Code

    parts = []
    for obj in objects:
        module = inspect.getmodule(obj)
        name = getattr(
            obj, "__qualname__", getattr(obj, "__name__", repr(obj))
        )
        parts.append(
            f"# {module.__name__}.{name}\n" + inspect.getsource(obj).rstrip()
        )
    return Code("\n\n\n".join(parts), language="python")
