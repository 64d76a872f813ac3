// haze dashboard: the only script. It refreshes live regions by fetching the same
// server-rendered (escaped) HTML fragment, and asks before destructive actions.
"use strict";
(function () {
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var every = parseInt(el.getAttribute("data-interval") || "5000", 10);
    function tick() {
      // Skip while the tab is hidden or a form inside the region has focus.
      if (!document.hidden && !el.contains(document.activeElement)) {
        fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
          .then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) { if (html !== null) { el.innerHTML = html; } })
          .catch(function () { /* offline for a moment: keep the last numbers */ });
      }
      setTimeout(tick, every);
    }
    setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.addEventListener("submit", function (ev) {
      var msg = ev.target.getAttribute && ev.target.getAttribute("data-confirm");
      if (msg && !window.confirm(msg)) { ev.preventDefault(); }
    });
  });
})();
