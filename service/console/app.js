// tool-shortlist console: one static page over the JSON API. No dependencies, no build step.
"use strict";

const TOKEN_KEY = "tool-shortlist.token";
const $ = (id) => document.getElementById(id);
let current = null; // the selected registry's name

// -- API ------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.type = error.type || "http";
    this.details = error.details;
  }
}

async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: { message: text } }; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// Every name is one encoded path segment, and "." or ".." never is (the URL would resolve to
// another route). Tool names go in the query string, where no resolution happens.
function registryPath(name) {
  if (name === "" || name === "." || name === "..") throw new Error(`invalid registry name ${JSON.stringify(name)}`);
  return `/registries/${encodeURIComponent(name)}`;
}
const toolPath = (registry, tool) =>
  `${registryPath(registry)}/tools?${new URLSearchParams({ name: tool })}`;

// -- small DOM helpers ----------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

function fill(id, nodes) { $(id).replaceChildren(...nodes); }

function flash(message, kind = "error") {
  const box = $("flash");
  box.textContent = message;
  box.className = kind;
  box.hidden = !message;
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}

function when(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const date = new Date(seconds * 1000);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

async function guarded(action) {
  try {
    flash("");
    await action();
  } catch (err) {
    const hint = err.status === 401 ? " (set the admin token above)" : "";
    flash(`${err.message}${hint}`);
  }
}

// -- token ----------------------------------------------------------------------------------------

function showTokenState() {
  $("token-state").textContent = sessionStorage.getItem(TOKEN_KEY) ? "token set for this tab" : "no token";
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  $("token").value = "";
  showTokenState();
  guarded(loadRegistries);
});

// -- registries -----------------------------------------------------------------------------------

async function loadRegistries() {
  const data = await api("GET", "/registries");
  const rows = data.registries.map((r) =>
    el("tr", { "data-registry": r.registry, class: r.registry === current ? "selected" : "" },
      el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); guarded(() => select(r.registry)); } }, r.registry)),
      el("td", { class: "num" }, r.version),
      el("td", { class: "num" }, r.tools),
      el("td", { class: "when" }, when(r.written_at))));
  fill("registry-rows", rows);
  $("registries-empty").hidden = rows.length > 0;
  if (!current && data.registries.length) await select(data.registries[0].registry);
}

async function select(name) {
  current = name;
  $("current").textContent = `registry: ${name}`;
  for (const row of document.querySelectorAll("#registry-rows tr")) {
    row.classList.toggle("selected", row.dataset.registry === name);
  }
  await Promise.all([loadTools(), loadReport()]);
}

$("refresh").addEventListener("click", () => guarded(loadRegistries));

// -- upload ---------------------------------------------------------------------------------------

function toolName(item) {
  if (!item || typeof item !== "object") return null;
  if (item.function && typeof item.function === "object") return item.function.name ?? null;
  return item.name ?? null;
}

function renderUploadErrors(payload, err) {
  const details = Array.isArray(err.details) ? err.details : [];
  const byIndex = new Map();
  const general = [];
  for (const d of details) {
    if (d && Number.isInteger(d.index)) {
      if (!byIndex.has(d.index)) byIndex.set(d.index, []);
      byIndex.get(d.index).push(d);
    } else general.push(d);
  }
  const items = Array.isArray(payload) ? payload : (payload && Array.isArray(payload.tools) ? payload.tools : []);
  const rows = items.map((item, i) => {
    const problems = byIndex.get(i) || [];
    return el("tr", { class: problems.length ? "bad" : "ok", "data-index": i },
      el("td", { class: "num" }, i),
      el("td", {}, toolName(item) || (problems[0] && problems[0].tool) || "(no name)"),
      el("td", { class: "tool-error" }, problems.length
        ? problems.map((p) => `${p.field ? p.field + ": " : ""}${p.message}`).join("; ")
        : "ok"));
  });
  const box = el("div", { class: "upload-errors" },
    el("p", { class: "error" }, `${err.status ? err.status + " " : ""}${err.type}: ${err.message}`),
    general.length ? el("ul", {}, ...general.map((d) => el("li", {}, `${d.field || "payload"}: ${d.message}`))) : null,
    rows.length ? el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "#"), el("th", {}, "tool"), el("th", {}, "problem"))), el("tbody", {}, ...rows)) : null);
  fill("upload-result", [box]);
}

