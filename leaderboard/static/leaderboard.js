// bench leaderboard: column sorting and the method-family filter. Progressive enhancement only:
// every number is in the HTML; without JavaScript the tables are simply in their default order.
(function () {
  "use strict";

  function num(td) {
    if (!td) return null;
    var raw = td.getAttribute("data-value");
    if (raw === null || raw === "") return null;
    var v = parseFloat(raw);
    return isNaN(v) ? null : v;
  }

  function cellFor(row, col) {
    return row.querySelector('[data-col="' + col + '"]');
  }

  // The paper's marking on the rows currently shown: bold best, underline second (ties share).
  function remark(table) {
    var rows = Array.prototype.filter.call(table.querySelectorAll("tbody.ranked tr[data-family]"), function (r) { return !r.hidden; });
    table.querySelectorAll("thead th[data-dir]").forEach(function (th) {
      var col = th.getAttribute("data-col"), dir = th.getAttribute("data-dir");
      var values = [];
      rows.forEach(function (r) { var v = num(cellFor(r, col)); if (v !== null && values.indexOf(v) < 0) values.push(v); });
      values.sort(function (a, b) { return dir === "min" ? a - b : b - a; });
      table.querySelectorAll("tbody.ranked tr[data-family]").forEach(function (r) {
        var td = cellFor(r, col);
        if (!td) return;
        td.classList.remove("best", "second");
        if (r.hidden || values.length < 2) return;
        var v = num(td);
        if (v === values[0]) td.classList.add("best");
        else if (v === values[1]) td.classList.add("second");
      });
    });
  }

  function sortBy(table, th) {
    var col = th.getAttribute("data-col");
    var better = th.getAttribute("data-dir") === "max" ? "descending" : "ascending";
    var current = th.getAttribute("aria-sort");
    var order = current === "none" || !current ? better : (current === "ascending" ? "descending" : "ascending");
    table.querySelectorAll("thead th[aria-sort]").forEach(function (h) { h.setAttribute("aria-sort", "none"); });
    th.setAttribute("aria-sort", order);
    var body = table.querySelector("tbody.ranked");
    var rows = Array.prototype.slice.call(body.querySelectorAll("tr[data-family]"));
    var sign = order === "ascending" ? 1 : -1;
    rows.sort(function (a, b) {
      var x = num(cellFor(a, col)), y = num(cellFor(b, col));
      if (x === null && y === null) return 0;
      if (x === null) return 1;   // missing values last, whatever the order
      if (y === null) return -1;
      return sign * (x - y);
    });
    var tail = body.querySelector("tr.filtered-out");
    rows.forEach(function (r) { body.insertBefore(r, tail); });
  }

  var shownFamily = "all", shownGroup = "all";  // with/without SGM, and the method family (rehearsal, ...)

  function applyFilter(family) {
    shownFamily = family;
    document.querySelectorAll("table.sortable").forEach(function (table) {
      var shown = 0, total = 0;
      table.querySelectorAll("tbody.ranked tr[data-family]").forEach(function (r) {
        total += 1;
        r.hidden = !((family === "all" || r.getAttribute("data-family") === family) &&
                     (shownGroup === "all" || r.getAttribute("data-group") === shownGroup));
        if (!r.hidden) shown += 1;
      });
      var note = table.querySelector("tr.filtered-out");
      if (note) note.hidden = !(total > 0 && shown === 0);
      remark(table);
    });
    document.querySelectorAll(".toolbar .filter").forEach(function (b) {
      var on = b.getAttribute("data-filter") === family;
      b.classList.toggle("active", on);
      b.setAttribute("aria-pressed", on ? "true" : "false");
    });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th[data-col] button.sort").forEach(function (button) {
      button.addEventListener("click", function () { sortBy(table, button.closest("th")); });
    });
  });
  document.querySelectorAll(".toolbar .filter").forEach(function (b) {
    b.addEventListener("click", function () { applyFilter(b.getAttribute("data-filter")); });
  });
  document.querySelectorAll(".toolbar .group-filter").forEach(function (b) {
    b.addEventListener("click", function () {
      shownGroup = b.getAttribute("data-group-filter");
      document.querySelectorAll(".toolbar .group-filter").forEach(function (o) {
        var on = o === b;
        o.classList.toggle("active", on);
        o.setAttribute("aria-pressed", on ? "true" : "false");
      });
      applyFilter(shownFamily);
    });
  });
  // rows of one family together (in the families' order, rank order kept within each), or back to rank order
  var GROUPS = ["baseline", "rehearsal", "regularisation", "head", "other"];
  document.querySelectorAll(".toolbar .group-rows").forEach(function (b) {
    b.addEventListener("click", function () {
      var on = b.getAttribute("aria-pressed") !== "true";
      b.setAttribute("aria-pressed", on ? "true" : "false");
      document.querySelectorAll("table.sortable tbody.ranked").forEach(function (body) {
        var rows = Array.prototype.slice.call(body.querySelectorAll("tr[data-group]"));
        rows.forEach(function (r, i) { if (!r.hasAttribute("data-rank")) r.setAttribute("data-rank", String(i)); });
        rows.sort(function (a, c) {
          var rank = Number(a.getAttribute("data-rank")) - Number(c.getAttribute("data-rank"));
          if (!on) return rank;
          return (GROUPS.indexOf(a.getAttribute("data-group")) - GROUPS.indexOf(c.getAttribute("data-group"))) || rank;
        });
        var tail = body.querySelector("tr.filtered-out");
        rows.forEach(function (r) { body.insertBefore(r, tail); });
      });
    });
  });
  // the curves against updates or against training TFLOPs, per protocol: without JavaScript both are shown
  document.querySelectorAll(".axis-toggle").forEach(function (bar) {
    var section = bar.closest("section.protocol");
    function show(axis) {
      section.querySelectorAll(".axis-group").forEach(function (g) { g.hidden = g.getAttribute("data-axis") !== axis; });
      bar.querySelectorAll("button[data-axis]").forEach(function (b) {
        var on = b.getAttribute("data-axis") === axis;
        b.classList.toggle("active", on);
        b.setAttribute("aria-pressed", on ? "true" : "false");
      });
    }
    bar.querySelectorAll("button[data-axis]").forEach(function (b) {
      b.addEventListener("click", function () { show(b.getAttribute("data-axis")); });
    });
    bar.hidden = false;
    show("updates");
  });
  // the standard CL metrics' columns and the budget and time columns, hidden by default so that the gap
  // columns and their paired difference fit a desktop window
  [["toggle-optional", "show-optional"], ["toggle-extra", "show-extra"]].forEach(function (pair) {
    document.querySelectorAll(".toolbar ." + pair[0]).forEach(function (b) {
      b.addEventListener("click", function () {
        var on = b.getAttribute("aria-pressed") !== "true";
        b.setAttribute("aria-pressed", on ? "true" : "false");
        document.querySelectorAll("table.measured-table").forEach(function (t) { t.classList.toggle(pair[1], on); });
      });
    });
  });
})();
