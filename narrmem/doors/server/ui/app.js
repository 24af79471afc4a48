// The narrmem inspector: plain JS over the server's /v1 API. It only reads, except for the
// forget buttons, which ask first. Recall runs with reinforce=false: looking changes nothing.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = {
  decision: "#2f6f8f", emotion_change: "#b5651d", milestone: "#3c8d40",
  preference: "#7b4fa0", general: "#6a7077",
};
// Pages as the server and the soul_narrative tool give them at most; a page_size in the page's
// address makes them smaller (to look at paging without thousands of rows).
const USERS_PAGE = pageSize("users_page", 1000);
const SCENES_PAGE = pageSize("scenes_page", 200);
// user: the picked user's row of /users (its counts fill the header); view: bumped whenever the
// view is reset or another user is picked, so an answer for the view before is dropped.
const state = {
  tenant: null, users: [], usersMore: false, user: null,
  scenes: [], scenesMore: false, selected: null, view: 0,
};

function pageSize(name, most) {
  const asked = Number(new URLSearchParams(location.search).get(name));
  return Number.isInteger(asked) && asked > 0 ? Math.min(asked, most) : most;
}

// Explicit direction controls shown as what they are: a stranger's "admin\u202Egnp.exe" read
// backwards as another name, and one inside a line reversed the rest of it (a dialog's words).
const BIDI_CONTROLS = /[\u202A-\u202E\u2066-\u2069]/g;
const shown = (text) => String(text).replace(BIDI_CONTROLS,
  (c) => `⟦U+${c.codePointAt(0).toString(16).toUpperCase()}⟧`);

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) el.setAttribute(k, v);
  }
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  return el;
}

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = shown(text);
  return el;
}

function status(text, isError = false) {
  $("status").textContent = shown(text);
  $("status").className = isError ? "error" : "";
}

// --- the API ----------------------------------------------------------------------------------