async function waitForJob(name, job) {
  for (;;) {
    fill("upload-result", [el("p", { class: "muted" }, `${job.state}: embedding ${job.new_texts} new tool texts…`)]);
    if (job.state === "done") return job.result;
    if (job.state === "failed" || job.state === "superseded") throw new ApiError(null, { error: job.error });
    await new Promise((resolve) => setTimeout(resolve, 1000));
    job = await api("GET", `${registryPath(name)}/jobs/${encodeURIComponent(job.job)}`);
  }
}

$("upload-file").addEventListener("change", async () => {
  const file = $("upload-file").files[0];
  if (!file) return;
  $("upload-json").value = await file.text();
  if (!$("upload-name").value) $("upload-name").value = file.name.replace(/\.json$/i, "").replace(/[^A-Za-z0-9._-]/g, "-");
});

$("upload-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const name = $("upload-name").value.trim();
  const text = $("upload-json").value;
  let payload;
  try {
    payload = JSON.parse(text);
  } catch (err) {
    fill("upload-result", [el("p", { class: "error" }, `Not JSON: ${err.message}`)]);
    return;
  }
  const method = $("upload-mode").value === "post" ? "POST" : "PUT";
  const path = method === "POST" ? `${registryPath(name)}/tools` : registryPath(name);
  try {
    let info = await api(method, path, text);
    if (info && info.job) info = await waitForJob(name, info); // a large upload: 202 and a job
    fill("upload-result", [el("p", { class: "ok" }, `${info.registry}: version ${info.version}, ${info.tools} tools`)]);
    current = info.registry;
    await loadRegistries();
    await select(info.registry);
  } catch (err) {
    if (err instanceof ApiError) renderUploadErrors(payload, err);
    else fill("upload-result", [el("p", { class: "error" }, err.message)]);
  }
});

// -- tools ----------------------------------------------------------------------------------------

function describe(definition) {
  const fn = definition.function && typeof definition.function === "object" ? definition.function : definition;
  return fn.description || "";
}

async function loadTools() {
  if (!current) return;
  const data = await api("GET", registryPath(current));
  $("tools-meta").textContent = `${data.registry} · version ${data.version} · ${data.tools.length} tools · written ${when(data.written_at)}`;
  const rows = data.tools.map((definition) => {
    const name = toolName(definition);
    return el("tr", { "data-tool": name },
      el("td", { class: "name" }, name),
      el("td", { class: "desc" }, describe(definition)),
      el("td", {}, el("button", { type: "button", class: "small danger", onclick: () => guarded(() => deleteTool(name)) }, "delete")));
  });
  fill("tool-rows", rows);
  fill("equivalents", data.equivalents.length
    ? data.equivalents.map((group) => el("li", {}, group.join(" ≡ ")))
    : [el("li", { class: "muted" }, "none declared")]);
}

async function deleteTool(name) {
  if (!window.confirm(`Delete tool ${name} from ${current}?`)) return;
  await api("DELETE", toolPath(current, name));
  flash(`Deleted ${name} from ${current}.`, "ok");
  await loadRegistries();
  await loadTools();
}

// -- playground -----------------------------------------------------------------------------------

function stats(result) {
  const parts = [
    ["k", result.k], ["N", result.n_tools], ["p_rand", fmt(result.p_rand, 4)],
    ["BoR ceiling", `${fmt(result.bor_max_bits, 2)} bits`], ["policy", result.policy],
    ["scorer", result.scorer],
  ];
  if (result.depth_bias !== null && result.depth_bias !== undefined) parts.push(["depth_bias", result.depth_bias]);
  if (result.intents && result.intents.length) parts.push(["intents", result.intents.length]);
  return el("dl", { class: "stats" }, ...parts.flatMap(([key, value]) =>
    [el("dt", {}, key), el("dd", { "data-stat": key }, value)]));
}

function shortlistItems(result) {
  return result.tools.map((t) => el("li", { "data-tool": t.name },
    el("span", { class: "name" }, t.name), " ", el("span", { class: "score" }, fmt(t.score, 3)),
    t.named ? el("span", { class: "tag" }, "named") : null,
    t.intent !== null && t.intent !== undefined ? el("span", { class: "tag" }, `intent ${t.intent + 1}`) : null,
    t.alternates && t.alternates.length ? el("span", { class: "muted" }, ` (+ ${t.alternates.join(", ")})`) : null));
}

