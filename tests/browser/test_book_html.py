"""The built HTML book, read the way a reader reads it: in a real browser, with no network.

``make browser`` (part of ``make test``, after the strict book build) runs this file. Headless Chromium
(Debian's ``chromium``, installed by the set-up below when missing) opens EVERY page of ``_build/html``
from a local HTTP server on 127.0.0.1 and checks that

- every math element is typeset by the MathJax shipped inside the book (no raw ``$$``, ``\\(``, ``\\[``
  left in the text, no MathJax error boxes);
- every image loads (``naturalWidth > 0``) and has alt text or a figure caption;
- no request leaves 127.0.0.1 (every other request is blocked and counted) and the console shows no
  errors, a missing favicon included;
- the table of contents reaches every page listed in ``_toc.yml`` (whatever is in it today), and every
  internal link and cross-reference resolves: the target file exists and its ``#anchor`` is an id on it.

Every page is also opened in a 390x844 phone window (touch), and at both sizes the test measures what a
reader sees with ``scripts/page_stats.py``'s probe (the numbers ``make stats`` prints): no display
equation wider than its box; on a phone, no word of the prose or a table broken across lines; no raw
MyST (``{cite}``, ``{eq}``, an equation's ``(label)``, a pipe table as text) in the prose; no page
wider than the phone's window; no block scrolling sideways at 1280 px; no figure text below
``MIN_TEXT_PX`` as shown at 1280 px, and on a phone every figure whose text is smaller opens on a tap
in book.js's viewer with its text at ``MIN_TEXT_PX`` or more (and the page no wider); a tap opens the
phone's navigation and page-contents dialogs and ☰ hides the sidebar at 1280 px; the front page's map
links every page of ``_toc.yml``.

A full-page screenshot of every page at both sizes is saved under ``_build/screenshots/``
(``NAME.jpg`` at 1280 px, ``NAME__phone.jpg`` at 390 px) for a person to look at. No check reads
them, and they cost about a sixth of the test's CPU time (94 s with them, 78 s without, here), so
``BOOK_SCREENSHOTS=0`` (what ``make test`` sets) skips them; every probe and check still runs at both sizes.
The last line printed says how many pages, math elements, images, external requests and console errors
were counted, and how long it took. ``BOOK_HTML`` points the test at another built book.

It is not collected by ``make unit`` (``--ignore=tests/browser``): it needs the book built first.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import page_stats  # noqa: E402  (scripts/ is not a package)

from attn_np.instruments.plotting import MIN_TEXT_PX  # noqa: E402

HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
SCREENSHOTS = HTML.parent / "screenshots"
TOC = ROOT / "_toc.yml"
# One Chromium and one set of flags for the test and for `make stats`.
CHROMIUM, CHROMIUM_FLAGS = page_stats.CHROMIUM, page_stats.CHROMIUM_FLAGS
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
VIEWPORTS = (
    page_stats.VIEWPORTS
)  # {"desktop": (1280, 900), "phone": (390, 844)}
MATH_TIMEOUT_MS = 30_000
# Full-page screenshots for a person to look at (no check reads them): BOOK_SCREENSHOTS=0 skips them.
SCREENSHOTS_WANTED = os.environ.get("BOOK_SCREENSHOTS", "1") != "0"


# --- set-up: Chromium and a local server ---------------------------------------------------------


def ensure_chromium() -> str:
    """Return Chromium's path, installing Debian's package first when it is missing (CI runs as root)."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if os.geteuid() != 0:
        pytest.fail(
            f"{CHROMIUM} is missing: run `sudo apt-get install -y chromium` (Debian's package)"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env
    )
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"apt-get installed chromium but {CHROMIUM} is still missing"
        )
    return CHROMIUM


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(
        self, *args
    ):  # one line per request would drown the test output
        pass


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


# --- what the browser reports about one page -----------------------------------------------------

