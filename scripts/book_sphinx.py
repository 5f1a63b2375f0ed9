"""The book's own Sphinx extension (``sphinx.local_extensions`` in ``_config.yml``).

- Draws ``book/_generated/*.png`` (figures and favicon) from the current attn_np code when the build
  starts, before any page is read: the book cannot show a stale figure (``scripts/make_figures.py``).
- Registers the bibliography's author-year style ``authoryear``: the reference list is sorted by author
  and year and labelled "Vaswani et al., 2017" (``bibtex_default_style`` in ``_config.yml``); two
  papers with one label become "Ba et al., 2016a" and "2016b", in the list and in the text.
- Writes the front page's map of the book, ``book/_generated/chapter_map.md``, from ``_toc.yml``
  (every page it lists, in its order and parts) and ``book/chapters.yml`` (the question each page
  answers): a page added to ``_toc.yml`` is on the map at the next build.
- Writes each ``<script>`` once. With Sphinx 7.4, the inline scripts that sphinx-thebe and
  sphinx-togglebutton add come out twice (once as filename ``None``, once as ``''``), and the second
  ``const THEBE_JS_URL`` is a JavaScript error in every reader's console.
"""

from __future__ import annotations

import re
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


# --- the front page's map of the book -----------------------------------------------------------


def toc_parts(root: Path) -> list[tuple[str, bool, list[str]]]:
    """``[(caption, numbered, [file, ...]), ...]``: the parts of ``_toc.yml`` and the pages in each
    (sub-pages included, in order), with file names as written there (no suffix)."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())

    def files(entries):
        for entry in entries or []:
            if "file" in entry:
                yield re.sub(r"\.(md|ipynb)$", "", entry["file"])
            yield from files(entry.get("sections") or entry.get("entries"))

    return [
        (
            part.get("caption", ""),
            bool(part.get("numbered")),
            list(files(part.get("chapters"))),
        )
        for part in toc.get("parts", [])
    ]


def chapter_map(root: Path) -> tuple[str, list[str]]:
    """The map as MyST (links relative to ``book/``), and the pages that have no entry in
    ``book/chapters.yml``."""
    import yaml

    about = (
        yaml.safe_load((root / "book" / "chapters.yml").read_text()) or {}
    )
    missing, out = [], []

    def link(f):
        return (
            f"{{doc}}`../{f}`"
            if not f.startswith("book/")
            else f"{{doc}}`{f[len('book/') :]}`"
        )

    for caption, numbered, files in toc_parts(root):
        out.append(f"**{caption}**\n" if caption else "")
        if numbered:
            out.append(
                "| | chapter | the question it answers | from the note |"
            )
            out.append("|---|---|---|---|")
        for i, f in enumerate(files, 1):
            entry = about.get(f)
            if entry is None:
                missing.append(f)
                entry = {}
            question = " ".join(str(entry.get("question", "")).split())
            note = " ".join(str(entry.get("note", "")).split()) or "—"
            if numbered:
                out.append(f"| {i} | {link(f)} | {question} | {note} |")
            else:
                out.append(
                    f"- {link(f)}" + (f": {question}" if question else "")
                )
        out.append("")
    return "\n".join(out) + "\n", missing


def _write_chapter_map(app) -> None:
    from sphinx.util import logging

    root = Path(app.srcdir)
    text, missing = chapter_map(root)
    out = root / "book" / "_generated" / "chapter_map.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file() or out.read_text() != text:
        out.write_text(text)
    for f in missing:
        logging.getLogger(__name__).warning(
            f"{f} is in _toc.yml but not in book/chapters.yml: the front page's map "
            "lists it without the question it answers"
        )


def setup(app):
    _register_authoryear_style()
    _cite_year_with_its_letter()
    make_figures.make_all(Path(app.srcdir) / "book" / "_generated")
    _write_chapter_map(app)
    app.connect("html-page-context", _write_each_script_once)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
