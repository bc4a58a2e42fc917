// Jobs list: live status and progress by polling GET /v1/jobs.
"use strict";

(function () {
  const SP = window.SP;
  const tbody = document.querySelector("#jobs-table tbody");
  if (!tbody) return;

  function newRow(job) {
    const bar = SP.el("progress", { "data-field": "bar", max: Math.max(job.progress.distinct_stages, 1), value: job.progress.done });
    const counts = SP.el("span", { class: "muted", "data-field": "counts", text: SP.progressText(job.progress) });
    const status = SP.el("span", { class: "badge status-" + job.status, "data-field": "status", text: job.status });
    const phase = SP.el("span", { class: "badge phase", "data-field": "phase" });
    SP.showPhase(phase, job);
    const c = job.cluster;
    return SP.el("tr", { "data-job-id": job.id }, [
      SP.el("td", {}, [SP.el("a", { class: "mono", href: "/jobs/" + encodeURIComponent(job.id), text: job.id.slice(0, 12) })]),
      SP.el("td", { text: job.model_name || "–" }),
      SP.el("td", {}, [status]),
      SP.el("td", { class: "progress-cell" }, [bar, " ", counts, " ", phase]),
      SP.el("td", { text: c.num_hosts + "×" + c.devices_per_host + " " + c.device_kind }),
      SP.el("td", { class: "muted", text: job.created_at.replace("T", " ").slice(0, 19) + " UTC" }),
    ]);
  }

  function update(row, job) {
    const status = row.querySelector('[data-field="status"]');
    status.textContent = job.status;
    status.setAttribute("class", "badge status-" + job.status);
    const bar = row.querySelector('[data-field="bar"]');
    bar.max = Math.max(job.progress.distinct_stages, 1);
    bar.value = job.progress.done;
    row.querySelector('[data-field="counts"]').textContent = SP.progressText(job.progress);
    SP.showPhase(row.querySelector('[data-field="phase"]'), job);
  }

  async function refresh() {
    const page = await SP.getJSON("/v1/jobs?limit=50");
    const rows = new Map();
    for (const tr of tbody.querySelectorAll("tr[data-job-id]")) rows.set(tr.getAttribute("data-job-id"), tr);
    const empty = tbody.querySelector("tr.empty");
    if (empty && page.items.length) empty.remove();
    for (const job of [...page.items].reverse()) {
      const row = rows.get(job.id);
      if (row) update(row, job);
      else tbody.insertBefore(newRow(job), tbody.firstChild);
    }
    return true;
  }

  SP.poll(refresh, SP.data.poll_ms || 2000);
})();
