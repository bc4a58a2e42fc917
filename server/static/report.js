// The standalone report: the job page's Gantt chart and heatmap, drawn from the data the
// file carries (SP.getJSON answers the cost-matrix URL from page data `embedded`).
"use strict";

(function () {
  const SP = window.SP;
  const d = SP.data;

  const gantt = document.getElementById("gantt");
  if (gantt) SP.gantt.draw(gantt, d.schedule || [], d.num_stages || 0);
  SP.heatmap.load(d.job_id, d.stages || []).catch((e) => {
    document.getElementById("heatmap-note").textContent = "Could not draw the heatmap: " + e.message;
  });
})();
