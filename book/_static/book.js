/* The book's own script (html_js_files in _config.yml).
 *
 * Display equations fit their column. MathJax 3 does not break lines, and
 * gives a display that is wider than its box a scroll bar that overlay
 * scroll bars hide: the reader sees a formula cut at the right edge. Once
 * MathJax has typeset the page (and whenever the window is resized), every
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
    document.documentElement.dataset.bookMathFitted = "1";
  }
  window.bookFitMath = fitMath;

  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fitMath);
    } else {
      setTimeout(whenTypeset, 50);
    }
  }
  let timer = null;
  window.addEventListener("resize", () => {
    clearTimeout(timer);
    timer = setTimeout(fitMath, 150);
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", whenTypeset);
  } else {
    whenTypeset();
  }
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
