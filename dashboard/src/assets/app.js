// nightshift dashboard: decisions without reloading, and live output.
// Served from the binary; the Content-Security-Policy allows no other script.
// Text from the server is only ever set with textContent, never as markup.
"use strict";

function showOutcome(outcomes) {
  for (const o of outcomes) {
    // An act's block, and its line in an approval's list (.planned).
    for (const el of document.querySelectorAll(".act, .planned")) {
      if (el.dataset.act !== o.act) continue;
      el.dataset.state = o.state;
      const state = el.querySelector(".state");
      if (state) state.textContent = o.state;
      const line = el.querySelector(".outcome");
      if (line) line.textContent = o.line;
      if (o.state !== "pending") {
        for (const f of el.querySelectorAll("form.decide")) f.remove();
        const pick = el.querySelector("input.pick");
        if (pick) pick.remove();
      }
    }
  }
}

// An approval returns once decided; serve's executor carries the act out.
// Follow each such act until it settles.
const UNSETTLED = ["approved", "executing", "awaiting_retry", "outcome_unknown"];

async function follow(act) {
  for (let i = 0; i < 600; i++) {
    await new Promise((r) => setTimeout(r, 1000));
    try {
      const resp = await fetch("/api/v1/acts/" + encodeURIComponent(act), {
        headers: { "Accept": "application/json" },
        credentials: "same-origin",
      });
      if (!resp.ok) return;
      const o = await resp.json();
      showOutcome([o]);
      if (!UNSETTLED.includes(o.state)) return;
    } catch (e) {
      return;
    }
  }
}

async function submitDecision(ev) {
  const form = ev.target;
  if (!(form instanceof HTMLFormElement) || !form.classList.contains("decide")) return;
  ev.preventDefault();
  const body = new URLSearchParams();
  for (const [k, v] of new FormData(form)) body.append(k, v);
  const status = document.getElementById("status-line");
  try {
    const resp = await fetch(form.action, {
      method: "POST",
      body,
      headers: { "Accept": "application/json" },
      credentials: "same-origin",
    });
    const doc = await resp.json();
    if (Array.isArray(doc.outcomes)) {
      showOutcome(doc.outcomes);
      for (const o of doc.outcomes) if (UNSETTLED.includes(o.state)) follow(o.act);
    }
    if (status) status.textContent = doc.error || "";
  } catch (e) {
    if (status) status.textContent = "the request failed: " + e;
  }
}

function liveOutput() {
  const pre = document.getElementById("live-output");
  if (!pre || !pre.dataset.src) return;
  const es = new EventSource(pre.dataset.src);
  es.onmessage = (m) => { pre.textContent += m.data + "\n"; };
  es.addEventListener("end", () => es.close());
}

document.addEventListener("submit", submitDecision);
document.addEventListener("DOMContentLoaded", () => {
  const main = document.querySelector("main");
  if (main) {
    const p = document.createElement("p");
    p.id = "status-line";
    main.prepend(p);
  }
  liveOutput();
});
