// koord-queue dashboard (docs/dashboard.md). Plain JavaScript, no build step, nothing fetched from
// anywhere but this local server. Every figure comes from /api/..., which runs the kubectl
// plugin's own commands as the user who started the dashboard; the page only lays them out.
// It asks again every second (POLL_MS), so a change shows within two seconds, and redraws only
// when the answer changed, keeping the keyboard focus where it was.
"use strict";

const POLL_MS = 1000;
// editing: a priority field the user has typed in and not yet submitted or left
// etag: the queue page's last ETag (a poll of an unchanged page is a 304 with no body);
// limit: rows of each queue asked for ("Show more" raises it)
const FIRST_ROWS = 50;
const MAX_ROWS = 5000;
const state = {
  session: null, route: null, lastBody: null, timer: null, editing: false,
  etag: null, etagPath: null, limit: FIRST_ROWS,
};

// --- small helpers -------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function age(seconds) {
  // kubectl's short durations, as the plugin prints them (koord_queue/cli/render.py: age)
  if (seconds === null || seconds === undefined) return "-";
  let s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  let m = Math.floor(s / 60); s %= 60;
  if (m < 60) return s && m < 10 ? `${m}m${s}s` : `${m}m`;
  let h = Math.floor(m / 60); m %= 60;
  if (h < 24) return m && h < 10 ? `${h}h${m}m` : `${h}h`;
  const d = Math.floor(h / 24); h %= 24;
  return h && d < 10 ? `${d}d${h}h` : `${d}d`;
}

function enc(text) { return encodeURIComponent(text); }

function say(text, isError) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = isError ? "message error" : "message";
  box.setAttribute("role", isError ? "alert" : "status");
  box.hidden = !text;
}

class Refusal extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function getJSON(path, etag) {
  const headers = etag ? { "If-None-Match": etag } : {};
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store", headers });
  if (response.status === 304) return null; // unchanged since the answer with this ETag
  if (response.ok) state.etag = response.headers.get("ETag");
  const body = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Refusal(response.status, body.error || `${response.status}`);
  return body;
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Refusal(response.status, answer.error || `${response.status}`);
  return answer;
}

// --- routes --------------------------------------------------------------------------------------

function parseRoute(pathname) {
  const parts = pathname.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "all") return { view: "queues", ns: null };
  if (parts[0] === "ns" && parts[1]) {
    if (parts[2] === "units" && parts[3]) return { view: "unit", ns: parts[1], name: parts[3] };
    if (parts[2] === "quotas") return { view: "quotas", ns: parts[1] };
    if (parts[2] === "history") return { view: "history", ns: parts[1] };
    return { view: "queues", ns: parts[1] };
  }
  return null;
}

function pagePath(route) {
  if (route.view === "queues") return route.ns === null ? "/all" : `/ns/${enc(route.ns)}`;
  if (route.view === "unit") return `/ns/${enc(route.ns)}/units/${enc(route.name)}`;
  return `/ns/${enc(route.ns)}/${route.view}`;
}

function apiPath(route) {
  if (route.view === "queues") {
    const base = route.ns === null ? "/api/all/units" : `/api/ns/${enc(route.ns)}/units`;
    return `${base}?limit=${state.limit}`;
  }
  if (route.view === "unit") return `/api/ns/${enc(route.ns)}/units/${enc(route.name)}`;
  return `/api/ns/${enc(route.ns)}/${route.view}`;
}

function go(route) {
  history.pushState(null, "", pagePath(route));
  show(route, true);
}

function link(route, text, attrs) {
  return el("a", { href: pagePath(route), onclick: (event) => {
    if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    event.preventDefault();
    go(route);
  }, ...(attrs || {}) }, text);
}

