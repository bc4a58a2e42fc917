// Heatmap of stage cost by (start, end) for one (submesh, config), from
// GET /v1/jobs/{id}/cost-matrix. The plan's stages are outlined; stages an estimate search
// never measured have their own colour, their estimate in the tooltip.
"use strict";

(function () {
  const SP = window.SP;
  const FAILED = "#e5e7eb";
  const ESTIMATED = "#ede9fe";
  // The legend's keys after the colour bar: [label, swatch class, fill, width].
  const KEYS = [
    ["failed", "", FAILED, 64],
    ["pending", "pending", "#ffffff", 74],
    ["pruned", "pruned", null, 70],
    ["estimated", "estimated", ESTIMATED, 88],
    ["plan", "plan", null, 50],
  ];
  const LEGEND_KEYS_W = 16 + KEYS.reduce((w, k) => w + k[3], 0);

  function draw(box, matrix, names, planStages) {
    box.replaceChildren();
    const L = matrix.compute_cost.length;
    if (!L) {
      box.append(SP.el("p", { class: "muted", text: "No candidates yet." }));
      return;
    }
    const cell = Math.max(8, Math.min(44, Math.floor(640 / L)));
    const left = 96, top = 64, legendW = 220;
    const width = Math.max(left + L * cell + 40, left + legendW + LEGEND_KEYS_W);
    const height = top + L * cell + 70;
    const svg = SP.svg("svg", {
      id: "heatmap-svg", class: "heatmap", width: width, height: height,
      viewBox: "0 0 " + width + " " + height, role: "img",
      "aria-label": "Stage cost heatmap for " + matrix.label,
    });
    const estimates = matrix.estimated_cost || null;
    const costs = [];
    for (const row of matrix.compute_cost) for (const v of row) if (v !== null && v > 0) costs.push(v);
    const lo = Math.log(Math.min(...costs, Infinity));
    const hi = Math.log(Math.max(...costs, -Infinity));
    const scale = (v) => (hi > lo ? (Math.log(v) - lo) / (hi - lo) : 0.5);
    const every = Math.max(1, Math.ceil(14 / cell));

    SP.svg("text", { x: left + (L * cell) / 2, y: 16, class: "axis-title", "text-anchor": "middle", text: "last layer of the stage (end)" }, svg);
    const yTitle = SP.svg("text", { x: 14, y: top + (L * cell) / 2, class: "axis-title", "text-anchor": "middle", text: "first layer (start)" }, svg);
    yTitle.setAttribute("transform", "rotate(-90 14 " + (top + (L * cell) / 2) + ")");
    for (let i = 0; i < L; i += every) {
      const label = String(i);
      SP.svg("text", { x: left + i * cell + cell / 2, y: top - 8, class: "tick", "text-anchor": "middle", text: label }, svg);
      const t = SP.svg("text", { x: left - 6, y: top + i * cell + cell / 2 + 4, class: "tick", "text-anchor": "end", text: label }, svg);
      SP.title(t, names[i] || label);
    }
    for (let s = 0; s < L; s++) {
      for (let e = s; e < L; e++) {
        const status = matrix.status[s][e];
        if (status === null) continue;
        const v = matrix.compute_cost[s][e];
        const est = estimates ? estimates[s][e] : null;
        const x = left + e * cell, y = top + s * cell;
        let fill = "#ffffff", cls = "heat-cell pending";
        if (status === "ok" && v !== null) { fill = SP.color(scale(v)); cls = "heat-cell ok"; }
        else if (status === "pruned") { fill = "#f3f4f6"; cls = "heat-cell pruned"; }
        else if (status === "estimated") { fill = ESTIMATED; cls = "heat-cell estimated"; }
        else if (status !== "pending") { fill = FAILED; cls = "heat-cell failed"; }
        const r = SP.svg("rect", { x: x + 0.5, y: y + 0.5, width: cell - 1, height: cell - 1, fill: fill, class: cls }, svg);
        const range = (names[s] || s) + (e > s ? " … " + (names[e] || e) : "");
        let what = status === "ok" ? SP.fmtSeconds(v) : status;
        if (status === "estimated") what = "estimated " + SP.fmtSeconds(est) + ", never measured";
        else if (est !== null && est !== undefined) what += " (estimated " + SP.fmtSeconds(est) + ")";
        SP.title(r, "layers " + s + "–" + e + " (" + range + "): " + what);
        if (cls === "heat-cell failed" && cell >= 12) {
          SP.svg("text", { x: x + cell / 2, y: y + cell / 2 + 4, class: "cell-mark", "text-anchor": "middle", text: "×" }, svg);
        }
      }
    }
    for (const st of planStages) {
      if (st.submesh_id !== matrix.submesh_id || st.config_id !== matrix.config_id) continue;
      if (st.start >= L || st.end >= L) continue;
      const r = SP.svg("rect", { x: left + st.end * cell + 1, y: top + st.start * cell + 1, width: cell - 2, height: cell - 2, class: "plan-cell" }, svg);
      SP.title(r, "in the plan: layers " + st.start + "–" + st.end);
    }
    legend(svg, left, top + L * cell + 24, legendW, costs.length ? [Math.exp(lo), Math.exp(hi)] : null);
    box.append(svg);
  }

  function legend(svg, x, y, w, range) {
    const defs = SP.svg("defs", {}, svg);
    const grad = SP.svg("linearGradient", { id: "heat-gradient", x1: "0", x2: "1", y1: "0", y2: "0" }, defs);
    SP.STOPS.forEach((c, i) => SP.svg("stop", { offset: i / (SP.STOPS.length - 1), "stop-color": c }, grad));
    SP.svg("rect", { x: x, y: y, width: w, height: 10, fill: "url(#heat-gradient)", class: "legend-bar" }, svg);
    if (range) {
      SP.svg("text", { x: x, y: y + 24, class: "tick", text: SP.fmtSeconds(range[0]) }, svg);
      SP.svg("text", { x: x + w, y: y + 24, class: "tick", "text-anchor": "end", text: SP.fmtSeconds(range[1]) + " (log)" }, svg);
    }
    let at = x + w + 16;
    for (const [label, cls, fill, width] of KEYS) {
      const attrs = { x: at, y: y, width: 10, height: 10, fill: fill };
      if (cls) attrs.class = "legend-swatch " + cls;
      SP.svg("rect", attrs, svg);
      SP.svg("text", { x: at + 14, y: y + 9, class: "tick legend-key", text: label }, svg);
      at += width;
    }
  }

  // Fill the selector and draw; keeps the user's selection across refreshes.
  SP.heatmap = {
    async load(jobId, planStages) {
      const box = document.getElementById("heatmap");
      const select = document.getElementById("heatmap-select");
      const note = document.getElementById("heatmap-note");
      if (!box || !select) return;
      const data = await SP.getJSON("/v1/jobs/" + encodeURIComponent(jobId) + "/cost-matrix");
      const previous = select.value;
      select.replaceChildren();
      data.matrices.forEach((m, i) => select.append(SP.el("option", { value: String(i), text: m.label })));
      if (!data.matrices.length) {
        box.replaceChildren(SP.el("p", { class: "muted", text: "No stage candidates recorded yet." }));
        note.textContent = "";
        return;
      }
      let pick = 0;
      const first = planStages[0];
      if (previous && Number(previous) < data.matrices.length) pick = Number(previous);
      else if (first) pick = Math.max(0, data.matrices.findIndex((m) => m.submesh_id === first.submesh_id && m.config_id === first.config_id));
      select.value = String(pick);
      const render = () => {
        const m = data.matrices[Number(select.value)];
        draw(box, m, data.layer_names, planStages);
        const size = data.micro_batch_size ? " · micro-batch size " + data.micro_batch_size + " (searched: " + data.micro_batch_sizes.join(", ") + ")" : "";
        note.textContent = data.num_layers + " layers · " + m.num_devices + " device(s)" + size + " · outlined cells are the plan's stages";
      };
      select.onchange = render;
      render();
    },
  };
})();