async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem("narrmem-key");
  if (key) headers["Authorization"] = "Bearer " + key;
  // Relative to the page (/ui/), so that a proxy serving the API under a path keeps it.
  const response = await fetch("../v1" + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = data && data.detail;
    const text = typeof detail === "string" ? detail
      : Array.isArray(detail) ? detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ")
      : response.statusText;
    const error = new Error(`${response.status}: ${text}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

const q = (params) => "?" + new URLSearchParams(
  Object.entries(params).filter(([, v]) => v !== undefined && v !== null)).toString();
const tool = (name, args) => api("POST", "/tools/" + encodeURIComponent(name),
  { ...args, tenant: state.tenant });

// --- tenants and users ------------------------------------------------------------------------

async function loadTenants() {
  resetView();
  state.users = [];
  $("users").replaceChildren();
  try {
    const tenants = await api("GET", "/tenants");
    const select = $("tenant");
    select.replaceChildren(...tenants.map((t) => h("option", { value: t }, t)));
    if (!tenants.length) select.append(h("option", { value: "default" }, "default"));
    state.tenant = select.value;
    $("key-box").hidden = !sessionStorage.getItem("narrmem-key");
    await loadUsers();
  } catch (e) {
    if (e.status === 401) {
      $("key-box").hidden = false;
      status("enter an API key", true);
    } else status(e.message, true);
  }
}

// What was shown of one tenant's user must not stay on screen once another tenant (or key) is
// chosen: its buttons would act on the same-named user of the new tenant.
function resetView() {
  state.view += 1;
  state.user = null;
  state.scenes = [];
  state.scenesMore = false;
  state.selected = null;
  $("user-view").hidden = true;
  $("empty-view").hidden = false;
  $("importance-panel").hidden = true;
  $("recall-results").replaceChildren();
  $("scenes").replaceChildren();
  $("timeline-plot").replaceChildren();
  for (const b of document.querySelectorAll("#users button.selected")) b.classList.remove("selected");
}

// The first page of users; ``again``: as many as are shown now, to refresh their counts.
async function loadUsers(again = false) {
  const tenant = state.tenant;
  const want = again ? Math.min(Math.max(state.users.length, USERS_PAGE), 99_999) : USERS_PAGE;
  const page = await api("GET", "/users" + q({ tenant, limit: want + 1 }));
  if (tenant !== state.tenant) return;
  state.users = page.slice(0, want);
  state.usersMore = page.length > want;
  drawUsers();
  if (!again) status($("users-count").textContent);
}

async function moreUsers() {
  const tenant = state.tenant;
  const last = state.users[state.users.length - 1];
  try {
    const page = await api("GET", "/users" + q({ tenant, limit: USERS_PAGE + 1, after: last.user_id }));
    if (tenant !== state.tenant) return;
    state.users.push(...page.slice(0, USERS_PAGE));
    state.usersMore = page.length > USERS_PAGE;
    drawUsers();
  } catch (e) { status(e.message, true); }
}

function drawUsers() {
  const picked = state.user && state.user.user_id;
  $("users").replaceChildren(...state.users.map((u) => h("li", {},
    h("button", { "data-user": u.user_id, class: u.user_id === picked ? "selected" : undefined,
      onclick: () => pickUser(u) },
      u.user_id, h("small", {}, u.plugins_only ? "no memories · facts, persona or tasks kept"
        : `${u.memories} memories · ${u.scenes} scenes`)))));
  const n = state.users.length;
  const told = state.usersMore ? `${n} users shown in ${state.tenant}; more exist` : `${n} users in ${state.tenant}`;
  $("users-count").textContent = told;
  $("users-more").hidden = !state.usersMore;
}

function drawHeader(u) {
  $("user-title").textContent = shown(u.user_id);
  $("user-meta").textContent = `${u.memories} memories, ${u.scenes} scenes, ${u.chats} chats · ` +
    `first ${u.first_at.slice(0, 10)} · last ${u.last_at.slice(0, 10)}`;
}

async function pickUser(u) {
  resetView();
  state.user = u;
  for (const b of document.querySelectorAll("#users button")) {
    b.classList.toggle("selected", b.dataset.user === u.user_id);
  }
  $("empty-view").hidden = true;
  $("user-view").hidden = false;
  drawHeader(u);
  await Promise.all([loadScenes(), loadSummary(), loadGraph(), loadPatterns()].map(
    (p) => p.catch((e) => status(e.message, true))));
}

// Every loader reads for the user picked when it began, and draws nothing once another view is up.
function current() {
  const view = state.view;
  return () => view === state.view;
}

// --- scenes on a timeline ---------------------------------------------------------------------

// A scene is stored as its rendered paragraph; its labelled lines give the Core and the Vibe.
function sceneField(text, labels) {
  for (const line of text.split("\n")) {
    for (const label of labels) {
      if (line.startsWith(label)) return line.slice(label.length).replace(/^["「]|["」]$/g, "");
    }
  }
  return null;
}

// Scenes come newest first, a page at a time; the next page starts after the last one listed.
async function loadScenes() {
  const still = current();
  const out = await tool("soul_narrative", { action: "list", user_id: state.user.user_id, k: SCENES_PAGE });
  if (!still()) return;
  state.scenes = out.scenes;
  state.scenesMore = out.more;
  drawScenes();
}

async function moreScenes() {
  const still = current();
  const last = state.scenes[state.scenes.length - 1];
  try {
    const out = await tool("soul_narrative",
      { action: "list", user_id: state.user.user_id, k: SCENES_PAGE, before_id: last.id });
    if (!still()) return;
    state.scenes.push(...out.scenes);
    state.scenesMore = out.more;
    drawScenes();
  } catch (e) { status(e.message, true); }
}

function drawScenes() {
  const inOrder = [...state.scenes].sort((a, b) => a.created_at.localeCompare(b.created_at));
  drawTimeline(inOrder);
  $("scenes").replaceChildren(...inOrder.map(sceneItem));
  const total = state.user.scenes;
  $("scenes-count").textContent = state.scenesMore
    ? `The newest ${state.scenes.length} of ${total} scenes; older ones are not shown yet.`
    : `${state.scenes.length} scenes.`;
  $("scenes-more").hidden = !state.scenesMore;
}

function sceneItem(scene) {
  const core = sceneField(scene.text, ["Core: ", "核心："]) || scene.text;
  const vibe = sceneField(scene.text, ["Vibe: ", "氛围："]);
  const color = COLORS[scene.category] || COLORS.general;
  return h("li", { "data-scene": scene.id, id: "scene-" + scene.id },
    h("div", { class: "when" }, scene.created_at.slice(0, 16).replace("T", " ")),
    h("div", {},
      h("span", { class: "tag", style: `background:${color}` }, scene.category),
      h("span", { class: "core" }, core),
      vibe ? h("div", { class: "vibe" }, "vibe: " + vibe) : "",
      h("div", { class: "sources" },
        `importance ${scene.importance.toFixed(2)} (stored ${scene.base_importance.toFixed(2)}) · ` +
        (scene.message_ids.length ? "from messages " + scene.message_ids.join(", ") : "added by " + scene.source))),
    h("div", { class: "actions" },
      h("button", { class: "show-importance", onclick: () => showImportance(scene) }, "Importance"),
      h("button", { class: "danger forget-scene", onclick: () => forgetScene(scene) }, "Forget…")));
}

function drawTimeline(scenes) {
  const box = $("timeline-plot");
  if (!scenes.length) {
    box.replaceChildren(h("p", { class: "muted" }, "No scenes yet."));
    return;
  }
  const W = 900, H = 90, L = 30, R = 20;
  const times = scenes.map((x) => Date.parse(x.created_at));
  let lo = Math.min(...times), hi = Math.max(...times);
  if (hi - lo < 86400e3) { lo -= 86400e3; hi += 86400e3; }
  const x = (t) => L + ((t - lo) / (hi - lo)) * (W - L - R);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "scenes over time" });
  svg.append(s("line", { x1: L, x2: W - R, y1: 50, y2: 50, class: "axis", "stroke-width": 2 }));
  svg.append(s("text", { x: L, y: 80 }, new Date(lo).toISOString().slice(0, 10)));
  svg.append(s("text", { x: W - R, y: 80, "text-anchor": "end" }, new Date(hi).toISOString().slice(0, 10)));
  scenes.forEach((scene, i) => {
    const r = 5 + 9 * scene.importance;
    const dot = s("circle", {
      cx: x(times[i]), cy: 50, r, class: "dot", fill: COLORS[scene.category] || COLORS.general,
      "fill-opacity": 0.8, stroke: "#fff", "data-scene": scene.id,
    });
    dot.append(s("title", {}, `${scene.created_at.slice(0, 10)} ${scene.category}: ` +
      (sceneField(scene.text, ["Core: ", "核心："]) || scene.text)));
    dot.addEventListener("click", () => showImportance(scene));
    svg.append(dot);
  });
  box.replaceChildren(svg);
}

// --- importance over time ---------------------------------------------------------------------

async function showImportance(scene) {
  const still = current();
  state.selected = scene.id;
  for (const li of document.querySelectorAll("#scenes li")) {
    li.classList.toggle("selected", li.dataset.scene === String(scene.id));
  }
  const history = await api("GET", `/memories/${scene.id}/history` + q({ tenant: state.tenant }));
  if (!still()) return;
  $("importance-panel").hidden = false;
  $("importance-title").textContent = `scene ${scene.id}, ${scene.category}`;
  drawImportance(history);
  const events = history.events.map((e) => h("li", {},
    `${e.at.slice(0, 16).replace("T", " ")} · ${e.who}: ${fmt(e.old)} → ${fmt(e.new)} (${e.why})`));
  if (!events.length) events.push(h("li", { class: "muted" }, "No reinforcement or decay recorded yet."));
  $("importance-events").replaceChildren(...events);
  $("importance-panel").scrollIntoView({ behavior: "instant", block: "nearest" });
}

const fmt = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(2));
const DAY = 86400e3;

function drawImportance(hist) {
  const W = 900, H = 260, L = 44, R = 20, T = 14, B = 34;
  const m = hist.memory;
  const now = Date.parse(hist.now);
  const start = Date.parse(hist.decay_clock_started || m.created_at);
  const created = Date.parse(m.created_at);
  const proj = (hist.projection || []).map((p) => [now + p.days * DAY, p.importance]);
  const lo = Math.min(created, start), hi = proj.length ? proj[proj.length - 1][0] : now + 30 * DAY;
  const x = (t) => L + ((t - lo) / (hi - lo || 1)) * (W - L - R);
  const y = (v) => T + (1 - v) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "importance over time", id: "importance-svg" });
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "axis" }));
    svg.append(s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, v.toFixed(2)));
  }
  const ticks = [[lo, "created"], [now, "now"], [hi, "+1 year"]];
  for (const [t, label] of ticks) {
    const anchor = t === hi ? "end" : t === lo ? "start" : "middle";
    svg.append(s("text", { x: x(t), y: H - 8, "text-anchor": anchor },
      `${label} ${new Date(t).toISOString().slice(0, 10)}`));
  }
  svg.append(s("line", { x1: x(now), x2: x(now), y1: T, y2: H - B, stroke: "#999", "stroke-dasharray": "2 3" }));
  // Stored importance: what decay starts from.
  svg.append(s("line", {
    x1: L, x2: W - R, y1: y(m.importance), y2: y(m.importance), stroke: "#2f6f8f",
    "stroke-dasharray": "6 4", "stroke-opacity": 0.6,
  }));
  svg.append(s("text", { x: W - R, y: y(m.importance) - 4, "text-anchor": "end", class: "base-label" },
    `base ${m.importance.toFixed(2)}`));
  // Importance after decay: flat until decay starts, then the hippocampus' projection.
  const pts = [[start, m.importance]];
  if (hist.decay_starts) {
    const ds = Date.parse(hist.decay_starts);
    if (ds > start && ds < now) pts.push([ds, m.importance]);
  }
  pts.push([now, hist.importance_now ?? m.importance], ...proj.slice(1));
  svg.append(s("polyline", {
    points: pts.map(([t, v]) => `${x(t)},${y(v)}`).join(" "), fill: "none", stroke: "#b5651d",
    "stroke-width": 2.5, class: "decay-curve",
  }));
  svg.append(s("circle", { cx: x(now), cy: y(hist.importance_now ?? m.importance), r: 5, fill: "#b5651d" }));
  for (const e of hist.events) {
    const t = Date.parse(e.at);
    const c = s("circle", { cx: x(t), cy: y(e.new), r: 6, fill: "#3c8d40", class: "reinforcement" });
    c.append(s("title", {}, `${e.who}: ${fmt(e.old)} → ${fmt(e.new)} (${e.why})`));
    svg.append(c);
  }
  const legend = [["#2f6f8f", "stored (base)"], ["#b5651d", "after decay (projected)"], ["#3c8d40", "reinforcements"]];
  legend.forEach(([color, label], i) => {
    svg.append(s("rect", { x: L + 10 + i * 190, y: T + 2, width: 12, height: 12, fill: color }));
    svg.append(s("text", { x: L + 28 + i * 190, y: T + 12 }, label));
  });
  $("importance-plot").replaceChildren(svg);
}

// --- recall playground ------------------------------------------------------------------------

async function runRecall(event) {
  event.preventDefault();
  if (!state.user) return;
  const still = current();
  const box = $("recall-results");
  box.replaceChildren(h("p", { class: "muted" }, "recalling…"));
  try {
    const hits = await api("POST", "/recall", {
      query: $("recall-query").value,
      scope: { tenant: state.tenant, user_id: state.user.user_id },
      k: Number($("recall-k").value) || 5,
      reinforce: false,
      explain: true,
    });
    if (!still()) return;
    if (!hits.length) {
      box.replaceChildren(h("p", { class: "muted no-hits" }, "Nothing clears the relevance floor."));
      return;
    }
    box.replaceChildren(...hits.map((hit, i) => {
      const w = hit.why || {};
      const sources = Object.entries(w.sources || {}).map(([k, v]) => `${k} #${v + 1}`).join(", ");
      return h("div", { class: "hit", "data-memory": hit.id },
        h("div", {}, h("span", { class: "score" }, `${i + 1}. ${hit.score.toFixed(3)}`), " ",
          h("span", { class: "tag", style: `background:${hit.kind === "scene" ? "#2f6f8f" : "#6a7077"}` }, hit.kind),
          hit.text),
        h("div", { class: "why" },
          h("span", {}, "dense ", h("b", {}, fmt(w.dense))),
          h("span", {}, "keyword ", h("b", {}, w.keyword === null ? "–" : Number(w.keyword).toFixed(2))),
          h("span", {}, "matched ", h("b", {}, (w.matched || []).join(", ") || "–")),
          h("span", {}, "sources ", h("b", {}, sources || "–")),
          h("span", {}, "fused ", h("b", {}, fmt(w.fused))),
          h("span", {}, "importance now ", h("b", {}, fmt(w.importance_now))),
          h("span", {}, "factor ", h("b", {}, fmt(w.importance_factor))),
          h("span", {}, "age ", h("b", {}, `${Number(w.age_days || 0).toFixed(1)} d`))));
    }));
  } catch (e) {
    if (still()) box.replaceChildren(h("p", { class: "error" }, e.message));
  }
}

