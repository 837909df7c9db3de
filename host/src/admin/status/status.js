// The status page's script: reads GET /status every two seconds and
// redraws the page from it. Everything from the host is put in as text
// (textContent), never as markup: reasons and ids come from plugins and
// producers.
"use strict";

const REFRESH_MS = 2000;
const OUTCOMES = ["acked", "retried", "dead_lettered", "rejected", "parked"];
const TOKEN_KEY = "acemq-admin-token";

function element(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell);
  return tr;
}

function replaceRows(table, rows) {
  const body = document.querySelector(table + " tbody");
  body.replaceChildren(...rows);
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return Math.round(value * 1000) + " ms";
  if (value < 120) return value.toFixed(1) + " s";
  return Math.round(value / 60) + " min";
}

function rate(value) {
  if (value === null || value === undefined) return "–";
  if (value === 0) return "0";
  return value < 10 ? value.toFixed(2) : value.toFixed(0);
}

function duration(totalSeconds) {
  const d = Math.floor(totalSeconds / 86400);
  const h = Math.floor((totalSeconds % 86400) / 3600);
  const m = Math.floor((totalSeconds % 3600) / 60);
  return "up " + (d ? d + "d " : "") + (h ? h + "h " : "") + m + "m";
}

function rateCell(consumer, outcome) {
  const td = element("td", null, "number rate");
  td.dataset.outcome = outcome;
  const minute = consumer.rates[0] && consumer.rates[0].per_second;
  const five = consumer.rates[1] && consumer.rates[1].per_second;
  td.appendChild(element("span", rate(minute ? minute[outcome] : null), "one"));
  td.appendChild(document.createTextNode(" "));
  td.appendChild(element("span", "(" + rate(five ? five[outcome] : null) + ")", "five"));
  if (consumer.totals) td.title = consumer.totals[outcome] + " since the host started";
  return td;
}

function pluginCell(plugin) {
  const td = element("td", null, "plugin");
  if (!plugin) return td;
  const name = plugin.path.split("/").pop();
  td.appendChild(element("span", name + " "));
  td.appendChild(element("code", plugin.sha256.slice(0, 12)));
  td.appendChild(element("span", " " + plugin.role, "quiet"));
  td.title = plugin.path + "\n" + plugin.sha256 + "\nloaded " + plugin.loaded_at;
  if (plugin.faulting) td.appendChild(element("div", plugin.faulting, "bad"));
  return td;
}

function rolloutLine(rollout) {
  if (!rollout) return null;
  const what = rollout.status === "running"
    ? rollout.mode + " " + rollout.candidate_sha256.slice(0, 12) + " at " + rollout.share
    : rollout.mode + " " + rollout.candidate_sha256.slice(0, 12) + " " + rollout.status.replace("_", " ");
  const line = element("div", "candidate: " + what, "rollout " + rollout.status);
  line.title = rollout.candidate_path;
  return line;
}

function drawConsumers(consumers) {
  replaceRows("#consumers", consumers.map((c) => {
    const plugin = pluginCell(c.plugin);
    const rollout = rolloutLine(c.rollout);
    if (rollout) plugin.appendChild(rollout);
    const tr = row([
      element("td", c.queue, "queue"),
      element("td", c.reading.replace("_", " "), "reading " + c.reading),
      plugin,
      ...OUTCOMES.map((o) => rateCell(c, o)),
      element("td", c.in_flight, "number in-flight"),
      element("td", seconds(c.oldest_unacked_s), "number oldest"),
      element("td", c.stream && c.stream.lag !== null ? c.stream.lag : "–", "number lag"),
    ]);
    tr.dataset.queue = c.queue;
    if (c.reason) tr.title = c.reason;
    return tr;
  }));
  const setAside = document.getElementById("set-aside");
  const blocks = consumers.filter((c) => c.set_aside.length > 0).map((c) => {
    const block = element("div", null, "set-aside");
    block.dataset.queue = c.queue;
    block.appendChild(element("h3", c.queue));
    const list = element("ul");
    for (const note of c.set_aside) {
      const li = element("li");
      li.appendChild(element("span", note.at + " ", "quiet"));
      li.appendChild(element("span", note.outcome.replace("_", " ") + ": ", note.outcome));
      li.appendChild(element("span", note.reason, "reason"));
      li.title = "message " + note.message_id;
      list.appendChild(li);
    }
    block.appendChild(list);
    return block;
  });
  if (blocks.length === 0) blocks.push(element("p", "Nothing set aside since the host started.", "quiet"));
  setAside.replaceChildren(...blocks);
}

function draw(doc) {
  const host = doc.host;
  document.getElementById("version").textContent = host.version + " (" + host.commit + ")";
  const status = document.getElementById("status");
  status.textContent = host.status;
  status.className = "status " + host.status;
  document.getElementById("consuming").textContent = host.consuming + " consumers reading,";
  document.getElementById("uptime").textContent = duration(host.uptime_s);
  document.getElementById("updated").textContent = "· updated " + new Date().toLocaleTimeString();
  document.getElementById("details").replaceChildren(...host.details.map((d) => element("li", d)));
  replaceRows("#connections", doc.connections.map((c) => row([
    element("td", c.role),
    element("td", c.state, c.state),
    element("td", c.detail || "", "quiet"),
  ])));
  drawConsumers(doc.consumers);
  document.body.dataset.loaded = "true";
}

function askForToken(message) {
  document.getElementById("token").hidden = false;
  document.getElementById("token-error").textContent = message || "";
}

async function refresh() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: "Bearer " + token } : {};
  try {
    const response = await fetch("/status", { headers, cache: "no-store" });
    if (response.status === 401) {
      askForToken(token ? "That token was refused." : "");
      return;
    }
    document.getElementById("token").hidden = true;
    if (!response.ok) throw new Error("GET /status answered " + response.status);
    draw(await response.json());
  } catch (e) {
    const status = document.getElementById("status");
    status.textContent = "NO ANSWER";
    status.className = "status DOWN";
    document.getElementById("updated").textContent = "· " + e.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-use").addEventListener("click", () => {
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
  });
  refresh();
});