# Runs in the page once MathJax (if the page loads it) has finished and fonts are in.
PAGE_PROBE = r"""
async (timeoutMs) => {
  let mathTimedOut = false;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    const done = (async () => {
      await MathJax.startup.promise;
      if (MathJax.typesetPromise) await MathJax.typesetPromise();
      return true;
    })();
    const timer = new Promise(resolve => setTimeout(() => resolve(false), timeoutMs));
    mathTimedOut = !(await Promise.race([done, timer]));
  }
  await document.fonts.ready;
  // Images below the fold may be lazy: load every one, then wait for each to finish or fail.
  for (const img of document.images) img.loading = "eager";
  await Promise.race([
    Promise.all([...document.images].map(img => img.complete ? null :
      new Promise(resolve => { img.addEventListener("load", resolve); img.addEventListener("error", resolve); }))),
    new Promise(resolve => setTimeout(resolve, timeoutMs)),
  ]);

  const skip = "pre, code, script, style, textarea, mjx-container, .highlight";
  const raw = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (el && el.closest(skip)) continue;
    // $$, \( \) \[ \] or \begin{, or $...$ holding TeX (a backslash, ^, _ or {): math MathJax never saw.
    const t = n.textContent;
    if (/\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{/.test(t) || /\$[^$\n]*[\\^_{][^$\n]*\$/.test(t)) {
      raw.push(t.trim().slice(0, 80));
    }
  }
  const mathEls = [...document.querySelectorAll("span.math, div.math")];
  const untypeset = mathEls.filter(e => !e.querySelector("mjx-container")).map(e => e.textContent.slice(0, 80));

  const images = [...document.images].map(img => ({
    src: img.currentSrc || img.src,
    loaded: img.complete && img.naturalWidth > 0,
    alt: (img.getAttribute("alt") || "").trim(),
    caption: ((img.closest("figure") || {}).querySelector ?
              (img.closest("figure").querySelector("figcaption") || {}).textContent || "" : "").trim(),
  }));

  const links = [...document.querySelectorAll("a[href]")].map(a => a.href);
  const ids = [...document.querySelectorAll("[id]")].map(e => e.id)
    .concat([...document.querySelectorAll("a[name]")].map(a => a.name));
  // Headless Chromium does not fetch favicons by itself, where a reader's browser does (and logs a
  // 404 when there is none): fetch the declared one, or /favicon.ico when none is declared.
  const icon = document.querySelector('link[rel~="icon"]');
  const iconHref = icon ? icon.href : new URL("/favicon.ico", location.href).href;
  let favicon;
  try {
    const r = await fetch(iconHref);
    favicon = {href: iconHref, declared: !!icon, ok: r.ok, type: r.headers.get("content-type") || ""};
  } catch (err) {
    favicon = {href: iconHref, declared: !!icon, ok: false, type: String(err)};
  }
  const navLinks = [...document.querySelectorAll("nav.bd-links a[href], #bd-docs-nav a[href]")].map(a => a.href);
  // Code and output blocks that scroll sideways at this window width: a reader would have to scroll
  // each line into view. Every block the article shows is checked, inputs, outputs and show_source.
  const scrolling = [...document.querySelectorAll("article pre, article div.highlight, article table")]
    .filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => ({tag: e.tagName.toLowerCase(), excess: e.scrollWidth - e.clientWidth,
                text: ([...e.textContent.split("\n")].sort((a, b) => b.length - a.length)[0] || "").slice(0, 90)}));
  return {
    url: location.href,
    mathjax: !!(window.MathJax && MathJax.version),
    mathTimedOut,
    mathElements: mathEls.length,
    typeset: document.querySelectorAll("mjx-container").length,
    mathErrors: document.querySelectorAll("mjx-merror").length,
    untypeset, raw, images, links, ids, navLinks, favicon, scrolling,
    blocks: document.querySelectorAll("article pre").length,
  };
}
"""


# MyST that did not render: a role, an equation's label, a pipe table shown as text. Text inside code,
# math and scripts is skipped (the book shows roles in code literals on purpose).
RAW_MYST_PROBE = r"""
() => {
  const skip = "pre, code, script, style, textarea, mjx-container, .highlight, .math, kbd";
  const found = [];
  const article = document.querySelector("article") || document.body;
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip)) continue;
    const t = n.textContent;
    let m = t.match(/\{(cite(:[a-z]+)?|eq|numref|doc|ref|term|download|math)\}`?/)
         || t.match(/\((eq|fig|tab|sec)-[A-Za-z0-9_-]+\)/)
         || t.match(/\|\s*:?-{3,}:?\s*\|/)
         || t.match(/^\s*\|[^|\n]+\|[^|\n]+\|/m);
    if (m) found.push(t.trim().replace(/\s+/g, " ").slice(0, 100));
  }
  return found;
}
"""

# Taps and clicks a reader makes: the phone's ☰ and page-contents buttons open their dialogs, and
# ☰ at 1280 px hides the sidebar (a second click shows it again).
# book.js's figure viewer, opened on one figure (by its src) the way a tap opens it: what it shows
# (the enlarged image's width against its natural width), whether the page stayed as wide as the
# window, and whether Escape shut it.
VIEWER_PROBE = r"""
async (src) => {
  const img = [...document.querySelectorAll("article img")].find(i => (i.currentSrc || i.src) === src);
  if (!img) return {error: "no such image"};
  if (!window.bookOpenFigure) return {error: "book.js's bookOpenFigure is missing"};
  const viewer = await window.bookOpenFigure(img);
  if (!viewer) return {error: "the viewer did not open (the figure was judged legible)"};
  const big = viewer.querySelector("img");
  if (!big.complete) await new Promise(r => { big.onload = r; big.onerror = r; });
  const vw = window.innerWidth;
  const out = {shown: big.getBoundingClientRect().width, natural: big.naturalWidth,
               fixed: getComputedStyle(viewer).position === "fixed",
               pageWidth: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth),
               window: vw, pans: viewer.scrollWidth > viewer.clientWidth + 1 || big.getBoundingClientRect().width <= vw};
  document.dispatchEvent(new KeyboardEvent("keydown", {key: "Escape"}));
  out.closed = !document.querySelector(".book-figure-viewer");
  return out;
}
"""


