// The page's live parts, no reload needed.
// - The call log: new calls arrive over SSE as table rows (server-rendered HTML) and go on
//   top. EventSource reconnects by itself, sending the last event id, from which the
//   server resumes.
// - Live regions (`data-refresh`: the sessions, the upstreams, the jobs): their fragment
//   is fetched again every second and put in place when it changed. A region holding the
//   keyboard focus waits, so a control being used is not replaced under the user.
"use strict";
(function () {
  const table = document.querySelector("table[data-live]");
  if (table && window.EventSource) {
    const body = table.tBodies[0];
    const source = new EventSource(table.dataset.live);
    source.addEventListener("call", function (e) {
      body.insertAdjacentHTML("afterbegin", e.data);
      const none = document.getElementById("no-calls");
      if (none) none.remove();
      table.dataset.received = String(Number(table.dataset.received || "0") + 1);
    });
    source.addEventListener("open", function () {
      table.dataset.stream = "open";
    });
  }

  document.querySelectorAll("[data-refresh]").forEach(function (region) {
    let last = null;
    let busy = false;
    setInterval(function () {
      if (busy || region.contains(document.activeElement)) return;
      busy = true;
      fetch(region.dataset.refresh, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (!r.ok) throw new Error("status " + r.status);
          return r.text();
        })
        .then(function (html) {
          region.dataset.fetched = String(Number(region.dataset.fetched || "0") + 1);
          if (html !== last) {
            region.innerHTML = html;
            region.dataset.updates = String(Number(region.dataset.updates || "0") + 1);
            last = html;
          }
          region.removeAttribute("data-stale");
        })
        .catch(function () {
          region.dataset.stale = "true";
        })
        .finally(function () {
          busy = false;
        });
    }, 1000);
  });
})();