// --- summary, graph, patterns -----------------------------------------------------------------

async function loadSummary() {
  if (!state.user) return;
  const still = current();
  const depth = Number($("summary-depth").value);
  $("summary-depth-value").textContent = depth;
  try {
    const out = await api("GET", "/summary" + q({ tenant: state.tenant, user_id: state.user.user_id, depth }));
    if (!still()) return;
    $("summary-depth").max = Math.max(1, out.maxDepth || 1);
    $("summary").textContent = shown(out.retelling || "(nothing to tell yet)");
  } catch (e) {
    if (still()) $("summary").textContent = shown(e.message);
  }
}

const TASKS_PER_CHAIN = 20;
const FACTS_SHOWN = 500;

async function loadGraph() {
  const still = current();
  const user = state.user.user_id;
  const [persona, graph, chains] = await Promise.all([
    tool("persona_get", { user_id: user }),
    // Every fact of the user's graph, not a walk from "user": one further than its hops, or
    // linked to nothing of the user's ("sister lives_in Paris"), was left out of a list called whole.
    tool("memory_facts", { user_id: user, limit: FACTS_SHOWN }),
    // Every chat with tasks, those without facts too (the chats of the facts missed them).
    tool("task_chains", { user_id: user, limit: TASKS_PER_CHAIN }),
  ]);
  if (!still()) return;
  // The default, then each chat's own (asked without a chat, the tool gives both): a persona
  // set for one chat was shown as "none set" while the bot was given it there.
  const personas = [h("p", {}, h("b", {}, persona.chats.length ? "Persona (default): " : "Persona: "),
    persona.persona ? persona.rendered : h("span", { class: "muted" }, "none set"))];
  for (const p of persona.chats) {
    personas.push(h("p", { "data-chat": p.chat_id }, h("b", {}, `Persona in ${p.chat_id}: `),
      p.description + (p.traits.length ? ` · traits: ${p.traits.join(", ")}` : "") +
      (p.tone ? ` · tone: ${p.tone}` : "")));
  }
  $("persona").replaceChildren(...personas);
  const rows = graph.facts.map((e) => h("tr", {},
    h("td", {}, e.subject), h("td", {}, e.relation + (e.speculative ? " (speculative)" : "")),
    h("td", {}, e.object), h("td", {}, fmt(e.confidence)), h("td", {}, `${e.count}×`)));
  if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No facts about the user.")));
  // A cut list says so: the facts table showed the first 100 and nothing of the rest.
  if (graph.more) {
    rows.push(h("tr", {}, h("td", { colspan: 5, class: "muted", id: "facts-cut" },
      `The first ${graph.facts.length} facts about the user are shown (the newest); more are stored ` +
      "(memory_facts with before_id, or an export, has them).")));
  }
  $("facts").tBodies[0].replaceChildren(...rows);
  const parts = chains.chains.map((chain) => h("p", { "data-chat": chain.chat_id },
    h("b", {}, `Task chain in ${chain.chat_id}: `),
    chain.tasks.map((t) => `${t.task_id} [${t.state}] ${t.description}`).join(" ← "),
    chain.total > chain.tasks.length
      ? h("span", { class: "muted" }, ` (the newest ${chain.tasks.length} of ${chain.total} tasks)`) : ""));
  if (!parts.length) parts.push(h("p", { class: "muted" }, "No task chains."));
  $("tasks").replaceChildren(...parts);
}