NAV_STATE = r"""
() => {
  const visible = (sel) => [...document.querySelectorAll(sel)].filter(b => b.offsetParent !== null).length;
  const dialog = (id) => {
    const d = document.getElementById(id);
    return {open: !!(d && d.open), links: d ? d.querySelectorAll("a[href]").length : 0,
            width: d && d.open ? d.getBoundingClientRect().width : 0};
  };
  const side = document.getElementById("pst-primary-sidebar");
  const r = side ? side.getBoundingClientRect() : {width: 0, right: 0};
  return {primaryToggles: visible(".primary-toggle"), secondaryToggles: visible(".secondary-toggle"),
          primary: dialog("pst-primary-sidebar-modal"), secondary: dialog("pst-secondary-sidebar-modal"),
          sidebarShown: !!side && r.width > 50 && r.right > 50 && getComputedStyle(side).visibility !== "hidden"};
}
"""


async def until(page, predicate: str, timeout_ms: int = 5_000) -> None:
    """Wait until the JavaScript ``predicate`` holds on ``page``, at most
    ``timeout_ms``: a reader's tap takes effect when the theme has done its
    work, not after a fixed pause. A timeout is not an error here: the
    state is read afterwards and the test judges it."""
    try:
        await page.wait_for_function(predicate, timeout=timeout_ms)
    except (
        Exception
    ):  # playwright's TimeoutError: the check reports the state
        pass


def _state_is(key: str, field: str, want: bool) -> str:
    """A predicate on NAV_STATE: ``NAV_STATE()[key][field] == want`` (or,
    for the sidebar, ``NAV_STATE().sidebarShown == want``)."""
    got = f"s.{key}" if field == "" else f"s.{key}.{field}"
    return f"() => {{ const s = ({NAV_STATE})(); return !!{got} === {str(want).lower()}; }}"


async def try_navigation(
    page, base: str, rel: str, phone: bool, net
) -> dict:
    """Open ``rel``, use its navigation as a reader would, and say what opened."""
    await page.goto(base + rel, wait_until="load")
    await (
        net.quiet()
    )  # the theme wires its buttons by the time the page has loaded
    out = {"page": rel, "before": await page.evaluate(NAV_STATE)}
    if phone:
        for which, sel, key in (
            ("navigation", ".primary-toggle", "primary"),
            ("page contents", ".secondary-toggle", "secondary"),
        ):
            buttons = [
                b
                for b in await page.query_selector_all(sel)
                if await b.is_visible()
            ]
            if not buttons:
                out[which] = {"error": f"no visible {sel} button"}
                continue
            await buttons[0].tap()
            await until(page, _state_is(key, "open", True))
            out[which] = (await page.evaluate(NAV_STATE))[key]
            await page.keyboard.press("Escape")
            await until(page, _state_is(key, "open", False))
        out["figure"] = await try_figure_tap(page)
    else:
        buttons = [
            b
            for b in await page.query_selector_all(".primary-toggle")
            if await b.is_visible()
        ]
        if not buttons:
            out["toggle"] = {
                "error": "no visible ☰ (.primary-toggle) button"
            }
            return out
        await buttons[0].click()
        await until(page, _state_is("sidebarShown", "", False))
        hidden = await page.evaluate(NAV_STATE)
        await buttons[0].click()
        await until(page, _state_is("sidebarShown", "", True))
        out["toggle"] = {
            "after one click": hidden,
            "after two": await page.evaluate(NAV_STATE),
        }
    return out


async def try_figure_tap(page) -> dict:
    """Tap the page's first figure as a reader would (the viewer should
    open over the page), then tap the viewer (it should close)."""
    figures = page.locator("article figure img")
    if await figures.count() == 0:
        return {"error": "no captioned figure on the page"}
    url = page.url
    await figures.first.tap()
    await until(
        page, "() => !!document.querySelector('.book-figure-viewer')"
    )
    out = {
        "opened": await page.evaluate(
            "() => !!document.querySelector('.book-figure-viewer')"
        ),
        "stayed": page.url == url,
    }
    if out["opened"]:
        await page.locator(".book-figure-viewer").tap()
        await until(
            page, "() => !document.querySelector('.book-figure-viewer')"
        )
    out["closed"] = await page.evaluate(
        "() => !document.querySelector('.book-figure-viewer')"
    )
    return out