function marginRows(result) {
  const explained = result.explain;
  if (!explained) {
    return [el("tr", {}, el("td", { colspan: 3, class: "muted" }, "only the learned bor policy has margins"))];
  }
  return explained.margins.map((m, i) => {
    const depth = i + 1;
    const chosen = depth === explained.chosen;
    const decision = m >= explained.bias ? "stop" : "continue";
    return el("tr", { class: chosen ? "chosen" : "", "data-depth": depth },
      el("td", { class: "num" }, depth), el("td", { class: "num" }, fmt(m, 3)),
      el("td", {}, chosen ? `${decision} ← chosen` : decision,
        chosen && explained.shown !== explained.chosen ? ` (exploring: shown ${explained.shown})` : null));
  });
}

function marginNote(result) {
  const explained = result.explain;
  return explained ? `stop where margin ≥ ${fmt(explained.bias, 2)} bits` : "";
}

$("policy").addEventListener("change", () => {
  $("depth-bias").disabled = $("policy").value !== "bor";
});

$("query-form").addEventListener("submit", (event) => {
  event.preventDefault();
  guarded(async () => {
    if (!current) throw new Error("Select or upload a registry first.");
    const query = $("query").value;
    const scorer = $("scorer").value;
    const policy = $("policy").value;
    const body = { registry: current, query, policy, scorer, explain: true };
    if (policy === "bor" && $("depth-bias").value !== "") body.depth_bias = Number($("depth-bias").value);
    if ($("max-k").value) body.max_k = Number($("max-k").value);
    const fixedK = Number($("fixed-k").value || 5);
    const [result, fixed] = await Promise.all([
      api("POST", "/shortlist", body),
      api("POST", "/shortlist", { registry: current, query, scorer, k: fixedK }),
    ]);
    fill("result-stats", [stats(result)]);
    fill("result-tools", shortlistItems(result));
    fill("margin-rows", marginRows(result));
    $("margin-note").textContent = marginNote(result);
    fill("fixed-stats", [stats(fixed)]);
    fill("fixed-tools", shortlistItems(fixed));
  });
});

// -- report and live ------------------------------------------------------------------------------

async function loadReport() {
  if (!current) return;
  const [report, live] = await Promise.all([
    api("GET", `${registryPath(current)}/report`),
    api("GET", `${registryPath(current)}/live`),
  ]);
  fill("live-rows", ["exact", "equivalent"].map((match) => {
    const s = live[match];
    return el("tr", { "data-match": match }, el("td", {}, match), el("td", { class: "num" }, s.events),
      el("td", { class: "num" }, s.presented), el("td", { class: "num" }, fmt(s.presentation_rate)),
      el("td", { class: "num" }, fmt(s.mean_p_rand, 4)), el("td", { class: "num" }, fmt(s.bor_bits, 2)));
  }));
  $("report-meta").textContent = `${report.events} feedback events · mean trajectory efficiency ${fmt(report.mean_trajectory_efficiency)} · window ${live.window_seconds} s`;
  const prune = new Set(report.prune_candidates);
  fill("prune", prune.size ? report.prune_candidates.map((n) => el("span", { class: "tag warn" }, n)) : ["none"]);
  // prune candidates first, then the most shown
  const rows = [...report.tools].sort((a, b) =>
    (prune.has(b.name) - prune.has(a.name)) || (b.shown - a.shown) || a.name.localeCompare(b.name));
  fill("report-rows", rows.map((t) => el("tr", { class: prune.has(t.name) ? "prune" : "", "data-tool": t.name },
    el("td", { class: "name" }, t.name), el("td", { class: "num" }, t.shown), el("td", { class: "num" }, t.used),
    el("td", { class: "num" }, t.useful_calls), el("td", { class: "num" }, t.useless_calls),
    el("td", { class: "num" }, t.aggregate_utility), el("td", { class: "num" }, fmt(t.efficiency)))));
}

// -- tabs and start -------------------------------------------------------------------------------

for (const button of document.querySelectorAll(".tabs button")) {
  button.addEventListener("click", () => {
    for (const other of document.querySelectorAll(".tabs button")) other.classList.toggle("active", other === button);
    for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== `tab-${button.dataset.tab}`;
    if (button.dataset.tab === "report") guarded(loadReport);
  });
}

showTokenState();
guarded(loadRegistries);
