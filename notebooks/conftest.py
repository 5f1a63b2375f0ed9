"""nbval settings for the book's notebooks.

By default nbval does not compare images. The book promises that every figure
it shows is one the current code produces, so PNG outputs are compared too:
matplotlib's Agg renderer is deterministic for a pinned matplotlib, and every
figure is drawn from seeded data. Cells whose output depends on the machine
(timings) carry the ``nbval-ignore-output`` tag and are not compared at all.
"""

IMAGE_KEYS = {"image/png", "image/jpeg"}


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        parent = getattr(item, "parent", None)
        skip = getattr(parent, "skip_compare", None)
        if skip is not None and IMAGE_KEYS & set(skip):
            parent.skip_compare = tuple(
                k for k in skip if k not in IMAGE_KEYS
            )