@dataclass
class BookReport:
    base: str = ""
    pages: dict = field(
        default_factory=dict
    )  # path relative to _build/html -> probe result
    external: list = field(
        default_factory=list
    )  # (page, url) of blocked requests
    console: list = field(
        default_factory=list
    )  # (page, text) of console errors and page errors
    failed: list = field(
        default_factory=list
    )  # (page, url, why) of local requests that failed
    extras: dict = field(
        default_factory=dict
    )  # MathJax's own loader and the search page, probed last
    views: dict = field(
        default_factory=dict
    )  # (page, "desktop" | "phone") -> page_stats.PROBE result, with figures and raw MyST
    nav: dict = field(
        default_factory=dict
    )  # "desktop" | "phone" -> what a click or tap on the navigation opened
    seconds: float = 0.0

    @property
    def math(self) -> int:
        return sum(p["typeset"] for p in self.pages.values())

    @property
    def enlarged(self) -> int:
        """Phone figures too small to read that book.js's viewer opened."""
        return sum(
            "shown" in f.get("viewer", {})
            for (_, name), v in self.views.items()
            if name == "phone"
            for f in v["figures"]
        )

    @property
    def images(self) -> int:
        return sum(len(p["images"]) for p in self.pages.values())

    def summary(self) -> str:
        return (
            f"browser test: {len(self.pages)} pages tested at 1280 and 390 px, "
            f"{self.math} math elements typeset, "
            f"{self.images} images checked, {len(self.external)} external requests, "
            f"{len(self.console)} console errors, "
            f"{self.enlarged} phone figures enlarged on a tap, "
            f"{sum(len(p['scrolling']) for p in self.pages.values())} of "
            f"{sum(p['blocks'] for p in self.pages.values())} code blocks "
            f"scrolling sideways, {self.seconds:.1f} s"
            + (
                ""
                if SCREENSHOTS_WANTED
                else " (no screenshots: BOOK_SCREENSHOTS=0)"
            )
        )


def html_pages(root: Path) -> list[str]:
    """Every HTML page of the built book: not the theme's template fragments under _static/."""
    pages = [p.relative_to(root).as_posix() for p in root.rglob("*.html")]
    return sorted(
        p
        for p in pages
        if not p.startswith(("_static/", "_sources/", "_images/"))
    )


def local_path(url: str, base: str) -> str | None:
    """``http://127.0.0.1:PORT/book/x.html#y`` -> ``book/x.html``; None for a URL off this server."""
    if not url.startswith(base):
        return None
    path = unquote(urlsplit(url).path).lstrip("/")
    return path + "index.html" if path == "" or path.endswith("/") else path


# TeX that only typesets if MathJax can fetch its extensions (autoload) from its own folder in the book:
# the path Sphinx writes for MathJax is also the root MathJax's loader derives for every later file.
AUTOLOAD_PROBE = r"""
async () => {
  try {
    const node = await MathJax.tex2chtmlPromise("\\boldsymbol{x} \\cancel{y} \\bbox[2pt]{z} \\color{red}{w}");
    return {errors: node.querySelectorAll("mjx-merror").length, message: ""};
  } catch (err) {
    return {errors: 1, message: String(err)};
  }
}
"""


async def extra_probes(page, base: str, report: BookReport, net) -> dict:
    """Two checks that no single page view makes: MathJax's lazy loading, and a search that finds pages."""
    extras = {}
    with_math = [rel for rel, p in report.pages.items() if p["mathjax"]]
    if with_math:
        await page.goto(base + with_math[0], wait_until="load")
        await page.evaluate("async () => { await MathJax.startup.promise; }")
        extras["autoload"] = await page.evaluate(AUTOLOAD_PROBE)
        await net.quiet()  # the extensions MathJax fetched, before leaving
    if "search.html" in report.pages:
        await page.goto(base + "search.html?q=attention", wait_until="load")
        try:
            await page.wait_for_selector(
                "#search-results ul.search li", timeout=15_000
            )
        except Exception:
            pass
        extras["search_hits"] = await page.locator(
            "#search-results ul.search li"
        ).count()
        await net.quiet()
    return extras


class Requests:
    """The requests one tab has in flight. ``quiet()`` waits until none is
    (bounded), so a page is left only when everything it asked for has
    arrived or failed: a request cut off by the next page would be a
    failure charged to the wrong page. (Playwright's ``networkidle`` waits
    for 500 ms of silence after the last one, on every page.)"""

    def __init__(self, page):
        self.pending = set()
        page.on("request", lambda r: self.pending.add(r))
        page.on("requestfinished", lambda r: self.pending.discard(r))
        page.on("requestfailed", lambda r: self.pending.discard(r))

    async def quiet(self, timeout_s: float = 15.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)


# A page that sends the reader on (<meta http-equiv="refresh">), as the book's index.html does.
REFRESH = re.compile(r"<meta[^>]+http-equiv=[\"']?refresh", re.IGNORECASE)

# Tabs open at once for each window size. Two per size on 2 cores: while one tab waits for its page,
# MathJax or a screenshot, the other works (BOOK_TABS overrides it).
TABS = int(os.environ.get("BOOK_TABS", "2"))


def nav_page(root: Path) -> str:
    """The page the navigation is tried on: the first chapter (a long page with a page-contents
    list), or the front page when there is no chapter."""
    chapters = [p for p in html_pages(root) if p.startswith("notebooks/")]
    return chapters[0] if chapters else "index.html"


