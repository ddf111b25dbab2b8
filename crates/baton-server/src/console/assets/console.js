// The Baton console's one script (embedded in the binary, no build step).
// 1. Forms: the browser checks the HTML constraints; this adds JSON syntax
//    checks and shows each field's message beside it instead of a bubble.
// 2. A tree page follows its tree: an EventSource on the tree's event stream
//    (the API accepts the console's cookie); each committed fact fetches the
//    page's live fragment and swaps in the status, processes, usage, the
//    steer forms (only when the open waits change) and the new log rows;
//    token deltas are appended to their process's live output.
"use strict";

function errorSpan(field) {
  const id = field.getAttribute("aria-describedby");
  return id ? document.getElementById(id) : null;
}

function checkJson(field) {
  if (!field.hasAttribute("data-json")) return;
  const text = field.value.trim();
  if (text === "") { field.setCustomValidity(""); return; }
  try { JSON.parse(text); field.setCustomValidity(""); }
  catch (error) { field.setCustomValidity("Not JSON: " + error.message); }
}

function showValidity(field) {
  const span = errorSpan(field);
  if (span) span.textContent = field.validity.valid ? "" : field.validationMessage;
}

function wireForms(root) {
  for (const form of root.querySelectorAll("form[data-validate]")) {
    if (form.dataset.wired) continue;
    form.dataset.wired = "1";
    for (const field of form.querySelectorAll("input, select, textarea")) {
      field.addEventListener("invalid", (event) => {
        event.preventDefault();
        field.setAttribute("data-touched", "");
        showValidity(field);
      });
      field.addEventListener("input", () => {
        checkJson(field);
        if (field.hasAttribute("data-touched")) showValidity(field);
      });
    }
    form.addEventListener("submit", (event) => {
      for (const field of form.querySelectorAll("[data-json]")) checkJson(field);
      if (!form.checkValidity()) {
        event.preventDefault();
        const first = form.querySelector(":invalid");
        if (first) first.focus();
      }
    });
  }
}

function follow(treeEl) {
  const tree = treeEl.dataset.tree;
  let last = 0;
  for (const row of document.querySelectorAll("#log-rows tr[data-seq]")) {
    last = Math.max(last, Number(row.dataset.seq));
  }
  let busy = false, again = false, source = null;

  function swap(fragment, id, onlyIfKeyChanged) {
    const next = fragment.querySelector("#" + id);
    const current = document.getElementById(id);
    if (!next || !current) return;
    if (onlyIfKeyChanged && next.dataset.key === current.dataset.key) return;
    if (id === "processes") {
      // Keep each process's open or closed state and its live output.
      for (const details of next.querySelectorAll("details[data-process]")) {
        const old = current.querySelector('details[data-process="' + details.dataset.process + '"]');
        if (old) {
          details.open = old.open;
          const oldOut = old.querySelector("pre.deltas"), newOut = details.querySelector("pre.deltas");
          if (oldOut && newOut) newOut.textContent = oldOut.textContent;
        }
      }
    }
    current.replaceWith(next);
    wireForms(next);
  }

  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch("/trees/" + tree + "/live?after=" + last, { credentials: "same-origin" });
      if (response.ok) {
        const fragment = new DOMParser().parseFromString(await response.text(), "text/html");
        swap(fragment, "tree-status-wrap", false);
        swap(fragment, "processes", false);
        swap(fragment, "usage", false);
        swap(fragment, "steer", true);
        swap(fragment, "cancel", true);
        const head = fragment.querySelector("#head-seq");
        const headHere = document.getElementById("head-seq");
        if (head && headHere) headHere.textContent = head.textContent;
        const rows = document.getElementById("log-rows");
        for (const row of fragment.querySelectorAll("#log-rows tr[data-seq]")) {
          const seq = Number(row.dataset.seq);
          if (seq > last && rows) { rows.appendChild(document.importNode(row, true)); last = seq; }
        }
        const live = fragment.getElementById("live");
        if (live && live.dataset.done === "true") {
          treeEl.dataset.done = "true";
          if (source) source.close();
        }
      }
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  function delta(event) {
    let data;
    try { data = JSON.parse(event.data); } catch (_) { return; }
    const out = document.getElementById("deltas-" + data.process);
    if (!out) return;
    const body = data.data && data.data.delta;
    let text;
    if (typeof body === "string") text = body;
    else if (body && typeof body.text === "string") text = body.text;
    else if (body && typeof body.content === "string") text = body.content;
    else text = JSON.stringify(body) + "\n";
    out.textContent += text;
    out.scrollTop = out.scrollHeight;
  }

  if (treeEl.dataset.done === "true") return;
  source = new EventSource("/v1/trees/" + tree + "/events?from=" + (Number(treeEl.dataset.head) + 1));
  const facts = ["process_started", "child_started", "step_adopted", "effect_pending", "effect_retrying",
    "effect_settled", "effect_resolved", "signals_admitted", "cancel_requested", "control_delivered",
    "terminated"];
  for (const kind of facts) source.addEventListener(kind, refresh);
  source.addEventListener("delta", delta);
  source.addEventListener("stopped", refresh);
}

document.addEventListener("DOMContentLoaded", () => {
  wireForms(document);
  const treeEl = document.getElementById("tree");
  if (treeEl) follow(treeEl);
});
