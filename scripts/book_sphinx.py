"""The book's own Sphinx extension (``sphinx.local_extensions`` in ``_config.yml``).

- Draws ``book/_generated/*.png`` (figures and favicon) from the current attn_np code when the build
  starts, before any page is read: the book cannot show a stale figure (``scripts/make_figures.py``).
- Registers the bibliography's author-year style ``authoryear``: the reference list is sorted by author
  and year and labelled "Vaswani et al., 2017" (``bibtex_default_style`` in ``_config.yml``); two
  papers with one label become "Ba et al., 2016a" and "2016b", in the list and in the text.
- Writes each ``<script>`` once. With Sphinx 7.4, the inline scripts that sphinx-thebe and
  sphinx-togglebutton add come out twice (once as filename ``None``, once as ``''``), and the second
  ``const THEBE_JS_URL`` is a JavaScript error in every reader's console.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_figures  # noqa: E402  (scripts/ is not a package)

# --- the bibliography's author-year style -------------------------------------------------------


def _register_authoryear_style() -> None:
    """Register pybtex style ``authoryear``: the alphabetical list labelled "Author et al., Year"."""
    from pybtex.plugin import find_plugin, register_plugin
    from pybtex.style.formatting.unsrt import Style as UnsrtStyle
    from pybtex.style.labels import BaseLabelStyle

    class AuthorYearLabelStyle(BaseLabelStyle):
        def format_labels(self, sorted_entries):
            labels = list(self._labels(sorted_entries))
            counts = {label: labels.count(label) for label in labels}
            used: dict[str, int] = {}
            for label in labels:  # two papers, one label: "Ba et al., 2016a" and "Ba et al., 2016b"
                if counts[label] == 1:
                    yield label
                else:
                    used[label] = used.get(label, 0) + 1
                    yield (
                        label + "abcdefghijklmnopqrstuvwxyz"[used[label] - 1]
                    )

        def _labels(self, sorted_entries):
            for entry in sorted_entries:
                people = (
                    entry.persons.get("author")
                    or entry.persons.get("editor")
                    or []
                )
                names = [
                    "".join(p.last_names) or "".join(p.first_names)
                    for p in people
                ]
                names = [n.replace("{", "").replace("}", "") for n in names]
                if not names:
                    who = (
                        entry.fields.get("title", entry.key)
                        .replace("{", "")
                        .replace("}", "")
                    )
                elif len(names) == 1:
                    who = names[0]
                elif len(names) == 2:
                    who = f"{names[0]} and {names[1]}"
                else:
                    who = f"{names[0]} et al."
                yield f"{who}, {entry.fields.get('year', 'n.d.')}"

    class AuthorYearStyle(UnsrtStyle):
        default_label_style = AuthorYearLabelStyle
        default_sorting_style = find_plugin(
            "pybtex.style.sorting", "author_year_title"
        )

    try:
        register_plugin(
            "pybtex.style.formatting", "authoryear", AuthorYearStyle
        )
    except Exception:  # already registered in this process (a second build)
        pass


def _cite_year_with_its_letter() -> None:
    """In the text, cite the year as the list labels it: "Ba et al., 2016a", not an ambiguous "2016".

    sphinxcontrib-bibtex's author-year citations print the ``year`` field; when two papers share an
    author label and a year, the ``authoryear`` labels above tell them apart with a letter. This swaps
    the citation's year node for one that copies that letter from the entry's label.
    """
    from pybtex.richtext import Text
    from pybtex.style.template import field, first_of, optional
    from sphinxcontrib.bibtex.style import template
    from sphinxcontrib.bibtex.style.referencing import basic_author_year

    @template.node
    def year(children, data):
        assert not children
        plain = first_of[optional[field("year")], "n.d."].format_data(data)
        label = data["formatted_entry"].label
        if label[-1:].isalpha() and label[:-1].endswith(str(plain)):
            return Text(str(plain) + label[-1])
        return plain

    basic_author_year.year = year


def _write_each_script_once(app, pagename, templatename, context, doctree):
    seen, unique = set(), []
    for script in context.get("script_files", []):
        attributes = getattr(script, "attributes", {})
        key = (
            str(getattr(script, "filename", script) or ""),
            tuple(sorted(attributes.items())),
        )
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    _register_authoryear_style()
    _cite_year_with_its_letter()
    make_figures.make_all(Path(app.srcdir) / "book" / "_generated")
    app.connect("html-page-context", _write_each_script_once)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
