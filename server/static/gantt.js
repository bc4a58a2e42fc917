// The 1F1B pipeline Gantt chart from Plan.schedule (stage, microbatch, kind, start_s, end_s).
"use strict";

(function () {
  const SP = window.SP;

  SP.gantt = {
    draw(box, events, numStages) {
      box.replaceChildren();
      if (!events.length) {
        box.append(SP.el("p", { class: "muted", text: "The plan has no schedule." }));
        return;
      }
      const width = Math.max(640, Math.min(1300, box.clientWidth || 1100));
      const left = 78, right = 16, top = 28, rowH = 30, gap = 6;
      const plotW = width - left - right;
      const height = top + numStages * rowH + 44;
      const tmax = Math.max(...events.map((e) => e.end_s)) || 1;
      const x = (t) => left + (t / tmax) * plotW;
      const svg = SP.svg("svg", {
        id: "gantt-svg", class: "gantt", width: width, height: height,
        viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "1F1B pipeline schedule",
      });
      // Legend.
      SP.svg("rect", { x: left, y: 6, width: 12, height: 12, class: "gantt-key fwd" }, svg);
      SP.svg("text", { x: left + 18, y: 16, class: "tick", text: "forward" }, svg);
      SP.svg("rect", { x: left + 90, y: 6, width: 12, height: 12, class: "gantt-key bwd" }, svg);
      SP.svg("text", { x: left + 108, y: 16, class: "tick", text: "backward (number = micro-batch)" }, svg);
      // Rows and time grid.
      for (let s = 0; s < numStages; s++) {
        const y = top + s * rowH;
        SP.svg("rect", { x: left, y: y, width: plotW, height: rowH, class: s % 2 ? "gantt-row odd" : "gantt-row" }, svg);
        SP.svg("text", { x: left - 8, y: y + rowH / 2 + 4, class: "tick", "text-anchor": "end", text: "stage " + s }, svg);
      }
      const step = SP.niceStep(tmax, 8);
      for (let t = 0; t <= tmax * 1.0001; t += step) {
        SP.svg("line", { x1: x(t), x2: x(t), y1: top, y2: top + numStages * rowH + 4, class: "grid" }, svg);
        SP.svg("text", { x: x(t), y: top + numStages * rowH + 18, class: "tick", "text-anchor": "middle", text: SP.fmtSeconds(t).replace(" ", "\u00a0") }, svg);
      }
      SP.svg("text", { x: left + plotW / 2, y: height - 6, class: "axis-title", "text-anchor": "middle", text: "time in the iteration" }, svg);
      // Bars.
      for (const e of events) {
        const x0 = x(e.start_s), w = Math.max(1, x(e.end_s) - x0);
        const y = top + e.stage * rowH + gap / 2;
        const kind = e.kind === "forward" ? "fwd" : "bwd";
        const bar = SP.svg("rect", { x: x0, y: y, width: w, height: rowH - gap, rx: 2, class: "gantt-bar " + kind }, svg);
        SP.title(bar, e.kind + " of micro-batch " + e.microbatch + " on stage " + e.stage + ": " + SP.fmtSeconds(e.start_s) + " → " + SP.fmtSeconds(e.end_s));
        if (w >= 14) {
          SP.svg("text", { x: x0 + w / 2, y: y + (rowH - gap) / 2 + 4, class: "bar-label", "text-anchor": "middle", text: String(e.microbatch) }, svg);
        }
      }
      box.append(svg);
    },
  };
})();
