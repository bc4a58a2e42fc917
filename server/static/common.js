// Shared helpers of the dashboard pages: DOM/SVG builders, formatting, polling, colours.
// Data is always inserted as text (textContent / attributes), never as HTML.
"use strict";

(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const SP = (window.SP = window.SP || {});
  const node = document.getElementById("page-data");
  SP.data = node ? JSON.parse(node.textContent || "{}") : {};

  function apply(elem, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") elem.textContent = String(v);
      else if (k === "class") elem.setAttribute("class", v);
      else elem.setAttribute(k, String(v));
    }
    return elem;
  }

  SP.el = function (tag, attrs, children) {
    const e = apply(document.createElement(tag), attrs);
    for (const c of children || []) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  };

  SP.svg = function (tag, attrs, parent) {
    const e = apply(document.createElementNS(SVG_NS, tag), attrs);
    if (parent) parent.appendChild(e);
    return e;
  };

  SP.title = function (parent, text) {
    SP.svg("title", { text: text }, parent);
  };

  SP.fmtSeconds = function (v) {
    if (v === null || v === undefined) return "–";
    if (v === 0) return "0";
    if (v >= 1) return v.toPrecision(3) + " s";
    if (v >= 1e-3) return (v * 1e3).toPrecision(3) + " ms";
    return (v * 1e6).toPrecision(3) + " µs";
  };

  SP.fmtBytes = function (v) {
    if (v === null || v === undefined) return "–";
    const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
    for (const [u, s] of units) if (Math.abs(v) >= s) return (v / s).toPrecision(3) + " " + u;
    return v + " B";
  };

  // A page saved as a file (the standalone report) carries its API answers in
  // page data `embedded`, keyed by URL: answer from there, with no network.
  SP.getJSON = async function (url) {
    const embedded = SP.data.embedded;
    if (embedded && Object.prototype.hasOwnProperty.call(embedded, url)) return embedded[url];
    const r = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!r.ok) {
      let detail = r.statusText;
      try { detail = JSON.stringify((await r.json()).detail); } catch (e) { /* not JSON */ }
      throw new Error(r.status + " " + detail);
    }
    return r.json();
  };

  // Call fn every `ms` while it returns true (skipped while the tab is hidden).
  SP.poll = function (fn, ms) {
    async function tick() {
      let again = true;
      if (document.visibilityState !== "hidden") {
        try { again = await fn(); } catch (e) { console.warn(e); }
      }
      if (again !== false) window.setTimeout(tick, ms);
    }
    window.setTimeout(tick, ms);
  };

  // Sequential palette (light yellow -> deep blue), t in [0, 1].
  const STOPS = [
    [255, 255, 217], [199, 233, 180], [127, 205, 187], [65, 182, 196],
    [29, 145, 192], [34, 94, 168], [12, 44, 132],
  ];
  SP.color = function (t) {
    const x = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
    const i = Math.min(STOPS.length - 2, Math.floor(x));
    const f = x - i;
    const c = STOPS[i].map((a, k) => Math.round(a + (STOPS[i + 1][k] - a) * f));
    return "rgb(" + c.join(",") + ")";
  };
  SP.STOPS = STOPS.map((c) => "rgb(" + c.join(",") + ")");

  SP.statusBadge = function (status) {
    const s = status || "pending";
    return SP.el("span", { class: "badge status-" + s, text: s });
  };

  SP.progressText = function (p) {
    const estimated = p.estimated ? " · " + p.estimated + " estimated" : "";
    return p.done + "/" + p.distinct_stages + " stages · " + p.measured + " measured · " + p.reused + " reused · " + p.pruned + " pruned" + estimated + " · " + p.failed + " failed";
  };

  // A profiling job's phase ("layer profiles", "verification round 2"...) in `elem`, hidden
  // when it has none.
  SP.showPhase = function (elem, job) {
    if (!elem) return;
    const phase = job.status === "profiling" && job.phase ? job.phase : "";
    elem.textContent = phase;
    if (phase) elem.removeAttribute("hidden");
    else elem.setAttribute("hidden", "");
  };

  // Round a span to 1, 2 or 5 × 10^k steps for chart axes.
  SP.niceStep = function (span, n) {
    const raw = span / Math.max(1, n);
    const mag = 10 ** Math.floor(Math.log10(raw || 1));
    for (const m of [1, 2, 5, 10]) if (raw <= m * mag) return m * mag;
    return 10 * mag;
  };
})();