async def _browse(root: Path, report: BookReport, chromium: str) -> None:
    """Every page at both window sizes in one Chromium: one browser context per size (the phone's
    with touch and a mobile viewport), ``TABS`` tabs in each, taking the pages from one queue."""
    from playwright.async_api import async_playwright

    base = report.base
    pages = html_pages(root)

    async def open_tab(context, name: str):
        """A tab that blocks every request off 127.0.0.1 and charges what goes wrong (console
        errors, page errors, failed requests) to the page it is showing."""
        page = await context.new_page()
        current = {"page": ""}

        async def on_route(route):
            host = urlsplit(route.request.url).hostname
            if host in LOCAL_HOSTS:
                await route.continue_()
            else:
                report.external.append((current["page"], route.request.url))
                await route.abort()

        def on_console(msg):
            if msg.type == "error":
                report.console.append(
                    (
                        current["page"],
                        f"{msg.text} ({msg.location.get('url', '')})",
                    )
                )

        def on_response(response):
            if response.status >= 400:
                report.failed.append(
                    (
                        current["page"],
                        response.url,
                        f"HTTP {response.status}",
                    )
                )

        def on_failed(request):
            # Chromium fetches a page's favicon by itself, after "load", and drops that fetch
            # (net::ERR_ABORTED) when the tab moves on: seen once in a run alone here, on one page
            # of 46. Whether every page's favicon is there and an image is the probe's own fetch's
            # check (test_every_page_has_a_favicon); an abort of the browser's copy says nothing.
            if (
                urlsplit(request.url).path.endswith("/favicon.png")
                and request.failure == "net::ERR_ABORTED"
            ):
                return
            if urlsplit(request.url).hostname in LOCAL_HOSTS:
                report.failed.append(
                    (
                        current["page"],
                        request.url,
                        request.failure or "failed",
                    )
                )

        net = Requests(page)
        await page.route("**/*", on_route)
        page.on("console", on_console)
        page.on(
            "pageerror",
            lambda err: report.console.append(
                (current["page"], f"page error: {err}")
            ),
        )
        page.on("response", on_response)
        page.on("requestfailed", on_failed)
        return page, current, net

    async def view(page, current, net, name: str, rel: str) -> None:
        """One page at one window size: the probes, then a full-page screenshot."""
        phone = name == "phone"
        current["page"] = rel if not phone else f"{rel} (390 px)"
        await page.goto(base + rel, wait_until="load")
        if REFRESH.search((root / rel).read_text(errors="replace")):
            # a redirect page (index.html): measure the page it leads to
            await page.wait_for_url(
                lambda url: url != base + rel, wait_until="load"
            )
        await net.quiet()
        if not phone:
            report.pages[rel] = await page.evaluate(
                PAGE_PROBE, MATH_TIMEOUT_MS
            )
        probe = await page.evaluate(page_stats.PROBE, MATH_TIMEOUT_MS)
        probe["figures"] = page_stats.figure_text(probe["images"], root)
        probe["rawMyst"] = await page.evaluate(RAW_MYST_PROBE)
        if phone:
            # every figure too small to read as shown, opened in book.js's viewer
            for f in probe["figures"]:
                if f["recorded"] and f["px"] < MIN_TEXT_PX:
                    f["viewer"] = await page.evaluate(VIEWER_PROBE, f["src"])
        report.views[rel, name] = probe
        # fonts MathJax asked for while typesetting, before the picture
        await page.evaluate("async () => { await document.fonts.ready; }")
        await net.quiet()
        if not SCREENSHOTS_WANTED:
            return
        stem = rel[: -len(".html")].replace("/", "__")
        # JPEG at both sizes: a full-page PNG of a 25,000 px chapter takes about 1.4x as long
        # to capture and encode, and nothing reads the pictures but a person
        suffix = "__phone.jpg" if phone else ".jpg"
        await page.screenshot(
            path=str(SCREENSHOTS / f"{stem}{suffix}"),
            full_page=True,
            type="jpeg",
            quality=80,
        )

    async def one_size(browser, name: str) -> None:
        width, height = VIEWPORTS[name]
        phone = name == "phone"
        context = await browser.new_context(
            viewport={"width": width, "height": height},
            has_touch=phone,
            is_mobile=phone,
            service_workers="block",
        )
        context.set_default_timeout(
            120_000
        )  # a busy machine is slow, not wrong
        queue = list(pages)
        tabs = [await open_tab(context, name) for _ in range(TABS)]

        async def work(tab):
            while queue:
                await view(*tab, name, queue.pop(0))

        await asyncio.gather(*(work(tab) for tab in tabs))
        page, current, net = tabs[0]
        current["page"] = f"(navigation at {name})"
        report.nav[name] = await try_navigation(
            page, base, nav_page(root), phone, net
        )
        if not phone:
            current["page"] = "(extra probes: MathJax autoload, search)"
            report.extras = await extra_probes(page, base, report, net)
        await context.close()

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            await asyncio.gather(
                *(one_size(browser, name) for name in VIEWPORTS)
            )
        finally:
            await browser.close()


def browse(root: Path) -> BookReport:
    report = BookReport()
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)
    SCREENSHOTS.mkdir(parents=True)
    start = time.perf_counter()
    server, report.base = serve(root)
    chromium = ensure_chromium()
    try:
        asyncio.run(_browse(root, report, chromium))
    finally:
        server.shutdown()
        server.server_close()
    # every page in the order html_pages lists them, whichever tab finished it first
    report.pages = dict(sorted(report.pages.items()))
    report.views = dict(sorted(report.views.items()))
    report.seconds = time.perf_counter() - start
    return report


# --- the checks ----------------------------------------------------------------------------------


