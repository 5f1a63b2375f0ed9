"""Measure every page of the built book the way a reader sees it, at 1280x900 and at 390x844.

    .venv/bin/python scripts/page_stats.py [--html _build/html] [--out FILE] [PAGE ...]

For each page and each window size it prints:

- ``height``: the page's height in CSS px (``document.documentElement.scrollHeight``);
- ``cut``: display equations whose typeset content is wider than their box (MathJax gives the box
  ``overflow-x: auto`` and an overlay scroll bar hides that there is more);
- ``fig px``: the smallest text in any figure, in CSS px, as shown: the font size the figure was drawn
  with (points, recorded in the PNG by ``attn_np.instruments.plotting``; for a PNG without that record,
  the smallest size of the book's rcParams, marked ``~``) x its dpi / 72 x the scale the page shows
  it at (displayed width / natural width);
- ``side``: blocks in the article that scroll sideways (``scrollWidth > clientWidth``);
- ``wide``: how many px the page is wider than the window (0 when it fits);
- ``code``: the share of the article's height taken by code cells and by library source printed
  with ``show_source``.

The browser test (tests/browser) imports ``PROBE``, ``figure_text`` and the small helpers from here,
so the numbers it fails on are the numbers this script prints.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORTS = {"desktop": (1280, 900), "phone": (390, 844)}
# What a figure drawn without a record of its fonts is assumed to use: the smallest size the book's
# rcParams set (font.size 10; tick and legend labels are "medium", i.e. font.size).
DEFAULT_TEXT_PT = 10.0
DEFAULT_DPI = 100.0
TEXT_KEY = "attn_np:smallest-text-pt"
WHAT_KEY = "attn_np:smallest-text"
DPI_KEY = "attn_np:dpi"

# Runs in the page once it has loaded: waits for MathJax and the images, then measures.
PROBE = r"""
async (timeoutMs) => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    const done = (async () => {
      await MathJax.startup.promise;
      if (MathJax.typesetPromise) await MathJax.typesetPromise();
    })();
    await Promise.race([done, new Promise(r => setTimeout(r, timeoutMs))]);
  }
  // book.js: what the page does once MathJax is done, in its order
  if (window.bookStackTables) window.bookStackTables();
  if (window.bookFitMath) window.bookFitMath();
  await document.fonts.ready;
  for (const img of document.images) img.loading = "eager";
  await Promise.race([
    Promise.all([...document.images].map(img => img.complete ? null :
      new Promise(r => { img.addEventListener("load", r); img.addEventListener("error", r); }))),
    new Promise(r => setTimeout(r, timeoutMs)),
  ]);
  const vw = window.innerWidth;
  const article = document.querySelector("article") || document.body;
  const texOf = new Map();
  try {
    for (const item of MathJax.startup.document.math) texOf.set(item.typesetRoot, item.math);
  } catch (err) {}
  // Display equations: the typeset math (mjx-math) wider than the box it sits in.
  const cut = [];
  for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
    const box = c.getBoundingClientRect();
    const m = c.querySelector("mjx-math");
    const inner = m ? m.getBoundingClientRect().width : 0;
    const excess = Math.max(c.scrollWidth - c.clientWidth, inner - box.width);
    if (excess > 1) {
      const host = c.closest("div.math, .math");
      const eqno = host ? (host.querySelector(".eqno") || {}).textContent || "" : "";
      cut.push({excess: Math.round(excess), eqno: eqno.replace(/[\s#]+/g, " ").trim(),
                id: host ? host.id : "", tex: (texOf.get(c) || "").replace(/\s+/g, " ").trim().slice(0, 90)});
    }
  }
  // Displays book.js scaled down to fit (a scale below 0.8 is worth splitting into aligned lines).
  const shrunk = [...document.querySelectorAll('mjx-container[data-book-scale]')].map(c => {
    const host = c.closest("div.math, .math");
    const eqno = host ? (host.querySelector(".eqno") || {}).textContent || "" : "";
    return {scale: parseFloat(c.dataset.bookScale), eqno: eqno.replace(/[\s#]+/g, " ").trim(),
            tex: (texOf.get(c) || "").replace(/\s+/g, " ").trim().slice(0, 90)};
  });
  const images = [...article.querySelectorAll("img")].map(img => {
    const r = img.getBoundingClientRect();
    const fig = img.closest("figure");
    const cap = fig ? (fig.querySelector("figcaption .caption-number") || {}).textContent || "" : "";
    return {src: img.currentSrc || img.src, shown: r.width, natural: img.naturalWidth,
            label: cap.trim(), visible: r.width > 0};
  });
  // Blocks that scroll sideways (math is counted above, as cut equations).
  const side = [];
  for (const e of article.querySelectorAll("*")) {
    if (e.closest("mjx-container")) continue;
    const ox = getComputedStyle(e).overflowX;
    if ((ox === "auto" || ox === "scroll") && e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0) {
      const line = ([...e.textContent.split("\n")].sort((a, b) => b.length - a.length)[0] || "");
      side.push({tag: e.tagName.toLowerCase() + (e.className ? "." + String(e.className).split(" ")[0] : ""),
                 excess: e.scrollWidth - e.clientWidth, text: line.trim().slice(0, 90)});
    }
  }
  // Printed outputs whose lines wrap: more lines on the screen than in the text (a printed table
  // only lines up on one line each). Counted by the distinct tops of the text's line boxes.
  const wrapped = [];
  const lineRange = document.createRange();
  for (const pre of article.querySelectorAll("div.cell_output div.output:not(.text_html) pre")) {
    if (pre.closest("details:not([open])") || pre.getBoundingClientRect().height === 0) continue;
    const text = pre.textContent.replace(/\n+$/, "");
    if (!text) continue;
    lineRange.selectNodeContents(pre);
    const tops = new Set([...lineRange.getClientRects()].filter(r => r.width > 0 && r.height > 0)
      .map(r => Math.round(r.top)));
    const lines = text.split("\n").filter(l => l.length > 0).length;
    if (tops.size > lines) {
      const line = ([...text.split("\n")].sort((a, b) => b.length - a.length)[0] || "");
      wrapped.push({lines, shown: tops.size, text: line.trim().slice(0, 90)});
    }
  }
  // The page wider than the window, and the elements that stick out past its right edge.
  const pageWidth = Math.max(document.documentElement.scrollWidth, document.body.scrollWidth);
  const sticking = [];
  if (pageWidth > vw + 1) {
    for (const e of document.body.querySelectorAll("*")) {
      const r = e.getBoundingClientRect();
      const clipped = (el) => { for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
        if (getComputedStyle(a).overflowX !== "visible") return true; } return false; };
      if (r.right > vw + 1 && r.width > 0 && !clipped(e) &&
          ![...e.children].some(ch => ch.getBoundingClientRect().right > vw + 1)) {
        sticking.push({tag: e.tagName.toLowerCase(), right: Math.round(r.right), text: (e.textContent || "").trim().slice(0, 60)});
        if (sticking.length >= 5) break;
      }
    }
  }
  // Words of the prose and its tables broken across two lines, outside math and code blocks: a
  // word is a run of letters, digits and underscores (a line may break at anything else).
  const broken = [];
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT, {
    acceptNode: n => (n.parentElement.closest("mjx-container, pre, div.highlight, details:not([open])")
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT)});
  const range = document.createRange();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.data.includes("://")) continue;  // a URL breaks where it must
    const re = /[\p{L}\p{N}_]+/gu;
    for (let m = re.exec(n.data); m; m = re.exec(n.data)) {
      // a phone's line holds about 40 characters: a word longer than 14, or part of a name or
      // path longer than 24 (attn_np.instruments.flash_parts.layer_speed), may break where it must
      let a = m.index, b = m.index + m[0].length;  // the run without spaces it is part of
      while (a > 0 && !/\s/.test(n.data[a - 1])) a--;
      while (b < n.data.length && !/\s/.test(n.data[b])) b++;
      if (m[0].length < 2 || m[0].length > 14 || b - a > 24) continue;
      range.setStart(n, m.index);
      range.setEnd(n, m.index + m[0].length);
      const rects = [...range.getClientRects()].filter(r => r.width > 0);
      if (rects.length > 1 && rects[1].top > rects[0].top + 1) {
        broken.push({word: m[0], where: (n.parentElement.closest("table") ? "table" : "prose"),
                     width: Math.round(n.parentElement.getBoundingClientRect().width),
                     text: n.data.replace(/\s+/g, " ").trim().slice(0, 80)});
      }
    }
  }
  // Code: notebook input cells and library source printed by show_source (a highlighted block in an
  // HTML output), as a share of the article's height.
  // Code folded in a closed <details> (hide-input, hide-cell) takes no room on the page, but Chromium
  // still gives it a box of its full height: leave it out.
  const shown = (e) => !e.closest("details:not([open])");
  const height = (els) => [...els].filter(shown).reduce((s, e) => s + e.getBoundingClientRect().height, 0);
  const inputs = height(article.querySelectorAll("div.cell_input"));
  const source = height([...article.querySelectorAll("div.cell_output div.text_html div.highlight")]);
  const articleHeight = article.getBoundingClientRect().height;
  return {
    url: location.href, viewport: vw,
    height: document.documentElement.scrollHeight,
    displays: document.querySelectorAll('mjx-container[display="true"]').length,
    cut, shrunk, images, side, pageWidth, sticking, broken, wrapped,
    codeShare: articleHeight ? (inputs + source) / articleHeight : 0,
    inputShare: articleHeight ? inputs / articleHeight : 0,
  };
}
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory: Path):
    """Serve ``directory`` on 127.0.0.1 (a free port); return (server, base URL)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def html_pages(root: Path) -> list[str]:
    pages = [p.relative_to(root).as_posix() for p in root.rglob("*.html")]
    return sorted(
        p
        for p in pages
        if not p.startswith(("_static/", "_sources/", "_images/"))
    )


def local_file(url: str, html: Path) -> Path | None:
    path = unquote(urlsplit(url).path).lstrip("/")
    target = html / path
    return target if target.is_file() else None


@functools.cache
def png_record(path: str) -> tuple[float, float, str, bool]:
    """(smallest text in pt, dpi, which text, recorded?) of a PNG the book shows."""
    from PIL import Image

    with Image.open(path) as im:
        info = dict(im.info)
        text = getattr(im, "text", {}) or {}
    if TEXT_KEY in text:
        return (
            float(text[TEXT_KEY]),
            float(text.get(DPI_KEY, DEFAULT_DPI)),
            text.get(WHAT_KEY, ""),
            True,
        )
    dpi = info.get("dpi", (DEFAULT_DPI, DEFAULT_DPI))[0] or DEFAULT_DPI
    return DEFAULT_TEXT_PT, float(round(dpi)), "", False


def figure_text(images: list[dict], html: Path) -> list[dict]:
    """Each shown PNG with its smallest text in CSS px: pt x dpi / 72 x shown / natural width."""
    out = []
    for img in images:
        path = local_file(img["src"], html)
        if (
            path is None
            or path.suffix.lower() != ".png"
            or not img["visible"]
            or not img["natural"]
        ):
            continue
        pt, dpi, what, recorded = png_record(str(path))
        scale = img["shown"] / img["natural"]
        out.append(
            dict(
                img,
                file=path.name,
                pt=pt,
                dpi=dpi,
                scale=scale,
                px=pt * dpi / 72 * scale,
                what=what,
                recorded=recorded,
            )
        )
    return out


def measure(
    html: Path,
    pages: list[str] | None = None,
    viewports=VIEWPORTS,
    timeout_ms=30_000,
):
    """{(page, viewport name): probe result with figure text} for every page at every window size."""
    from playwright.sync_api import sync_playwright

    pages = pages or html_pages(html)
    server, base = serve(html)
    results = {}
    try:
        with (
            sync_playwright() as pw,
            tempfile.TemporaryDirectory() as profile,
        ):
            for name, (w, h) in viewports.items():
                context = pw.chromium.launch_persistent_context(
                    profile + "-" + name,
                    executable_path=CHROMIUM,
                    headless=True,
                    args=CHROMIUM_FLAGS,
                    viewport={"width": w, "height": h},
                    service_workers="block",
                )
                context.route(
                    "**/*",
                    lambda route: (
                        route.continue_()
                        if urlsplit(route.request.url).hostname
                        in ("127.0.0.1", "localhost")
                        else route.abort()
                    ),
                )
                page = context.new_page()
                page.set_default_timeout(
                    120_000
                )  # a busy machine is slow, not wrong
                for rel in pages:
                    page.goto(base + rel, wait_until="load")
                    try:  # never hang on a request that does not finish: the probe waits
                        page.wait_for_load_state(
                            "networkidle", timeout=15_000
                        )
                    except Exception:
                        pass
                    probe = page.evaluate(PROBE, timeout_ms)
                    probe["figures"] = figure_text(probe["images"], html)
                    results[rel, name] = probe
                context.close()
    finally:
        server.shutdown()
        server.server_close()
    return results


def smallest(figures: list[dict]) -> str:
    if not figures:
        return "-"
    f = min(figures, key=lambda f: f["px"])
    return f"{'' if f['recorded'] else '~'}{f['px']:.1f}"


def table(results) -> str:
    pages = sorted({rel for rel, _ in results})
    head = (
        f"{'page':44s} | {'height':>6s} {'cut':>3s} {'fig px':>6s} {'side':>4s} {'wide':>4s} {'code':>4s}"
        f" | {'height':>6s} {'cut':>3s} {'fig px':>6s} {'side':>4s} {'wide':>4s}"
    )
    lines = [
        f"{'':44s} | {'desktop 1280x900':^34s} | {'phone 390x844':^29s}",
        head,
        "-" * len(head),
    ]
    for rel in pages:
        row = f"{rel[:44]:44s} |"
        for name in VIEWPORTS:
            p = results.get((rel, name))
            if p is None:
                continue
            row += (
                f" {p['height']:6d} {len(p['cut']):3d} {smallest(p['figures']):>6s} {len(p['side']):4d}"
                f" {max(0, p['pageWidth'] - p['viewport']):4d}"
            )
            if name == "desktop":
                row += f" {p['codeShare']:4.0%} |"
        lines.append(row)
    return "\n".join(lines)


def details(results) -> str:
    lines = []
    for (rel, name), p in sorted(results.items()):
        items = []
        for c in p["cut"]:
            items.append(
                f"  cut {c['eqno'] or c['id'] or '(unnumbered)'} by {c['excess']} px: {c['tex']}"
            )
        for c in p.get("shrunk", []):
            if c["scale"] < 0.8:
                items.append(
                    f"  shrunk to {c['scale']:.2f} {c['eqno'] or '(unnumbered)'}: {c['tex']}"
                )
        for f in sorted(p["figures"], key=lambda f: f["px"]):
            if f["px"] < 9:
                items.append(
                    f"  figure {f['label'] or f['file']}: {f['px']:.1f} px text "
                    f"({f['pt']:g} pt at {f['dpi']:g} dpi, shown at {f['scale']:.2f}{', assumed' if not f['recorded'] else ''})"
                    + (f" {f['what']!r}" if f["what"] else "")
                )
        for s in p["side"]:
            items.append(
                f"  scrolls sideways <{s['tag']}> by {s['excess']} px: {s['text']!r}"
            )
        for s in p["sticking"]:
            items.append(
                f"  sticks out <{s['tag']}> to {s['right']} px: {s['text']!r}"
            )
        if items:
            lines.append(f"{rel} at {name}:")
            lines.extend(items)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", default=str(ROOT / "_build" / "html"))
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--no-details", action="store_true")
    ap.add_argument(
        "pages",
        nargs="*",
        help="pages relative to the HTML root (default: all)",
    )
    args = ap.parse_args(argv)
    html = Path(args.html).resolve()
    if not (html / "index.html").is_file():
        print(
            f"no built book at {html}: run `make book` first",
            file=sys.stderr,
        )
        return 2
    missing = [rel for rel in args.pages if not (html / rel).is_file()]
    if missing:
        ap.error(
            f"no such page in {html}: {', '.join(missing)} (pages are paths "
            "relative to it, e.g. notebooks/01_scaled_dot_product_attention.html)"
        )
    if not Path(CHROMIUM).exists():
        print(
            f"{CHROMIUM} is missing: run `sudo apt-get install -y chromium` "
            "(Debian's package; make browser installs it when run as root)",
            file=sys.stderr,
        )
        return 2
    results = measure(html, args.pages or None)
    text = table(results)
    if not args.no_details:
        text += "\n\n" + details(results)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
