// The profile table of a job: the API's filters, sort and cursor pages (GET /v1/profiles).
"use strict";

(function () {
  const SP = window.SP;

  SP.profiles = {
    init(jobId) {
      const form = document.getElementById("profile-filters");
      const tbody = document.querySelector("#profile-table tbody");
      const next = document.getElementById("profiles-next");
      const first = document.getElementById("profiles-first");
      const note = document.getElementById("profiles-note");
      const csv = document.getElementById("profiles-csv");
      if (!form || !tbody) return;
      let cursor = null, pageNo = 1;

      function query(withCursor) {
        const q = new URLSearchParams({ job_id: jobId });
        for (const [k, v] of new FormData(form).entries()) if (v !== "") q.set(k, String(v));
        if (withCursor && cursor) q.set("cursor", cursor);
        return q;
      }

      function cell(text, cls) { return SP.el("td", { class: cls || "", text: text }); }

      function row(r) {
        const fp = SP.el("td", { class: "mono small fp", title: r.fingerprint, text: r.fingerprint.slice(0, 12) });
        const status = SP.el("td", {}, [SP.statusBadge(r.status)]);
        if (r.error) status.setAttribute("title", r.error);
        return SP.el("tr", {}, [
          cell(r.start, "num"), cell(r.end, "num"), cell(r.submesh_id, "num"), cell(r.config_id, "num"),
          cell(r.num_devices, "num"), cell(r.strategy), status,
          cell(SP.fmtSeconds(r.compute_cost), "num strong"), cell(SP.fmtSeconds(r.estimated_cost), "num estimate"),
          cell(SP.fmtSeconds(r.forward_cost), "num"),
          cell(SP.fmtSeconds(r.backward_cost), "num"), cell(SP.fmtBytes(r.peak_memory), "num"),
          cell(r.max_n_succ_stages === null ? "–" : r.max_n_succ_stages >= 1048576 ? "no limit" : r.max_n_succ_stages, "num"),
          cell(r.status === null ? "–" : r.reused ? "yes" : "no"),
          cell(r.measured_by && r.measured_by.length ? r.measured_by.join(", ") : "–", "mono small measured-by"), fp,
        ]);
      }

      async function load(withCursor) {
        const q = query(withCursor);
        const csvQuery = query(false);
        csvQuery.set("format", "csv");
        csv.setAttribute("href", "/v1/profiles?" + csvQuery.toString());
        let page;
        try {
          page = await SP.getJSON("/v1/profiles?" + q.toString());
        } catch (e) {
          note.textContent = "Could not load profiles: " + e.message;
          return;
        }
        tbody.replaceChildren(...page.items.map(row));
        if (!page.items.length) tbody.append(SP.el("tr", { class: "empty" }, [SP.el("td", { colspan: 16, text: "No candidates match." })]));
        cursor = page.next_cursor;
        next.disabled = !cursor;
        note.textContent = "page " + pageNo + " · " + page.items.length + " row(s), sorted by " + page.sort;
      }

      form.addEventListener("submit", (ev) => { ev.preventDefault(); pageNo = 1; cursor = null; load(false); });
      next.addEventListener("click", () => { pageNo += 1; load(true); });
      first.addEventListener("click", () => { pageNo = 1; cursor = null; load(false); });
      load(false);
    },
  };
})();