function navigation(route) {
  const ns = route.ns === null ? state.session.namespace : route.ns;
  const targets = {
    "nav-queues": { view: "queues", ns: route.ns },
    "nav-quotas": { view: "quotas", ns },
    "nav-history": { view: "history", ns },
  };
  for (const [id, target] of Object.entries(targets)) {
    const a = document.getElementById(id);
    a.href = pagePath(target);
    a.onclick = (event) => { event.preventDefault(); go(target); };
    if (target.view === route.view) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const home = document.getElementById("home");
  home.href = pagePath({ view: "queues", ns: route.ns });
}

// --- drawing -------------------------------------------------------------------------------------

function focusKey() {
  const active = document.activeElement;
  return active && active.dataset ? active.dataset.key || null : null;
}

function restoreFocus(key) {
  if (!key) return;
  const again = document.querySelector(`[data-key="${CSS.escape(key)}"]`);
  if (again) again.focus();
}

function draw(nodes, keepFocus) {
  const key = focusKey();
  const main = document.getElementById("main");
  main.replaceChildren(...nodes);
  if (keepFocus) restoreFocus(key);
}

function refusedPanel(error) {
  const title = error.status === 403 ? "Refused (403)" : error.status === 404 ? "Not found (404)" : `Error (${error.status || "?"})`;
  return el("section", { class: "refused", id: "refused", "data-status": error.status || "" },
    el("h2", { text: title }), el("p", { id: "refused-message", text: error.message }));
}

function actionCell(ns, row) {
  const job = row.job && row.job !== "-" ? row.job : row.name;
  const base = `/api/ns/${enc(ns)}/units/${enc(job)}`;
  const act = async (action, body) => {
    try {
      const answer = await post(`${base}/${action}`, body);
      say(answer.message, false);
      await refresh(true, true);
    } catch (error) {
      say(error.message, true);
    }
  };
  const key = `${ns}/${row.name}`;
  const input = el("input", {
    class: "priority", type: "number", step: "1", value: row.priority,
    "aria-label": `priority of ${row.name}`, "data-key": `${key}:priority-input`,
    oninput: () => { state.editing = true; },
    onblur: () => { state.editing = false; },
  });
  const form = el("form", { onsubmit: (event) => {
    event.preventDefault();
    state.editing = false;
    act("priority", { priority: input.value });
  } }, input, el("button", { type: "submit", "data-key": `${key}:priority`, text: "Set priority" }));
  const held = row.reason && row.reason.startsWith("inactive");
  return el("td", { class: "actions" },
    el("button", {
      type: "button", "data-key": `${key}:${held ? "release" : "hold"}`,
      "data-action": held ? "release" : "hold",
      onclick: () => act(held ? "release" : "hold"), text: held ? "Release" : "Hold",
    }), " ", form);
}

function queuesView(body, route) {
  const nodes = [];
  const where = route.ns === null ? "every namespace" : `namespace ${route.ns}`;
  nodes.push(el("h2", { class: "page" }, `Queues in ${where}`,
    el("span", { class: "note" }, body.loading
      ? " — the first waiting units, in the order the scheduler considers them"
      : ` — ${body.count} unit(s), in the order the scheduler considers them`)));
  if (body.loading) nodes.push(el("p", { class: "note loading", role: "status",
    text: "Loading the rest: every QueueUnit is being read. Until then each Why is list's short reason (marked “list”), not explain's answer." }));
  if (!body.positionsKnown) nodes.push(el("p", { class: "note", text: "Positions unknown: the visibility API did not answer." }));
  if (!body.queues.length && !body.loading) nodes.push(el("p", { text: `No QueueUnits found in ${where}.` }));
  for (const group of body.queues) {
    const title = group.queue ? `Queue ${group.queue}` : "No queue (no quota label)";
    const rows = group.units.map((row) => {
      const ns = row.namespace;
      const cls = row.waiting ? "waiting" : (row.phase === "Running" || row.phase === "Dequeued") ? "admitted" : null;
      return el("tr", { "data-unit": `${ns}/${row.name}` },
        el("td", { class: "num position", text: row.position === null ? "-" : row.position }),
        el("td", {}, link({ view: "unit", ns, name: row.name }, row.name, { "data-key": `${ns}/${row.name}:link` })),
        route.ns === null ? el("td", { text: ns }) : null,
        el("td", { text: row.job }),
        el("td", { class: cls, text: row.phase }),
        el("td", { class: "num priority-value", text: row.priority }),
        row.waiting && row.waitSeconds !== null
          ? el("td", { class: "num", "data-wait": row.waitSeconds, "data-built": body.builtAt, text: age(row.waitSeconds) })
          : el("td", { class: "num", text: age(row.waitSeconds) }),
        el("td", { class: "reason", title: row.reason, text: row.whyFrom === "list" ? `${row.why} (list)` : row.why || row.reason }),
        actionCell(ns, row));
    });
    nodes.push(el("section", { "data-queue": group.queue, "aria-label": title },
      el("h2", {}, title, el("span", { class: "note" }, group.waiting === null ? " — loading" : ` — ${group.waiting} waiting`)),
      el("table", { class: "units" },
        el("thead", {}, el("tr", {},
          el("th", { class: "num c-pos", scope: "col", text: "Position" }), el("th", { class: "c-name", scope: "col", text: "Unit" }),
          route.ns === null ? el("th", { class: "c-name", scope: "col", text: "Namespace" }) : null,
          el("th", { class: "c-name", scope: "col", text: "Job" }), el("th", { class: "c-phase", scope: "col", text: "Phase" }),
          el("th", { class: "num c-num", scope: "col", text: "Priority" }), el("th", { class: "num c-num", scope: "col", text: "Waited" }),
          el("th", { scope: "col", text: "Why" }), el("th", { class: "c-actions", scope: "col", text: "Actions" }))),
        el("tbody", {}, rows)),
      group.total > group.units.length
        ? el("p", { class: "more" }, `${group.units.length} of ${group.total} shown `,
          state.limit < MAX_ROWS
            ? el("button", { type: "button", "data-key": `more:${group.queue}`, "data-more": group.queue,
              onclick: () => { state.limit = Math.min(MAX_ROWS, state.limit * 4); refresh(true, true); },
              text: "Show more" })
            : null)
        : null));
  }
  return nodes;
}

function unitView(body) {
  const row = { name: body.name, job: body.job, priority: body.priority, reason: body.short };
  const actions = actionCell(body.namespace, row);
  const nodes = [
    el("p", {}, link({ view: "queues", ns: body.namespace }, `← Queues in namespace ${body.namespace}`)),
    el("h2", { class: "page", text: `QueueUnit ${body.namespace}/${body.name} (${body.job})` }),
    el("ul", { class: "facts" },
      el("li", {}, "Phase ", el("strong", { id: "unit-phase", text: body.phase })),
      el("li", {}, "Priority ", el("strong", { id: "unit-priority", text: body.priority })),
      el("li", {}, "Queue ", el("strong", { text: body.queue || "-" })),
      el("li", {}, "Position ", el("strong", { id: "unit-position", text: body.position === null ? "-" : body.position })),
      el("li", {}, "Held ", el("strong", { text: body.active ? "no" : "yes" }))),
    el("p", { class: "why" }, el("strong", { text: "Why: " }), el("span", { id: "unit-why", text: body.summary })),
    el("table", { class: "unit-actions" }, el("tbody", {}, el("tr", {}, el("th", { scope: "row", text: "Actions" }), actions))),
  ];
  if (body.nextSteps.length) {
    nodes.push(el("h2", { text: "What would let it run" }),
      el("ul", { id: "next-steps" }, body.nextSteps.map((step) => el("li", { text: step }))));
  }
  nodes.push(el("h2", { text: "Pods" }));
  if (body.podsError) nodes.push(el("p", { class: "note", text: body.podsError }));
  else if (!body.pods.length) nodes.push(el("p", { class: "note", text: "No pods yet." }));
  else {
    nodes.push(el("table", {},
      el("thead", {}, el("tr", {}, ["Pod", "Phase", "Node"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, body.pods.map((p) => el("tr", {}, el("td", { text: p.name }), el("td", { text: p.phase }), el("td", { text: p.node }))))));
  }
  nodes.push(el("h2", { text: "Explain (kubectl koord-queue explain)" }), el("pre", { id: "explain", text: body.explain }));
  nodes.push(el("h2", { text: "Admissions and events (kubectl koord-queue describe)" }), el("pre", { id: "describe", text: body.describe }));
  return nodes;
}

function quotasView(body, route) {
  const nodes = [el("h2", { class: "page", text: `Quotas namespace ${route.ns} may read` })];
  if (!body.items.length) {
    nodes.push(el("p", { text: "No ElasticQuotas found." }));
    return nodes;
  }
  const heads = ["Quota", "Namespace", "Min", "Max", "Used", "Borrowed", "Admitted", "Waiting"];
  nodes.push(el("table", { id: "quotas" },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, body.items.map((q) => el("tr", { "data-quota": q.name },
      el("td", { class: `depth${Math.min(q.depth, 4)}`, text: q.name + (q.readable ? "" : " (not readable)") }),
      el("td", { text: q.namespace || "-" }),
      el("td", { text: q.readable ? q.min || "-" : "?" }),
      el("td", { text: q.readable ? q.max || "unlimited" : "?" }),
      el("td", { text: (q.used_complete ? "" : "≥") + (q.used || "0") }),
      el("td", { text: q.over_min || "0" }),
      el("td", { class: "num", text: q.admitted }),
      el("td", { class: "num", text: q.waiting ? `${q.waiting} (${q.waiting_request})` : "0" }))))));
  nodes.push(el("p", { class: "note", text: "Borrowed is usage above min: below a parent quota, siblings within their min may reclaim it." }));
  if (!body.usageComplete) nodes.push(el("p", { class: "note", text: "≥: only the QueueUnits you can read are counted." }));
  return nodes;
}

function historyView(body, route) {
  const nodes = [el("h2", { class: "page", text: `History of namespace ${route.ns}, last ${body.days} days` })];
  nodes.push(el("h2", { text: "Wait before admission, per queue" }));
  if (!body.waits.length) nodes.push(el("p", { class: "note", text: "No unit was admitted in this window." }));
  else {
    nodes.push(el("table", { id: "waits" },
      el("thead", {}, el("tr", {}, ["Queue", "Day (UTC)", "Admitted", "p50", "p95", "Longest"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, body.waits.map((w) => el("tr", {},
        el("td", { text: w.queue }), el("td", { text: w.day === "all" ? "all days" : w.day }),
        el("td", { class: "num", text: w.admitted }), el("td", { class: "num", text: age(w.p50) }),
        el("td", { class: "num", text: age(w.p95) }), el("td", { class: "num", text: age(w.longest) }))))));
  }
  nodes.push(el("h2", { text: "Preemptions, per queue" }));
  if (body.eventsError) nodes.push(el("p", { class: "note", text: body.eventsError }));
  else if (!body.preemptions.length) nodes.push(el("p", { class: "note", text: "No preemption recorded in the events the API server keeps." }));
  else {
    nodes.push(el("table", { id: "preemptions" },
      el("thead", {}, el("tr", {}, ["Queue", "Day (UTC)", "Preemptions"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, body.preemptions.map((p) => el("tr", {},
        el("td", { text: p.queue }), el("td", { text: p.day }), el("td", { class: "num", text: p.count }))))));
  }
  nodes.push(el("p", { class: "note", text: "Waits come from the QueueUnits' status (created, last admitted); preemptions from Preempted events, kept as long as the API server keeps events." }));
  return nodes;
}

const VIEWS = { queues: queuesView, unit: unitView, quotas: quotasView, history: historyView };

async function refresh(keepFocus, force) {
  const route = state.route;
  const path = apiPath(route);
  let body;
  try {
    body = await getJSON(path, path === state.etagPath && state.lastBody !== null ? state.etag : null);
  } catch (error) {
    if (route !== state.route) return;
    state.etagPath = null;
    const text = `refused:${error.status}:${error.message}`;
    if (text !== state.lastBody) {
      state.lastBody = text;
      draw([refusedPanel(error)], keepFocus);
    }
    return;
  }
  if (route !== state.route) return;
  if (body === null) { // 304: the page as drawn is still the answer
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    tickAges();
    return;
  }
  state.etagPath = path;
  if (keepFocus && !force && state.editing) { state.lastBody = null; return; } // not under a typing user
  const text = JSON.stringify(body);
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  if (text === state.lastBody) return;
  state.lastBody = text;
  draw(VIEWS[route.view](body, route), keepFocus);
  tickAges();
}

function tickAges() {
  // a waiting unit's wait grows between answers: the answer says when it was built
  const now = Date.now() / 1000;
  for (const cell of document.querySelectorAll("td[data-wait]")) {
    const waited = Number(cell.dataset.wait) + Math.max(0, now - Number(cell.dataset.built));
    cell.textContent = age(waited);
  }
}

function show(route, moveFocus) {
  if (!state.route || state.route.view !== route.view || state.route.ns !== route.ns) state.limit = FIRST_ROWS;
  state.route = route;
  state.lastBody = null;
  navigation(route);
  document.title = `koord-queue: ${pagePath(route)}`;
  refresh(false, true).then(() => { if (moveFocus) document.getElementById("main").focus(); });
}

async function start() {
  try {
    state.session = await getJSON("/api/session");
  } catch (error) {
    draw([refusedPanel(error)], false);
    return;
  }
  const s = state.session;
  document.getElementById("who").textContent =
    `acting as ${s.user || "your kubeconfig user"}${s.allNamespaces ? ", every namespace" : `, namespace ${s.namespace}`}`;
  if (s.cluster) { // in the cluster, with a token this server keeps: it can be given back
    const button = document.getElementById("logout");
    button.hidden = false;
    button.addEventListener("click", () => post("/logout").then(() => location.replace("/login"), (e) => say(e.message, true)));
  }
  const route = parseRoute(location.pathname) || { view: "queues", ns: s.allNamespaces ? null : s.namespace };
  history.replaceState(null, "", pagePath(route));
  window.addEventListener("popstate", () => show(parseRoute(location.pathname) || route, true));
  show(route, false);
  state.timer = setInterval(() => { if (!document.hidden) refresh(true, false); }, POLL_MS);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(true, false); });
}

document.addEventListener("DOMContentLoaded", start);