async function loadPatterns() {
  const still = current();
  const p = await api("GET", "/patterns" + q({ tenant: state.tenant, user_id: state.user.user_id }));
  if (!still()) return;
  const rows = p.counts.map((c) => h("tr", {}, h("td", {}, c.kind), h("td", {}, c.label), h("td", {}, c.at_least ? `${c.count}+` : c.count)));
  if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "None seen yet.")));
  $("counts").tBodies[0].replaceChildren(...rows);
  const fired = p.triggers.map((t) => h("li", {}, `${t.kind} “${t.label}” reached ${t.count}` +
    (t.suggestion ? ` — ${t.suggestion}` : "")));
  if (!fired.length) fired.push(h("li", { class: "muted" }, "No trigger fired."));
  $("triggers").replaceChildren(...fired);
}

// --- forgetting, with a confirmation step -----------------------------------------------------

// ``also``: the text of a choice offered beside it (ticked at first when ``alsoTicked``), read
// after with alsoChosen().
function confirmStep(title, text, expected, also, alsoTicked = false) {
  return new Promise((resolve) => {
    $("confirm-title").textContent = shown(title);
    $("confirm-text").textContent = shown(text);
    $("confirm-also-box").hidden = !also;
    $("confirm-also-text").textContent = shown(also || "");
    $("confirm-also").checked = alsoTicked;
    $("confirm-type-box").hidden = !expected;
    $("confirm-expected").textContent = shown(expected || "");
    $("confirm-typed").value = "";
    $("confirm-ok").disabled = Boolean(expected);
    $("confirm").hidden = false;
    const done = (answer) => {
      $("confirm").hidden = true;
      $("confirm-ok").onclick = $("confirm-cancel").onclick = $("confirm-typed").oninput = null;
      resolve(answer);
    };
    $("confirm-typed").oninput = () => { $("confirm-ok").disabled = $("confirm-typed").value !== expected; };
    $("confirm-ok").onclick = () => done(true);
    $("confirm-cancel").onclick = () => done(false);
  });
}

