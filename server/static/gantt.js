// The pipeline Gantt chart from Plan.schedule (stage, microbatch, kind, start_s, end_s,
// device_group): one row per device group, so an interleaved plan's chunks share a row.
"use strict";

(function () {
  const SP = window.SP;
  const KINDS = { forward: "fwd", backward: "bwd", weight: "wgt" };

  SP.gantt = {
    draw(box, events, numStages) {
      box.replaceChildren();
      if (!events.length) {
        box.append(SP.el("p", { class: "muted", text: "The plan has no schedule." }));
        return;
      }
      const group = (e) => (e.device_group === null || e.device_group === undefined ? e.stage : e.device_group);
      const numRows = Math.max(numStages ? 1 : 0, ...events.map((e) => group(e) + 1));
      const chunked = events.some((e) => group(e) !== e.stage);
      const split = events.some((e) => e.kind === "weight");
      const width = Math.max(640, Math.min(1300, box.clientWidth || 1100));
      const left = 78, right = 16, top = 28, rowH = 30, gap = 6;
      const plotW = width - left - right;
      const height = top + numRows * rowH + 44;
      const tmax = Math.max(...events.map((e) => e.end_s)) || 1;
      const x = (t) => left + (t / tmax) * plotW;
      const svg = SP.svg("svg", {
        id: "gantt-svg", class: "gantt", width: width, height: height,
        viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "pipeline schedule",
      });
      // Legend.
      const keys = [["fwd", "forward"], ["bwd", split ? "backward B (input gradients)" : "backward"]];
      if (split) keys.push(["wgt", "weight gradients W"]);
      let lx = left;
      for (const [cls, label] of keys) {
        SP.svg("rect", { x: lx, y: 6, width: 12, height: 12, class: "gantt-key " + cls }, svg);
        SP.svg("text", { x: lx + 18, y: 16, class: "tick", text: label }, svg);
        lx += 30 + label.length * 6.5;
      }
      SP.svg("text", { x: lx, y: 16, class: "tick", text: chunked ? "(number = micro-batch, c = chunk)" : "(number = micro-batch)" }, svg);
      // Rows and time grid.
      for (let s = 0; s < numRows; s++) {
        const y = top + s * rowH;
        SP.svg("rect", { x: left, y: y, width: plotW, height: rowH, class: s % 2 ? "gantt-row odd" : "gantt-row" }, svg);
        SP.svg("text", { x: left - 8, y: y + rowH / 2 + 4, class: "tick", "text-anchor": "end", text: (chunked ? "group " : "stage ") + s }, svg);
      }
      const step = SP.niceStep(tmax, 8);
      for (let t = 0; t <= tmax * 1.0001; t += step) {
        SP.svg("line", { x1: x(t), x2: x(t), y1: top, y2: top + numRows * rowH + 4, class: "grid" }, svg);
        SP.svg("text", { x: x(t), y: top + numRows * rowH + 18, class: "tick", "text-anchor": "middle", text: SP.fmtSeconds(t).replace(" ", "\u00a0") }, svg);
      }
      SP.svg("text", { x: left + plotW / 2, y: height - 6, class: "axis-title", "text-anchor": "middle", text: "time in the iteration" }, svg);
      // Bars.
      for (const e of events) {
        const x0 = x(e.start_s), w = Math.max(1, x(e.end_s) - x0);
        const y = top + group(e) * rowH + gap / 2;
        const kind = KINDS[e.kind] || "bwd";
        const chunk = chunked ? Math.floor(e.stage / numRows) : 0;
        const cls = "gantt-bar " + kind + (chunk % 2 ? " alt" : "");
        const bar = SP.svg("rect", { x: x0, y: y, width: w, height: rowH - gap, rx: 2, class: cls }, svg);
        const where = chunked ? "chunk " + e.stage + " (group " + group(e) + ")" : "stage " + e.stage;
        SP.title(bar, e.kind + " of micro-batch " + e.microbatch + " on " + where + ": " + SP.fmtSeconds(e.start_s) + " → " + SP.fmtSeconds(e.end_s));
        const label = chunked ? e.microbatch + "c" + chunk : String(e.microbatch);
        if (w >= 7 * label.length) {
          SP.svg("text", { x: x0 + w / 2, y: y + (rowH - gap) / 2 + 4, class: "bar-label", "text-anchor": "middle", text: label }, svg);
        }
      }
      box.append(svg);
    },
  };
})();
