// The call log's live rows: new calls arrive over SSE as table rows (server-rendered
// HTML) and go on top. EventSource reconnects by itself, sending the last event id, from
// which the server resumes.
"use strict";
(function () {
  const table = document.querySelector("table[data-live]");
  if (!table || !window.EventSource) return;
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
})();