const alsoChosen = () => !$("confirm-also-box").hidden && $("confirm-also").checked;

// The scene alone leaves the messages it came from, and what else was made of them (their words
// as the bot is given them, facts): said "deleted for good", it left all that to the bot.
async function forgetScene(scene) {
  if (!state.user) return;
  const { tenant, view } = state;
  const user = state.user.user_id;
  const core = sceneField(scene.text, ["Core: ", "核心："]) || scene.text;
  const sources = scene.message_ids.length;
  const also = sources
    ? `Also forget the ${sources === 1 ? "message" : `${sources} messages`} of chat ${scene.chat_id} ` +
      "it came from, with everything made of them (their words, facts drawn from them). " +
      "Unticked, those stay, and the bot is still given them."
    : "";
  // Ticked for a scene of one message (the scene is that message told); a pattern's cites
  // several, each a message of its own the person may want kept.
  const asked = confirmStep("Forget this scene?", `“${core}” will be deleted for good.`, undefined, also, sources === 1);
  if (!await asked) return;
  const sourcesToo = alsoChosen();
  if (view !== state.view) return;  // another tenant or user came up meanwhile
  try {
    if (sourcesToo) {
      // First: it takes the scene with them, and should it fail, the scene is still there to
      // try again from.
      await api("POST", "/messages/delete", { chat_id: scene.chat_id, message_ids: scene.message_ids, tenant });
    }
    try {
      await api("POST", "/tools/soul_narrative", { action: "forget", user_id: user, id: scene.id, tenant });
    } catch (e) {
      if (!sourcesToo) throw e;  // gone with its messages already
    }
    status(`scene ${scene.id} forgotten` + (sourcesToo ? ", with the messages it came from" : ""));
    if (state.selected === scene.id) $("importance-panel").hidden = true;
    $("recall-results").replaceChildren();  // what it found may be gone
    await refreshUser();
  } catch (e) { status(e.message, true); }
}

