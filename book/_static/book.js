/* The book's own script (html_js_files in _config.yml).
 *
 * Passes over the laid-out page (window.bookOnLayout(pass)): each runs once
 * the page has loaded, again once MathJax has typeset the math and once the
 * math's fonts have come (both change widths), and after every resize; in
 * the order they were registered. */
(function () {
  "use strict";
  const passes = [];
  const run = () => passes.forEach((pass) => pass());
  window.bookOnLayout = (pass) => passes.push(pass);

  function start() {
    run();
    if (!document.querySelector('script[src*="mathjax" i], script[id*="MathJax" i]')) return;
    const wait = (tries) => {
      if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        MathJax.startup.promise.then(run).then(() => document.fonts.ready).then(run);
      } else if (tries > 0) {
        setTimeout(() => wait(tries - 1), 50);
      }
    };
    wait(600);
  }
  let timer = null;
  window.addEventListener("resize", () => {
    clearTimeout(timer);
    timer = setTimeout(run, 150);
  });
  if (document.readyState === "complete") {
    setTimeout(start);
  } else {
    window.addEventListener("load", start);
  }
})();

/* Display equations fit their column. MathJax 3 does not break lines, and
 * gives a display that is wider than its box a scroll bar that overlay
 * scroll bars hide: the reader sees a formula cut at the right edge. Once
 * MathJax has typeset the page (and whenever the layout changes: bookOnLayout), every
 * display whose typeset math is wider than its box is scaled down to fit,
 * to no less than MIN_SCALE of its size (data-book-scale records it); a display still too wide after
 * that keeps its scroll bar, and the browser test reports it (split it into
 * aligned lines). window.bookFitMath() runs the same pass. */
(function () {
  "use strict";
  // 0.7 of the math's size still reads on a phone. An equation that needs less stays cut, and the
  // browser test fails on it; one shrunk below 0.8 is listed by `make stats` as a candidate for
  // splitting into aligned lines.
  const MIN_SCALE = 0.7;

  function fitMath() {
    for (const box of document.querySelectorAll('mjx-container[display="true"]')) {
      const math = box.querySelector("mjx-math");
      if (!math) continue;
      if (box.dataset.bookFontSize === undefined) {
        box.dataset.bookFontSize = box.style.fontSize || "";
      }
      box.style.fontSize = box.dataset.bookFontSize;
      delete box.dataset.bookScale;
      const room = box.clientWidth;
      const need = math.getBoundingClientRect().width;
      if (room > 0 && need > room + 1) {
        const scale = Math.max(MIN_SCALE, (room - 2) / need);
        const base = parseFloat(box.dataset.bookFontSize) || 100;
        box.style.fontSize = (base * scale).toFixed(2) + "%";
        box.dataset.bookScale = scale.toFixed(2);
      }
    }
  }
  window.bookFitMath = fitMath;
})();

/* Search summaries read as prose. Sphinx's search shows, under each hit,
 * the text of the page around the word; on a chapter that text is mostly
 * code cells, printed outputs and raw TeX (MathJax has not run on the
 * fetched page). Leave those out of the summary; inline math keeps its
 * TeX without the delimiters. */
(function () {
  "use strict";
  function patch() {
    if (typeof Search === "undefined" || !Search.htmlToText || Search.bookPatched) return;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      const drop = [".headerlink", "script", "style", "div.cell_input", "div.cell_output",
                    "div.highlight", "pre", "div.math", "table", "figure", ".eqno",
                    ".bd-header-article", ".bd-sidebar-secondary", "nav", ".prev-next-area",
                    ".bd-footer-article", ".bd-footer-content"];
      for (const q of drop) doc.querySelectorAll(q).forEach((el) => el.remove());
      doc.querySelectorAll("span.math").forEach((el) => {
        el.textContent = el.textContent.replace(/^\\\(|\\\)$/g, "");
      });
      const main = doc.querySelector('[role="main"]');
      const scope = (anchor && main && main.querySelector(anchor)) || main;
      return scope ? scope.textContent.replace(/\s+/g, " ") : "";
    };
    Search.bookPatched = true;
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", patch);
  } else {
    patch();
  }
})();

