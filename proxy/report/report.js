// Draws an opened turn's detail from its session's embedded JSON. Every trace value is set as text.
(function () {
  "use strict";
  var parsed = new WeakMap();

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function data(section) {
    if (!parsed.has(section)) {
      var block = section.querySelector("script.detail");
      parsed.set(section, block ? JSON.parse(block.textContent) : { values: [], turns: {} });
    }
    return parsed.get(section);
  }

  function kv(record) {
    var table = el("table", "kv");
    Object.keys(record || {}).forEach(function (key) {
      var row = table.insertRow();
      row.insertCell().textContent = key;
      var value = record[key];
      row.insertCell().textContent = typeof value === "object" && value !== null ? JSON.stringify(value) : String(value);
    });
    return table;
  }

  function text(content) {
    if (typeof content === "string") return content;
    if (content === null || content === undefined) return "";
    return JSON.stringify(content, null, 1);
  }

  function message(m, cls) {
    var box = el("div", "msg" + (cls ? " " + cls : ""));
    box.appendChild(el("div", "role", (m.role || "?") + (m.tool_call_id ? " · " + m.tool_call_id : "") + (m.name ? " · " + m.name : "")));
    if (m.content !== undefined && m.content !== null) box.appendChild(el("pre", "", text(m.content)));
    (m.tool_calls || []).forEach(function (call) {
      var fn = call["function"] || {};
      box.appendChild(el("pre", "", "→ " + (fn.name || "?") + "(" + (fn.arguments || "") + ")  [" + (call.id || "") + "]"));
    });
    return box;
  }

  function messages(title, ids, other, values) {
    var column = el("div");
    column.appendChild(el("h3", "", title + (ids ? " (" + ids.length + " messages)" : "")));
    if (!ids) { column.appendChild(el("p", "note", "not in this trace")); return column; }
    var seen = new Set(other || []);
    ids.forEach(function (id) { column.appendChild(message(values[id] || {}, other && !seen.has(id) ? "differs" : "")); });
    return column;
  }

  function list(title, ids, values, draw) {
    var box = el("div");
    box.appendChild(el("h3", "", title + " (" + ids.length + ")"));
    ids.forEach(function (id) { box.appendChild(draw(values[id] || {})); });
    return box;
  }

  function render(detail, values) {
    var box = el("div");
    var sections = list("Rendered sections", detail.sections || [], values, function (s) {
      var item = el("div", "msg");
      item.appendChild(el("div", "role", s.id + " · " + (s.title || "") + " · from " + (s.source || "?") + (s["protected"] ? " · protected" : "")));
      item.appendChild(el("pre", "", s.text));
      return item;
    });
    box.appendChild(sections);
    var admitted = (detail.admitted || {});
    box.appendChild(list("Admitted messages", admitted.messages || [], values, function (m) {
      return message({ role: (m.role || "user") + " · " + m.id + " from " + (m.source || "?"), content: m.content });
    }));
    box.appendChild(list("Admitted attachments", admitted.attachments || [], values, function (a) {
      return message({ role: "attachment · " + (a.id || "?") + " from " + (a.source || "?"), content: a.content || a.text || a });
    }));
    box.appendChild(el("p", "note", "admitted tokens: " + JSON.stringify(detail.admittedTokens || {})));
    var dropped = el("div");
    dropped.appendChild(el("h3", "", "Dropped items (" + (detail.dropped || []).length + ")"));
    (detail.dropped || []).forEach(function (d) { dropped.appendChild(el("div", "", d.kind + " " + d.id + " from " + (d.source || "?"))); });
    box.appendChild(dropped);
    box.appendChild(list("Diagnostics", detail.diagnostics || [], values, function (d) {
      return el("div", "", "[" + (d.level || "") + "] " + (d.code || "") + " " + (d.source ? "(" + d.source + ") " : "") + (d.message || ""));
    }));
    box.appendChild(el("h3", "", "Window statistics"));
    box.appendChild(kv(detail.window));
    box.appendChild(el("h3", "", "Compaction"));
    box.appendChild(kv(detail.compaction));
    box.appendChild(el("h3", "", "Checkpoint"));
    box.appendChild(detail.checkpoint === null || detail.checkpoint === undefined ? el("p", "note", "no checkpoint in the candidate") : message(values[detail.checkpoint] || {}));
    box.appendChild(el("h3", "", "Budgets"));
    box.appendChild(kv(detail.budgets));
    if (detail.assemblyError) { box.appendChild(el("h3", "bad", "Assembly failed (nothing was sent)")); box.appendChild(kv(detail.assemblyError)); }
    if (detail.providerError) { box.appendChild(el("h3", "bad", "Provider error")); box.appendChild(kv(detail.providerError)); }
    if (detail.recovery) { box.appendChild(el("h3", "", "Recovery")); box.appendChild(kv(detail.recovery)); }
    if (detail.ingress) { box.appendChild(el("h3", "", "Ingress")); box.appendChild(kv(detail.ingress)); }
    var contributors = el("div");
    contributors.appendChild(el("h3", "", "Contributors"));
    (detail.contributors || []).forEach(function (c) { contributors.appendChild(el("div", c.status === "ok" ? "" : "bad", c.id + ": " + c.status + " · " + c.durationMs + " ms" + (c.error ? " · " + c.error : ""))); });
    box.appendChild(contributors);
    var pair = el("div", "pair");
    pair.appendChild(messages("Candidate", detail.candidate, detail.sent, values));
    pair.appendChild(messages("Sent to the provider", detail.sent, detail.candidate, values));
    box.appendChild(pair);
    return box;
  }

  function toggle(row) {
    var next = row.nextElementSibling;
    if (next && next.classList.contains("detail")) { next.remove(); row.classList.remove("open"); return; }
    var section = row.closest("section.session");
    var all = data(section);
    var detail = all.turns[row.getAttribute("data-file")];
    var holder = document.createElement("tr");
    holder.className = "detail";
    var cell = holder.insertCell();
    cell.colSpan = row.cells.length;
    cell.appendChild(detail ? render(detail, all.values) : el("p", "note", "This turn's detail is not in the page; open its trace file."));
    row.after(holder);
    row.classList.add("open");
  }

  document.addEventListener("click", function (event) {
    if (event.target.closest("a")) return;
    var row = event.target.closest("tr.turn");
    if (row) toggle(row);
  });
  // A link to "#open=<trace file>" opens that turn (and lets a headless browser check the drawing).
  var opened = decodeURIComponent((location.hash || "").replace(/^#open=/, ""));
  if (opened && opened !== location.hash) {
    document.querySelectorAll("tr.turn").forEach(function (row) {
      if (row.getAttribute("data-file") === opened) { toggle(row); row.scrollIntoView(); }
    });
  }
  document.addEventListener("keydown", function (event) {
    var row = event.target.closest && event.target.closest("tr.turn");
    if (row && (event.key === "Enter" || event.key === " ")) { event.preventDefault(); toggle(row); }
  });
})();
