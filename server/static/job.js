// Job page: live progress while the job runs, then the Gantt chart, heatmap and profiles.
"use strict";

(function () {
  const SP = window.SP;
  const d = SP.data;
  const jobId = d.job_id;

  const gantt = document.getElementById("gantt");
  if (gantt) SP.gantt.draw(gantt, d.schedule || [], d.num_stages || 0);
  SP.heatmap.load(jobId, d.stages || []).catch((e) => {
    document.getElementById("heatmap-note").textContent = "Could not load the cost matrix: " + e.message;
  });
  SP.profiles.init(jobId);

  if (d.finished) return;
  let ticks = 0;
  SP.poll(async function () {
    const job = await SP.getJSON("/v1/jobs/" + encodeURIComponent(jobId));
    const bar = document.getElementById("job-progress");
    bar.max = Math.max(job.progress.distinct_stages, 1);
    bar.value = job.progress.done;
    document.getElementById("job-counts").textContent = SP.progressText(job.progress) + " · " + job.progress.candidates + " candidates";
    SP.showPhase(document.getElementById("job-phase"), job);
    const status = document.getElementById("job-status");
    status.textContent = job.status;
    status.setAttribute("class", "badge big status-" + job.status);
    if (["done", "failed", "cancelled"].includes(job.status)) {
      window.location.reload();
      return false;
    }
    ticks += 1;
    if (ticks % 3 === 0) await SP.heatmap.load(jobId, d.stages || []);
    return true;
  }, d.poll_ms || 2000);
})();