/* Figures read on a phone. A figure is drawn for the 1280 px column (its
 * smallest text at least 9 CSS px there); a phone's column is about half as
 * wide, so the same text shows at 5-8 px. A tap on a figure whose text is
 * below READ_PX as shown opens it in a viewer over the page, at the width
 * that shows its smallest text at READ_PX (or at the screen's width, if that
 * is wider), to be panned with a finger; a tap, Escape or the close button
 * shuts it. The text size is the one the figure was drawn with, which
 * attn_np.instruments.plotting records in the PNG's text chunks (points and
 * dpi); a PNG without the record opens at the column width of a desktop
 * (DESKTOP_COLUMN_PX), where the browser test checks every figure's text.
 * window.bookOpenFigure(img) opens the viewer and resolves to it (or to
 * null when the figure is legible as shown). */
(function () {
  "use strict";
  const READ_PX = 12;
  const DESKTOP_COLUMN_PX = 700;
  const TEXT_KEY = "attn_np:smallest-text-pt";
  const DPI_KEY = "attn_np:dpi";
  const records = new Map();

  // The PNG's tEXt chunks: {key: value}. Latin-1, as the PNG format says.
  function pngText(buffer) {
    const bytes = new Uint8Array(buffer);
    const view = new DataView(buffer);
    const out = {};
    const latin1 = (a, b) => String.fromCharCode(...bytes.subarray(a, b));
    for (let at = 8; at + 8 <= bytes.length; ) {
      const length = view.getUint32(at);
      const type = latin1(at + 4, at + 8);
      const data = at + 8;
      if (type === "tEXt") {
        const zero = bytes.indexOf(0, data);
        if (zero > data && zero < data + length) {
          out[latin1(data, zero)] = latin1(zero + 1, data + length);
        }
      }
      if (type === "IEND") break;
      at = data + length + 4;
    }
    return out;
  }

  // The smallest text of the PNG, in px at its natural width, or null.
  function textPx(src) {
    if (!records.has(src)) {
      records.set(src, fetch(src)
        .then((r) => (r.ok ? r.arrayBuffer() : Promise.reject(r.status)))
        .then((buffer) => {
          const t = pngText(buffer);
          const pt = parseFloat(t[TEXT_KEY]);
          const dpi = parseFloat(t[DPI_KEY]);
          return pt > 0 && dpi > 0 ? (pt * dpi) / 72 : null;
        })
        .catch(() => null));
    }
    return records.get(src);
  }

  let viewer = null;

  function close() {
    if (!viewer) return;
    viewer.remove();
    viewer = null;
    document.documentElement.classList.remove("book-figure-open");
  }

  async function open(img) {
    close();
    const natural = img.naturalWidth;
    const shown = img.getBoundingClientRect().width;
    if (!natural || !shown) return null;
    const px = await textPx(img.currentSrc || img.src);
    const room = document.documentElement.clientWidth;
    // the width at which the smallest text reads at READ_PX
    const width = px ? Math.max(room, (natural * READ_PX) / px)
                     : Math.max(room, Math.min(natural, DESKTOP_COLUMN_PX));
    if (width <= shown * 1.05) return null;  // legible as shown
    viewer = document.createElement("div");
    viewer.className = "book-figure-viewer";
    viewer.setAttribute("role", "dialog");
    viewer.setAttribute("aria-modal", "true");
    viewer.setAttribute("aria-label", "figure, enlarged: " + (img.alt || ""));
    const big = document.createElement("img");
    big.src = img.currentSrc || img.src;
    big.alt = img.alt || "";
    big.style.width = Math.round(width) + "px";
    big.dataset.bookTextPx = px ? ((px * width) / natural).toFixed(2) : "";
    const shut = document.createElement("button");
    shut.type = "button";
    shut.className = "book-figure-close";
    shut.setAttribute("aria-label", "close the enlarged figure");
    shut.textContent = "\u00d7";
    viewer.append(big, shut);
    viewer.addEventListener("click", close);  // a tap (a drag to pan is no click)
    document.documentElement.classList.add("book-figure-open");
    document.body.append(viewer);
    shut.focus({preventScroll: true});
    return viewer;
  }
  window.bookOpenFigure = open;

  document.addEventListener("click", (event) => {
    const img = event.target.closest && event.target.closest("article img");
    if (!img || viewer) return;
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
    const src = img.currentSrc || img.src || "";
    if (!/\.png($|[?#])/i.test(src)) return;
    // decide before the link under a captioned figure is followed
    event.preventDefault();
    open(img).then((v) => {
      const link = img.closest("a[href]");
      if (!v && link) window.location.href = link.href;  // legible: the link as before
    });
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") close();
  });
})();

/* Tables read on a phone. A table of three or four columns squeezed into a
 * 390 px screen breaks its words every few letters ("Scal/ed/dot-/prod/uct").
 * On every layout pass (bookOnLayout, above), on a
 * window up to 600 px wide every table of the article in which a word
 * breaks across lines is shown as a stack of cards instead, one per row, each cell under its column's header
 * (table.book-stack, data-book-label; book.css). A table whose words all fit
 * keeps its columns. window.bookStackTables() runs the same pass. */
(function () {
  "use strict";

  // Does a word of this element's text (outside math and code blocks) run
  // over two lines? A word is a run of letters, digits and underscores
  // (a line may break at anything else); the same rule as the browser
  // test's (scripts/page_stats.py).
  // Is the word part of a run without spaces longer than a phone's line holds
  // (attn_np.instruments.flash_parts.layer_speed)? That may break where it must.
  function longToken(text, m) {
    let a = m.index, b = m.index + m[0].length;
    while (a > 0 && !/\s/.test(text[a - 1])) a--;
    while (b < text.length && !/\s/.test(text[b])) b++;
    return b - a > 24;
  }

  function breaksAWord(root) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (n) => (n.parentElement.closest("mjx-container, pre")
        ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
    });
    const range = document.createRange();
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.data.includes("://")) continue;  // a URL breaks where it must
      const re = /[\p{L}\p{N}_]+/gu;
      for (let m = re.exec(n.data); m; m = re.exec(n.data)) {
        // a longer name or path may break where it must (a phone's line holds ~40 characters)
        if (m[0].length < 2 || m[0].length > 14 || longToken(n.data, m)) continue;
        range.setStart(n, m.index);
        range.setEnd(n, m.index + m[0].length);
        const rects = [...range.getClientRects()].filter((r) => r.width > 0);
        if (rects.length > 1 && rects[1].top > rects[0].top + 1) return true;
      }
    }
    return false;
  }

  function label(table) {
    const head = table.tHead && table.tHead.rows[table.tHead.rows.length - 1];
    if (!head) return false;
    const names = [...head.cells].map((c) => c.textContent.trim());
    for (const body of table.tBodies) {
      for (const row of body.rows) {
        [...row.cells].forEach((c, i) => {
          c.dataset.bookLabel = names[i] || "";
          const empty = !c.textContent.trim() && !c.querySelector("img, mjx-container");
          c.classList.toggle("book-empty", empty);
        });
      }
    }
    return true;
  }

  const narrow = window.matchMedia("(max-width: 600px)");  // book.css's phone width

  function stackTables() {
    for (const table of document.querySelectorAll("article table")) {
      table.classList.remove("book-stack");
      if (narrow.matches && breaksAWord(table) && label(table)) table.classList.add("book-stack");
    }
  }
  window.bookStackTables = stackTables;
  window.bookOnLayout(stackTables);
})();

