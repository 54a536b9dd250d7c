// gflbench report: opens a cell's provenance from the address (#cell-ID, or a click on a number), and
// writes any script error or missing figure into the page itself (#js-errors, body data attributes), so
// that a headless browser's dumped DOM shows them (tests/test_report.py).
(function () {
  "use strict";
  function report(message) {
    var box = document.getElementById("js-errors");
    if (box) {
      box.hidden = false;
      box.textContent += message + "\n";
    }
    document.documentElement.setAttribute("data-errors", "yes");
  }
  window.addEventListener("error", function (event) {
    report("error: " + (event.message || (event.target && event.target.src) || "unknown"));
  }, true);

  function openCell() {
    var match = /^#cell[-=](.+)$/.exec(window.location.hash);
    if (!match) {
      return;
    }
    var cell = document.getElementById("cell-" + decodeURIComponent(match[1]));
    if (!cell) {
      report("no cell " + match[1]);
      return;
    }
    cell.open = true;
    cell.classList.add("target");
    document.body.setAttribute("data-opened", cell.id);
    cell.scrollIntoView();
  }

  window.addEventListener("hashchange", openCell);
  document.addEventListener("DOMContentLoaded", function () {
    document.body.setAttribute("data-script", "ran");
    openCell();
  });
  window.addEventListener("load", function () {
    var missing = [];
    Array.prototype.forEach.call(document.images, function (image) {
      if (image.loading !== "lazy" && (!image.complete || image.naturalWidth === 0)) {
        missing.push(image.getAttribute("src"));
      }
    });
    document.body.setAttribute("data-figures", missing.length ? "missing" : "ok");
    if (missing.length) {
      report("figure not loaded: " + missing.join(", "));
    }
  });
}());