// After a forget the user's counts changed: the list (as much of it as is shown, the selection
// kept) and the header are drawn again from fresh rows.
async function refreshUser() {
  const still = current();
  const user = state.user.user_id;
  await loadUsers(true);
  if (!still()) return;
  const fresh = state.users.find((u) => u.user_id === user);
  if (!fresh) {  // nothing of theirs is left
    resetView();
    return;
  }
  state.user = fresh;
  drawUsers();
  drawHeader(fresh);
  // What the scene's messages left may be gone from every panel, not the timeline alone.
  await Promise.all([loadScenes(), loadSummary(), loadGraph(), loadPatterns()].map(
    (p) => p.catch((e) => status(e.message, true))));
}

async function forgetUser() {
  if (!state.user) return;
  const { tenant, view } = state;
  const user = state.user.user_id;
  if (!await confirmStep("Forget this user?",
    `Every memory, fact, summary and count of ${user} in ${tenant} will be deleted for good.`, user)) return;
  if (view !== state.view) return;
  try {
    await api("POST", "/forget", { tenant, user_id: user });
    status(`${user} forgotten`);
    resetView();
    await loadUsers(true);
  } catch (e) { status(e.message, true); }
}

// --- wiring -----------------------------------------------------------------------------------

$("tenant").addEventListener("change", () => {
  state.tenant = $("tenant").value;
  resetView();
  loadUsers().catch((e) => status(e.message, true));
});
$("users-more").addEventListener("click", moreUsers);
$("scenes-more").addEventListener("click", moreScenes);
$("key").addEventListener("change", () => {
  sessionStorage.setItem("narrmem-key", $("key").value.trim());
  loadTenants();
});
$("recall-form").addEventListener("submit", runRecall);
$("summary-depth").addEventListener("change", loadSummary);
$("forget-user").addEventListener("click", forgetUser);
loadTenants();