// the order of the passes: tables first, then the math in the widths they leave
window.bookOnLayout(window.bookFitMath);

/* Printed outputs keep their lines (book.css): a table printed by a cell lines
 * up only on one line. On every layout pass (bookOnLayout), a printed block
 * wider than its column is scaled down to fit, to no less than MIN_SCALE of
 * its size (data-book-scale records it); what is still too wide (on a
 * phone) scrolls inside its own block. Library source (show_source, an HTML
 * output) is code and is left alone. */
(function () {
  "use strict";
  const MIN_SCALE = 0.75;

  function fitOutputs() {
    const blocks = document.querySelectorAll(
      "article div.cell_output div.output:not(.text_html) pre");
    for (const pre of blocks) {
      if (pre.dataset.bookFontSize === undefined) {
        pre.dataset.bookFontSize = pre.style.fontSize || "";
      }
      pre.style.fontSize = pre.dataset.bookFontSize;
      delete pre.dataset.bookScale;
      const room = pre.clientWidth;
      const need = pre.scrollWidth;
      if (room > 0 && need > room + 1) {
        const size = parseFloat(getComputedStyle(pre).fontSize);
        const scale = Math.max(MIN_SCALE, (room - 2) / need);
        pre.style.fontSize = (size * scale).toFixed(2) + "px";
        pre.dataset.bookScale = scale.toFixed(2);
      }
    }
  }
  window.bookOnLayout(fitOutputs);
})();