def toc_files(toc_path: Path = TOC) -> list[str]:
    """Every page ``_toc.yml`` lists (root first), as the HTML paths Sphinx writes for them."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [re.sub(r"\.(md|ipynb|rst)$", "", f) + ".html" for f in files]


@pytest.fixture(scope="module")
def report(request) -> BookReport:
    if not (HTML / "index.html").exists():
        pytest.fail(
            f"no built book at {HTML}: run `make book` (or `make book-strict`) first"
        )
    result = browse(HTML)
    (SCREENSHOTS / "summary.txt").write_text(result.summary() + "\n")
    request.config.book_browser_summary = (
        result.summary()
    )  # printed last by tests/browser/conftest.py
    return result


def _listing(items, limit=20) -> str:
    items = list(items)
    return "\n".join(map(str, items[:limit])) + (
        f"\n... and {len(items) - limit} more" if len(items) > limit else ""
    )


def test_every_page_was_opened_and_screenshotted(report):
    expected = html_pages(HTML)
    assert expected, f"no HTML pages under {HTML}"
    assert sorted(report.pages) == expected
    for name in VIEWPORTS:
        assert (
            sorted(rel for rel, n in report.views if n == name) == expected
        )
    if not SCREENSHOTS_WANTED:
        return  # BOOK_SCREENSHOTS=0: every page opened, none pictured
    shots = {p.name for p in SCREENSHOTS.glob("*.*")}
    missing = [
        stem + suffix
        for p in expected
        for stem in [p[: -len(".html")].replace("/", "__")]
        for suffix in (".jpg", "__phone.jpg")
        if stem + suffix not in shots
    ]
    assert not missing, f"no screenshot for: {missing}"


def test_no_block_scrolls_sideways(report):
    """At a 1280 px window no code, output or table block needs a sideways
    scroll: what the book shows fits its column."""
    blocks = sum(p["blocks"] for p in report.pages.values())
    wide = [
        f"{rel}: <{b['tag']}> {b['excess']} px too wide: {b['text']!r}"
        for (rel, name), v in report.views.items()
        if name == "desktop"
        for b in v["side"]
    ]
    assert blocks > 0, (
        "no <pre> block found: the check would pass on anything"
    )
    assert not wide, f"{len(wide)} blocks scroll sideways:\n" + _listing(
        wide
    )


def test_no_table_scrolls_sideways_on_a_phone(report):
    """At 390 px only code may scroll inside its block: a table's cells wrap
    (book.css), so no table needs a sideways scroll."""
    tables = [
        f"{rel}: <{b['tag']}> {b['excess']} px too wide: {b['text']!r}"
        for (rel, name), v in report.views.items()
        if name == "phone"
        for b in v["side"]
        if "table" in b["tag"]
    ]
    assert not tables, f"{len(tables)} tables scroll sideways:\n" + _listing(
        tables
    )


def test_no_page_is_wider_than_the_window(report):
    """At 390 px (and at 1280 px) the page itself never scrolls sideways: a
    long literal, URL, table or figure stays inside the screen."""
    wide = [
        f"{rel} at {name}: {v['pageWidth'] - v['viewport']} px wider than the window; "
        f"sticking out: {v['sticking'][:2]}"
        for (rel, name), v in sorted(report.views.items())
        if v["pageWidth"] > v["viewport"] + 1
    ]
    assert not wide, _listing(wide)


def test_no_display_equation_is_cut(report):
    """No display equation's typeset content is wider than its box, at 1280
    px or at 390 px (overlay scroll bars hide the rest from a reader)."""
    displays = sum(v["displays"] for v in report.views.values())
    cut = [
        f"{rel} at {name}: Eq. {c['eqno'] or '(unnumbered)'} is {c['excess']} px "
        f"too wide: {c['tex']}"
        for (rel, name), v in sorted(report.views.items())
        for c in v["cut"]
    ]
    assert displays > 0, (
        "no display equation found: the check would pass on anything"
    )
    assert not cut, f"{len(cut)} display equations cut:\n" + _listing(
        cut, 80
    )


def test_no_word_is_broken_across_lines_on_a_phone(report):
    """On a phone no word of the prose or of a table (up to 14
    characters; math, code blocks and URLs aside) runs over
    two lines: a table too wide for a phone becomes book.js's stack of
    cards instead of cutting its words every few letters."""
    broken = [
        f"{rel} at {name}: {b['word']!r} in the {b['where']} ({b['text']!r})"
        for (rel, name), v in sorted(report.views.items())
        if name == "phone"
        for b in v["broken"]
    ]
    assert not broken, f"{len(broken)} broken words:\n" + _listing(
        broken, 40
    )


def test_no_printed_output_line_wraps(report):
    """A cell's printed output keeps its lines at 1280 px and at 390 px: a
    printed table lines up only on one line (book.css keeps the lines,
    book.js scales a wide block to fit; on a phone the rest scrolls inside
    its block)."""
    wrapped = [
        f"{rel} at {name}: {w['shown']} lines on the screen for "
        f"{w['lines']} printed: {w['text']!r}"
        for (rel, name), v in sorted(report.views.items())
        for w in v["wrapped"]
    ]
    assert not wrapped, f"{len(wrapped)} printed outputs wrap:\n" + _listing(
        wrapped, 40
    )


def test_no_raw_myst_in_the_prose(report):
    """Roles, equation labels and pipe tables render: none is left as text
    (a notebook's markdown output included)."""
    raw = [
        f"{rel}: {text!r}"
        for (rel, name), v in sorted(report.views.items())
        if name == "desktop"
        for text in v["rawMyst"]
    ]
    assert not raw, f"{len(raw)} pieces of raw MyST:\n" + _listing(raw)


def test_figure_text_is_legible(report):
    """Every figure's smallest text, as shown at 1280 px, is at least
    MIN_TEXT_PX CSS px: the size it was drawn with (recorded in the PNG by
    attn_np.instruments.plotting) x dpi / 72 x the page's display scale. A
    PNG with no record fails: its text size is unknown."""
    figures = [
        (rel, f)
        for (rel, name), v in sorted(report.views.items())
        if name == "desktop"
        for f in v["figures"]
    ]
    problems = []
    for rel, f in figures:
        label = f["label"] or f["file"]
        if not f["recorded"]:
            problems.append(
                f"{rel}: {label} has no record of its text size (draw it with "
                "use_book_style() and re-execute, or save it with plotting.save_figure)"
            )
        elif f["px"] < MIN_TEXT_PX:
            problems.append(
                f"{rel}: {label}: {f['what']!r} is {f['px']:.1f} px "
                f"({f['pt']:g} pt at {f['dpi']:g} dpi shown at {f['scale']:.2f})"
            )
    assert figures, "no figure found: the check would pass on anything"
    assert not problems, f"{len(problems)} figures:\n" + _listing(
        problems, 60
    )


def test_phone_figures_too_small_to_read_open_legible_on_a_tap(report):
    """On a phone a figure drawn for the 1280 px column shows its text at
    5-8 px. Each one below MIN_TEXT_PX opens in book.js's viewer at a size
    where that text is at least MIN_TEXT_PX (the viewer aims at 12), over
    the page (which stays as wide as the window), and Escape shuts it."""
    small = [
        (rel, f)
        for (rel, name), v in sorted(report.views.items())
        if name == "phone"
        for f in v["figures"]
        if f["recorded"] and f["px"] < MIN_TEXT_PX
    ]
    problems = []
    for rel, f in small:
        label = f["label"] or f["file"]
        got = f.get("viewer", {})
        if "error" in got or not got:
            problems.append(
                f"{rel}: {label}: {got.get('error', 'not tried')}"
            )
            continue
        px = f["pt"] * f["dpi"] / 72 * got["shown"] / got["natural"]
        if px < MIN_TEXT_PX:
            problems.append(f"{rel}: {label}: {px:.1f} px in the viewer")
        if not got["fixed"] or got["pageWidth"] > got["window"] + 1:
            problems.append(f"{rel}: {label}: the viewer widened the page")
        if not got["closed"]:
            problems.append(
                f"{rel}: {label}: Escape did not shut the viewer"
            )
    assert small, (
        "no figure is too small on a phone: the check would pass on anything"
    )
    assert not problems, f"{len(problems)} figures:\n" + _listing(
        problems, 60
    )
    tap = report.nav.get("phone", {}).get("figure", {})
    assert tap.get("opened") and tap.get("stayed") and tap.get("closed"), (
        f"a tap on a figure of {report.nav.get('phone', {}).get('page')} at "
        f"390 px did not open the viewer over the page and a second tap shut it: {tap}"
    )


def test_phone_navigation_and_page_contents_open_on_a_tap(report):
    nav = report.nav.get("phone", {})
    assert nav, "the navigation was not tried at 390 px"
    for which in ("navigation", "page contents"):
        got = nav.get(which, {})
        assert got.get("open") and got.get("links", 0) > 0, (
            f"on {nav['page']} at 390 px a tap on the {which} button did not open "
            f"a dialog with links: {got} (before: {nav['before']})"
        )


def test_the_sidebar_toggle_works_at_desktop_width(report):
    nav = report.nav.get("desktop", {})
    toggle = nav.get("toggle", {})
    assert "error" not in toggle, toggle.get("error")
    assert nav["before"]["sidebarShown"], (
        f"the sidebar is not shown at 1280 px: {nav['before']}"
    )
    assert not toggle["after one click"]["sidebarShown"], (
        f"☰ at 1280 px did not hide the sidebar: {toggle}"
    )
    assert toggle["after two"]["sidebarShown"], (
        f"a second ☰ at 1280 px did not show the sidebar again: {toggle}"
    )


def test_front_page_maps_every_toc_page():
    """The front page's map (its section "The map of the book") links every
    page of _toc.yml, whatever is in it today."""
    from bs4 import BeautifulSoup

    expected = toc_files()
    root = HTML / expected[0]
    soup = BeautifulSoup(root.read_text(), "html.parser")
    section = soup.find(id="the-map-of-the-book")
    assert section is not None, (
        f"{expected[0]} has no section 'The map of the book'"
    )
    base = root.parent
    linked = set()
    for a in section.find_all("a", href=True):
        href = urldefrag(a["href"]).url
        if href and not urlsplit(href).scheme:
            linked.add(
                (base / unquote(href)).resolve().relative_to(HTML).as_posix()
            )
    missing = [f for f in expected[1:] if f not in linked]
    assert not missing, (
        f"the front page's map does not link: {missing} (add them to book/chapters.yml)"
    )


def test_math_is_typeset_offline(report):
    problems = []
    for rel, p in report.pages.items():
        if p["mathElements"] and not p["mathjax"]:
            problems.append(
                f"{rel}: {p['mathElements']} math elements but MathJax did not load"
            )
        if p["mathTimedOut"]:
            problems.append(
                f"{rel}: MathJax had not finished after {MATH_TIMEOUT_MS / 1000:.0f} s"
            )
        if p["untypeset"]:
            problems.append(
                f"{rel}: math left untypeset: {p['untypeset'][:3]}"
            )
        if p["raw"]:
            problems.append(f"{rel}: raw TeX in the text: {p['raw'][:3]}")
        if p["mathErrors"]:
            problems.append(
                f"{rel}: {p['mathErrors']} MathJax error boxes (unknown macro or bad TeX)"
            )
    assert not problems, _listing(problems)
    assert report.math > 0, (
        "no page has typeset math: the check would pass on a book that has none"
    )


def test_mathjax_loads_its_extensions_from_the_book(report):
    probe = report.extras.get("autoload")
    assert probe is not None, "no page loads MathJax"
    assert probe["errors"] == 0, (
        f"MathJax could not autoload \\boldsymbol, \\cancel, \\bbox, \\color: {probe}"
    )


def test_search_finds_pages_offline(report):
    assert report.extras.get("search_hits", 0) > 0, (
        "search.html?q=attention found nothing"
    )


def test_every_image_loads_and_is_described(report):
    problems = []
    for rel, p in report.pages.items():
        for img in p["images"]:
            if not img["loaded"]:
                problems.append(f"{rel}: image did not load: {img['src']}")
            if not (img["alt"] or img["caption"]):
                problems.append(
                    f"{rel}: image has neither alt text nor a caption: {img['src']}"
                )
    assert not problems, _listing(problems)
    assert report.images > 0, (
        "no image anywhere in the book: the intro figure should be one"
    )


def test_every_page_has_a_favicon(report):
    problems = [
        f"{rel}: {p['favicon']}"
        for rel, p in report.pages.items()
        if not (
            p["favicon"]["declared"]
            and p["favicon"]["ok"]
            and p["favicon"]["type"].startswith("image/")
        )
    ]
    assert not problems, "favicon missing or not an image:\n" + _listing(
        problems
    )


def test_no_request_leaves_localhost(report):
    assert not report.external, (
        f"{len(report.external)} external requests (blocked):\n"
        + _listing(report.external)
    )


def test_no_console_errors_or_failed_requests(report):
    assert not report.console, (
        f"{len(report.console)} console errors:\n" + _listing(report.console)
    )
    assert not report.failed, (
        f"{len(report.failed)} local requests failed:\n"
        + _listing(report.failed)
    )


def test_toc_reaches_every_chapter(report):
    expected = toc_files()
    missing_pages = [f for f in expected if not (HTML / f).is_file()]
    assert not missing_pages, (
        f"pages listed in _toc.yml but not built: {missing_pages}"
    )
    root_page = report.pages[expected[0]]
    in_nav = {local_path(u, report.base) for u in root_page["navLinks"]}
    unreachable = [f for f in expected[1:] if f not in in_nav]
    assert not unreachable, (
        f"the table of contents on {expected[0]} does not link to: {unreachable}"
    )
    # ...and following links from the front page reaches every one of them (index.html redirects).
    seen, todo = set(), ["index.html"]
    while todo:
        rel = todo.pop()
        if rel in seen or rel not in report.pages:
            continue
        seen.add(rel)
        page = report.pages[rel]
        todo.append(local_path(page["url"], report.base))
        todo.extend(
            filter(None, (local_path(u, report.base) for u in page["links"]))
        )
    assert not set(expected) - seen, (
        f"not reachable from index.html: {sorted(set(expected) - seen)}"
    )


def test_internal_links_and_cross_references_resolve(report):
    ids = {rel: set(p["ids"]) for rel, p in report.pages.items()}
    problems, checked = [], 0
    for rel, p in report.pages.items():
        for url in p["links"]:
            target = local_path(url, report.base)
            if target is None:
                continue  # links off the book (papers, DOIs) are not requests; they are never fetched
            checked += 1
            fragment = unquote(urldefrag(url).fragment)
            if not (HTML / target).is_file():
                problems.append(f"{rel}: link to a missing file: {target}")
            elif fragment and target in ids and fragment not in ids[target]:
                problems.append(
                    f"{rel}: link to {target}#{fragment}, but {target} has no such id"
                )
    assert not problems, _listing(problems)
    assert checked > 0, (
        "no internal links found: the check would pass on anything"
    )


if (
    __name__ == "__main__"
):  # python tests/browser/test_book_html.py: just the summary line
    print(browse(HTML).summary())
