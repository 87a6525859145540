// kubectl gr dashboard: the page. It draws what the server's event stream sends (a snapshot after each
// change the API server reports) and posts the buttons' actions; it never reloads or polls. The token the
// command printed in the address is sent with every request (see server.py for the guard).
"use strict";

(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const $ = (sel) => document.querySelector(sel);
  let source = null;   // the EventSource of the current view
  let selected = null; // "namespace/name", or null for the list
  let current = null;  // the last snapshot
  const charts = {};   // name -> uPlot, for the release shown
  const TERMINAL = new Set(["Succeeded", "Aborted", "Failed", "InvalidSpec", "Idle"]);

  // --- small helpers ------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "data") Object.assign(node.dataset, v);
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
    return node;
  }

  function age(text) {
    if (!text) return "-";
    const t = Date.parse(text);
    if (isNaN(t)) return "-";
    let s = Math.max(0, Math.floor((Date.now() - t) / 1000));
    if (s < 120) return s + "s";
    if (s < 600) return Math.floor(s / 60) + "m" + (s % 60) + "s";
    if (s < 3 * 3600) return Math.floor(s / 60) + "m";
    if (s < 48 * 3600) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }

  function timeCell(text) {
    return el("td", { class: "num", data: { time: text || "" }, title: text || "" }, age(text));
  }

  function clock(text) {
    if (!text) return "";
    const d = new Date(text);
    return isNaN(d) ? text : d.toLocaleTimeString();
  }

  function number(v) {
    if (v === null || v === undefined) return "-";
    return Math.abs(v) >= 1000 || v === Math.round(v) ? String(v) : Number(v).toPrecision(4).replace(/\.?0+$/, "");
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  // --- the stream ---------------------------------------------------------------------------------------

  function connect() {
    if (source) source.close();
    const q = new URLSearchParams({ token });
    if (selected) q.set("release", selected);
    source = new EventSource("/api/stream?" + q.toString());
    source.addEventListener("snapshot", (e) => {
      current = JSON.parse(e.data);
      render();
    });
    source.onopen = () => live(true);
    source.onerror = () => live(false);
  }

  function live(on) {
    const badge = $("#live");
    badge.className = on ? "on" : "";
    badge.textContent = on ? "live" : "reconnecting…";
  }

  function route() {
    const m = location.hash.match(/^#\/([^/]+)\/([^/]+)$/);
    selected = m ? decodeURIComponent(m[1]) + "/" + decodeURIComponent(m[2]) : null;
    current = null;
    for (const name of Object.keys(charts)) { charts[name].destroy(); delete charts[name]; }
    $("#gates").replaceChildren();
    $("#notice").textContent = "";
    $("#notice").className = "";
    $("#list-view").hidden = !!selected;
    $("#release-view").hidden = !selected;
    connect();
  }

  // --- rendering ----------------------------------------------------------------------------------------

  function render() {
    if (!current) return;
    $("#scope").textContent = current.scope ? "namespace " + current.scope : "all namespaces";
    const errors = Object.entries(current.errors || {}).filter(([k]) => k !== "policies");
    $("#errors").hidden = errors.length === 0;
    $("#errors").textContent = errors.map(([k, v]) => "Cannot watch the " + k + ": " + v).join(" · ");
    if (selected) renderRelease(current.release);
    else renderList(current.releases || []);
  }

  // A row per release, kept across snapshots (its cells are redrawn): a row being clicked is never swapped.
  const rows = new Map();

  function renderList(releases) {
    $("#empty").hidden = releases.length > 0 || !current.synced;
    const tbody = $("#releases tbody");
    const shown = new Set();
    for (const r of releases) {
      const key = r.namespace + "/" + r.name;
      shown.add(key);
      let row = rows.get(key);
      if (!row) {
        row = el("tr", { data: { release: key } });
        row.addEventListener("click", () => { location.hash = "#/" + encodeURIComponent(r.namespace) + "/" + encodeURIComponent(r.name); });
        rows.set(key, row);
      }
      row.replaceChildren(
        el("td", {}, el("b", {}, r.name)),
        el("td", {}, r.namespace),
        el("td", { class: "phase-cell" }, el("span", { class: "phase " + r.phase }, r.phase)),
        el("td", { class: "num batch" }, r.phase === "Queued" && r.queuePosition ? "queued #" + r.queuePosition : r.batch + "/" + (r.batches || "?")),
        el("td", { class: "num weight" }, r.weight + "%"),
        el("td", {}, r.mode + " · " + r.routing),
        el("td", { class: "muted" }, r.message),
        timeCell(r.created));
      tbody.append(row); // in the list's order (moving a row keeps it)
    }
    for (const [key, row] of rows) {
      if (!shown.has(key)) { row.remove(); rows.delete(key); }
    }
  }

  function renderRelease(d) {
    const [ns, name] = selected.split("/");
    $("#r-name").textContent = name;
    $("#r-namespace").textContent = ns;
    if (!d) {
      $("#r-phase").textContent = current.synced ? "not found" : "loading";
      $("#r-phase").className = "phase";
      $("#r-message").textContent = current.synced ? "There is no GreyRelease " + name + " in namespace " + ns + "." : "";
      return;
    }
    const s = d.summary;
    $("#r-phase").textContent = s.phase + (s.batchState ? " · " + s.batchState : "");
    $("#r-phase").className = "phase " + s.phase;
    $("#r-message").textContent = s.message + (s.seen ? "" : " (the controller has not seen the latest spec yet)");
    $("#r-batch").textContent = s.batch + "/" + (s.batches || "?");
    $("#r-weight").textContent = s.weight + "%";
    $("#r-replicas").textContent = d.replicas.canary + " canary · " + d.replicas.stable + " stable";
    $("#r-versions").textContent = (d.versions.stable || "-") + " → " + (d.versions.target || "-");
    $("#r-mode").textContent = s.mode + " · " + s.routing;
    $("#r-age").dataset.time = s.phaseStartedAt || "";
    $("#r-age").textContent = age(s.phaseStartedAt);
    for (const button of document.querySelectorAll("button[data-action]")) {
      button.disabled = !d.actions[button.dataset.action] || button.dataset.busy === "1";
    }
    renderTraffic(d.traffic, s);
    renderGovernance(d.governance);
    renderBatches(d.batches);
    renderGates(d.gates, d.webhooks);
    renderEvents(d.events);
  }

  function size(node) {
    return { width: Math.max(300, node.clientWidth - 4), height: 220 };
  }

  function chart(name, node, opts, data) {
    let plot = charts[name];
    if (plot && plot.series.length !== opts.series.length) { plot.destroy(); plot = null; }
    if (!plot) {
      node.replaceChildren();
      plot = charts[name] = new uPlot(Object.assign(size(node), opts), data, node);
    } else {
      plot.setData(data);
    }
    return plot;
  }

  function renderTraffic(traffic, s) {
    const t = traffic.t.slice(), w = traffic.weight.slice();
    if (t.length && !TERMINAL.has(s.phase)) { t.push(Date.now() / 1000); w.push(w[w.length - 1]); }
    const node = $("#traffic-chart");
    if (!t.length) { node.textContent = "No traffic has moved yet."; if (charts.traffic) { charts.traffic.destroy(); delete charts.traffic; } return; }
    chart("traffic", node, {
      scales: { y: { range: [0, 100] } },
      axes: [{}, { values: (u, vals) => vals.map((v) => v + "%"), size: 50 }],
      legend: { show: true },
      series: [{}, { label: "canary weight %", stroke: "#2f6fde", width: 2, fill: "rgba(47,111,222,0.12)", points: { show: false }, paths: uPlot.paths.stepped({ align: 1 }) }],
    }, [t, w]);
  }

  function term(label, value, cls) {
    return [el("dt", {}, label), el("dd", cls ? { class: cls } : {}, value)];
  }

  function renderGovernance(g) {
    const rows = [];
    rows.push(...term("Release window", g.window.text + (g.window.until ? " (until " + new Date(g.window.until).toLocaleString() + ")" : ""), g.window.state));
    if (g.sources.length) rows.push(...term("Windows and freezes from", g.sources.join(", ")));
    if (g.policiesNote) rows.push(...term("Policies", g.policiesNote));
    if (g.queuePosition) rows.push(...term("Queue", "position " + g.queuePosition));
    rows.push(...term("Waiting for", g.waitingFor || "nothing"));
    if (g.approvalExpiresAt) rows.push(...term("Approval expires", new Date(g.approvalExpiresAt).toLocaleString()));
    if (g.nextCheckAt) rows.push(...term("Pause ends", clock(g.nextCheckAt)));
    if (g.awaitingConfirmation) rows.push(...term("Confirmation", "webhook " + g.awaitingConfirmation));
    if (g.after.length) rows.push(...term("Comes after", g.after.join(", ")));
    rows.push(...term("Requested", g.requested.length ? g.requested.join(", ") : "-"));
    $("#governance").replaceChildren(...rows);
  }

  function renderBatches(batches) {
    fill($("#batches tbody"), batches.map((b) => el("tr", { data: { batch: b.batch, state: b.state } },
      el("td", { class: "num" }, b.batch),
      el("td", { class: "num" }, b.canary == null ? "-" : b.canary),
      el("td", { class: "num" }, b.weight == null ? "-" : b.weight + "%"),
      el("td", {}, b.pause || "-"),
      el("td", {}, el("span", { class: "state " + b.state.split(" ")[0] }, b.state)),
      el("td", {}, clock(b.startedAt)),
      el("td", {}, clock(b.readyAt)),
      el("td", {}, clock(b.finishedAt)),
      el("td", {}, b.result))));
  }

  function renderGates(gates, webhooks) {
    const box = $("#gates");
    const names = new Set(gates.map((g) => g.name));
    for (const name of Object.keys(charts)) {
      if (name.startsWith("gate:") && !names.has(name.slice(5))) { charts[name].destroy(); delete charts[name]; }
    }
    for (const node of Array.from(box.children)) if (!names.has(node.dataset.gate)) node.remove();
    for (const g of gates) {
      let node = box.querySelector('[data-gate="' + CSS.escape(g.name) + '"]');
      if (!node) {
        node = el("div", { class: "gate", data: { gate: g.name } }, el("div", { class: "head" }), el("div", { class: "chart" }));
        box.append(node);
      }
      node.querySelector(".head").replaceChildren(
        el("b", {}, g.name),
        el("span", { class: "verdict " + g.verdict }, g.verdict),
        el("span", {}, "last " + number(g.value)),
        el("span", { class: "muted" }, "passes " + g.threshold),
        el("span", { class: "muted" }, g.message));
      const plotNode = node.querySelector(".chart");
      if (!g.t.length) { plotNode.textContent = "No check yet."; delete charts["gate:" + g.name]; continue; }
      // The canary last, so that it is drawn over the stable where the two are equal.
      const series = [{}], data = [g.t];
      if (g.upper.some((v) => v != null)) { series.push({ label: "highest passing", stroke: "#c53030", dash: [6, 4], width: 1.5, points: { show: false } }); data.push(g.upper); }
      if (g.lower.some((v) => v != null)) { series.push({ label: "lowest passing", stroke: "#b7791f", dash: [6, 4], width: 1.5, points: { show: false } }); data.push(g.lower); }
      if (g.compared) { series.push({ label: "stable", stroke: "#9aa5b4", width: 4, points: { show: false } }); data.push(g.stable); }
      series.push({ label: "canary", stroke: "#2f6fde", width: 2, points: { show: true, size: 5 } });
      data.push(g.values);
      chart("gate:" + g.name, plotNode, { series, axes: [{}, { size: 60 }] }, data);
    }
    const table = $("#webhooks");
    table.hidden = webhooks.length === 0;
    fill(table.querySelector("tbody"), webhooks.map((w) => el("tr", {},
      el("td", {}, w.name), el("td", {}, w.at), el("td", { class: "num" }, w.code == null ? "-" : w.code),
      el("td", {}, w.value == null ? "-" : w.value), el("td", { class: "verdict " + (w.verdict || "Pending") }, w.verdict || "Pending"),
      timeCell(w.checkedAt), el("td", { class: "muted" }, w.message || ""))));
    $("#no-gates").hidden = gates.length > 0 || webhooks.length > 0;
  }

  function renderEvents(events) {
    fill($("#events tbody"), events.map((e) => el("tr", { class: e.type },
      timeCell(e.time),
      el("td", {}, e.type),
      el("td", { class: "reason" }, e.reason),
      el("td", {}, e.message + (e.count > 1 ? " (x" + e.count + ")" : "")))));
  }

  // --- actions ------------------------------------------------------------------------------------------

  const ASK = {
    abort: "Abort this release? All traffic goes back to the stable now.",
    "promote-full": "Promote in full? The remaining batches are skipped.",
  };

  async function act(button) {
    const action = button.dataset.action;
    if (ASK[action] && !window.confirm(ASK[action])) return;
    const notice = $("#notice");
    const [ns, name] = selected.split("/");
    button.dataset.busy = "1";
    button.disabled = true;
    notice.className = "";
    notice.textContent = action + "…";
    try {
      const resp = await fetch("/api/releases/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name) + "/" + action, {
        method: "POST",
        headers: { "X-GreyRelease-Token": token },
      });
      const body = await resp.json().catch(() => ({ error: resp.status + " " + resp.statusText }));
      if (resp.ok) {
        notice.className = "ok";
        notice.textContent = [body.done, ...(body.notes || []).map((n) => "note: " + n)].join(" · ");
      } else {
        notice.className = "error";
        notice.textContent = body.error || resp.status + " " + resp.statusText;
      }
    } catch (err) {
      notice.className = "error";
      notice.textContent = "The dashboard did not answer: " + err;
    } finally {
      delete button.dataset.busy;
      render();
    }
  }

  for (const button of document.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", () => act(button));
  }

  // Ages and the traffic line's end move with the clock (drawn here; nothing is asked of the server).
  setInterval(() => {
    for (const node of document.querySelectorAll("[data-time]")) {
      if (node.dataset.time) node.textContent = age(node.dataset.time);
    }
  }, 1000);
  window.addEventListener("resize", () => {
    for (const name of Object.keys(charts)) {
      const node = charts[name].root.parentNode;
      charts[name].setSize(size(node));
    }
  });
  window.addEventListener("hashchange", route);
  route();
})();
