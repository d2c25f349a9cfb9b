// Weir's live page. Polls the JSON API once a second (only while the page is visible), keeps
// five minutes of readings for the charts, and edits a policy with its ETag. The admin token
// lives only in this script's memory and is sent only in the Authorization header.
"use strict";
(function () {
  const POINTS = 300;            // five minutes at one reading a second
  const PERIOD_MS = 1000;
  const POLICIES_EVERY = 5;      // the configs change rarely: read them every fifth tick
  const MIN_CHART = 200;         // px: fits a 320 px phone's card

  let token = null;
  let policies = new Map();      // name -> {config, etag}, from /v1/policies
  let prevStats = null;          // the numbers the policy cards showed last, for rates
  let shownScope = null;         // whose numbers the cards show: "node" or "cluster"
  let prevCluster = null;
  let ticks = 0;
  const series = new Map();      // name -> arrays for the chart
  const charts = new Map();      // name -> uPlot
  const clusterSeries = [[], [], [], []];
  const markers = [];            // {t, text}: membership changes
  let lastMembers = null;
  let lastGeneration = null;
  let clusterChart = null;
  let clusterMode = "single node";
  let throttleRows = [];
  let sort = { column: "current_qps", descending: true };
  let editing = { name: null, etag: null };
  let writesNeedToken = null;    // from /v1/stats: false means the page stays read-only

  const ui = { charts, generation: 0, throttleRows: [], throttleFetchedAt: 0 };
  window.weirUi = ui;

  const $ = (id) => document.getElementById(id);
  // Text from the server, as `weir top` shows it: control characters and bidirectional
  // overrides as escapes (`\u{202e}`), a backslash doubled, so that a key cannot show itself as
  // another ("…\u{202e}gnp.exe" read as "…exe.png"). Each piece is also isolated (style.css).
  const BIDI_OR_CONTROL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\\]/g;
  const shown = (text) => String(text).replace(BIDI_OR_CONTROL, (c) => c === "\\" ? "\\\\" :
    c === "\n" ? "\\n" : `\\u{${c.codePointAt(0).toString(16)}}`);
  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "text") node.textContent = shown(v);
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children || []) node.append(c);
    return node;
  }
  const fmt = (v, digits) => v == null ? "–" :
    Number(v).toLocaleString("en-US", { maximumFractionDigits: digits ?? 1 });

  // A bar for `used` against `limit`, with its value in words for screen readers.
  function meter(label, used, limit) {
    const ratio = limit ? used / limit : 0;
    const bar = el("div", { class: "meter" + (ratio >= 1 ? " over" : ""), role: "meter",
      "aria-label": label, "aria-valuemin": "0", "aria-valuemax": String(limit || 0),
      "aria-valuenow": String(used),
      "aria-valuetext": `${fmt(used)} of ${fmt(limit)} (${fmt(ratio * 100, 0)}%)` });
    bar.append(el("span", {}));
    bar.firstChild.style.width = `${Math.min(100, ratio * 100)}%`;
    return bar;
  }
  // The policies whose limit is a count of requests in flight, not a rate.
  const isConcurrency = (policy) => policies.get(policy)?.config?.concurrency != null;

  async function getJson(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok) throw new Error(`${path}: ${response.status}`);
    return { body: await response.json(), etag: response.headers.get("ETag"),
      source: response.headers.get("Weir-Policy-Source") };
  }

  // --- policies -------------------------------------------------------------------------
  // A policy names exactly one limiter, and its table is the policy's only field that is a
  // table: found by shape, so a new limiter needs no list here.
  function limiterOf(config) {
    const found = Object.keys(config).find((k) =>
      config[k] != null && typeof config[k] === "object" && !Array.isArray(config[k]));
    return found ? [found, config[found]] : ["?", null];
  }
  function limitsText(limits) {
    if (!limits || typeof limits !== "object") return "";
    return Object.entries(limits)
      .filter(([, v]) => v != null && typeof v !== "object")
      .map(([k, v]) => `${k}=${v}`).join(" ");
  }

  // uPlot draws its axes on the canvas, in the room it is given: a tick label wider than
  // that is cut off at the canvas' edge ("3,000" shown as ",000"). So the y axis is as wide as
  // its widest label, measured in the axis' own font, and the sides leave room for the x
  // axis' labels, which are centred on their ticks.
  const measurer = document.createElement("canvas").getContext("2d");
  // The widths, in CSS px, of each of `axis`' labels (its widest line each).
  function labelWidths(axis, values) {
    measurer.font = axis.font[0];          // uPlot's font, scaled to the device's pixels
    return (values || []).map((v) => v == null ? 0 :
      Math.max(...String(v).split("\n").map((line) => measurer.measureText(line).width)) /
      uPlot.pxRatio);
  }
  function yAxisSize(u, values, axisIdx) {
    const axis = u.axes[axisIdx];
    // Its values depend on the plot's height alone, which the size does not change: one
    // measure is final.
    return Math.ceil((axis.ticks.show ? axis.ticks.size : 0) + axis.gap +
      Math.max(0, ...labelWidths(axis, values)));
  }
  // The x axis' ticks are at least `_space` px apart: label i of n can be no nearer the
  // plot's left edge than i of those, nor its right edge than n - 1 - i. How far the worst
  // placed could reach past the edge on `side` (1 right, 3 left).
  function xOverhang(u, side) {
    const axis = u.axes[0];
    const values = axis._values;
    if (!values || !axis._space) return 0;
    return Math.max(0, ...labelWidths(axis, values).map((w, i) =>
      w / 2 - axis._space * (side === 1 ? values.length - 1 - i : i)));
  }
  // Padding right and left (top and bottom: uPlot's own), with a pixel to spare for the
  // rounding of the ticks' places; on the left the y axis' width is room already.
  const RIGHT_PAD = 25;                    // uPlot's own, with a y axis on the left only
  const yAxisWidth = (u) => u.axes[1]._show ? u.axes[1]._size : 0;
  const padding = [null, (u) => Math.ceil(Math.max(RIGHT_PAD, xOverhang(u, 1) + 1)), null,
    (u) => Math.ceil(Math.max(0, xOverhang(u, 3) + 1 - yAxisWidth(u)))];

  function chartOptions(width, labels, markerHook) {
    const colors = ["#2f855a", "#b7791f", "#c93c37", "#805ad5", "#1f6feb"];
    const opts = {
      width, height: 160, legend: { live: false }, padding,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      axes: [{}, { size: yAxisSize }],
      series: [{}].concat(labels.map((label, i) => ({
        label, stroke: colors[i % colors.length], width: 1.5, points: { show: false },
      }))),
    };
    if (markerHook) opts.hooks = { draw: [markerHook] };
    return opts;
  }

  function policyCard(name) {
    const card = el("article", { class: "card", "data-policy": name });
    card.append(el("h3", { text: name }), el("div", { class: "meta" }), el("div", { class: "now" }));
    const chart = el("div", { class: "chart", role: "img",
      "aria-label": `Rates of policy ${name} over time` });
    card.append(chart);
    $("policy-cards").append(card);
    const data = [[], [], [], [], [], []];
    series.set(name, data);
    const labels = ["admitted/s", "waited/s", "rejected/s", "would throttle/s", "waiting"];
    const u = new uPlot(chartOptions(Math.max(chart.clientWidth, MIN_CHART), labels), data, chart);
    charts.set(name, u);
    new ResizeObserver(() => u.setSize({ width: Math.max(chart.clientWidth, MIN_CHART), height: 160 }))
      .observe(chart);
    return card;
  }

  function renderPolicies(stats) {
    const cards = $("policy-cards");
    const seen = new Set();
    const dt = prevStats ? (stats.at_ms - prevStats.at_ms) / 1000 : 0;
    const before = new Map((prevStats?.policies || []).map((p) => [p.policy, p]));
    const t = stats.at_ms / 1000;
    for (const p of stats.policies) {
      seen.add(p.policy);
      const card = cards.querySelector(`[data-policy="${CSS.escape(p.policy)}"]`) || policyCard(p.policy);
      const config = policies.get(p.policy)?.config || {};
      const [limiter, limits] = limiterOf(config);
      const mode = config.mode || "enforce";
      const meta = card.querySelector(".meta");
      meta.replaceChildren(
        el("span", { class: `badge ${mode}`, text: mode }), " ",
        `${limiter} ${limitsText(limits)}`,
        config.kinds?.length ? ` · kinds: ${config.kinds.join(", ")}` : "",
        config.on_exhausted ? ` · on exhausted: ${config.on_exhausted}` : "");
      const prev = before.get(p.policy);
      const rate = (field) => prev && dt > 0 ? Math.max(0, (p[field] - prev[field]) / dt) : null;
      const rates = [rate("admitted"), rate("throttled"), rate("rejected"), rate("would_throttle")];
      card.querySelector(".now").replaceChildren(
        el("span", { text: `admitted ${fmt(rates[0])}/s` }),
        el("span", { text: `waited ${fmt(rates[1])}/s` }),
        el("span", { text: `rejected ${fmt(rates[2])}/s` }),
        el("span", { text: `would throttle ${fmt(rates[3])}/s` }),
        el("span", { text: `waiting ${p.waiters}` }),
        el("span", { text: `in flight ${p.in_flight}` }),
        el("span", { text: `keys ${p.keys}` }));
      if (rates[0] != null) {
        const data = series.get(p.policy);
        [t, ...rates, p.waiters].forEach((v, i) => {
          data[i].push(v);
          if (data[i].length > POINTS) data[i].shift();
        });
        charts.get(p.policy).setData(data);
      }
    }
    for (const card of [...cards.children]) {
      const name = card.dataset.policy;
      if (!seen.has(name)) {
        charts.get(name)?.destroy();
        charts.delete(name);
        series.delete(name);
        card.remove();
      }
    }
    prevStats = stats;
  }

  // --- who is throttled -----------------------------------------------------------------
  function renderThrottles() {
    const rows = throttleRows.slice();
    const { column, descending } = sort;
    rows.sort((a, b) => {
      let x = a[column], y = b[column];
      if (column === "qps_limit") { x = x ?? Infinity; y = y ?? Infinity; }
      if (column === "throttled_qps") { x = x ?? 0; y = y ?? 0; }
      const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
      return descending ? -order : order;
    });
    const body = $("throttle-table").tBodies[0];
    body.replaceChildren(...rows.map((r) => {
      // A concurrency policy's limit is a count of requests in flight, not a rate.
      const used = isConcurrency(r.policy) ? r.in_flight : r.current_qps;
      const ratio = r.qps_limit ? used / r.qps_limit : null;
      const bar = ratio == null ? "" : meter(
        isConcurrency(r.policy) ? `in flight of ${r.key} against its limit`
          : `rate of ${r.key} against its limit`, used, r.qps_limit);
      return el("tr", { "data-key": r.key, "data-policy": r.policy }, [
        el("td", { text: r.node_id }), el("td", { text: r.policy }),
        el("td", { class: "key", text: r.key }), el("td", { text: r.kind }),
        el("td", { class: "num qps", "data-value": String(r.current_qps), text: fmt(r.current_qps) }),
        el("td", { class: "num held", "data-value": String(r.throttled_qps), text: fmt(r.throttled_qps) }),
        el("td", { class: "num limit", "data-value": String(r.qps_limit), text: fmt(r.qps_limit) }),
        el("td", {}, [bar, ratio == null ? "" : ` ${fmt(ratio * 100, 0)}%`]),
        el("td", { class: "num", text: String(r.in_flight) }),
        el("td", { class: "num", text: String(r.waiters) }),
      ]);
    }));
    $("throttle-empty").hidden = rows.length > 0;
    for (const th of $("throttle-table").tHead.querySelectorAll("th")) {
      const b = th.querySelector("button");
      if (b && b.dataset.sort === column) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    }
  }

  function renderAdaptive(stats) {
    const box = $("adaptive");
    const adaptive = stats.policies.filter((p) => p.adaptive);
    if (!adaptive.length) {
      box.replaceChildren(el("p", { class: "muted", text: "No adaptive policy." }));
      return;
    }
    box.replaceChildren(...adaptive.map((p) => {
      const a = p.adaptive;
      const ago = a.last_busy_ms == null ? "never" :
        `${fmt(Math.max(0, (stats.at_ms - a.last_busy_ms) / 1000), 0)} s ago`;
      const limited = throttleRows.filter((r) => r.policy === p.policy);
      const perKind = Object.entries(a.throttled_keys).map(([k, n]) => `${k}: ${n}`).join(", ");
      return el("article", { class: "card", "data-adaptive": p.policy }, [
        el("h3", { text: p.policy }),
        el("div", { class: "now" }, [
          el("span", { text: `step ${a.level}` }),
          el("span", { text: `last busy signal ${ago}` }),
          el("span", { text: `busy signals ${a.busy_signals}` }),
          el("span", { text: `tightened ${a.upgrades} · relaxed ${a.downgrades}` }),
          a.capacity == null ? "" : el("span", { text: `capacity ≈ ${fmt(a.capacity)}/s` }),
        ]),
        el("div", { class: "meta", text: perKind ? `limited keys per kind: ${perKind}` : "no key limited" }),
        el("ul", {}, limited.map((r) =>
          el("li", { text: `${r.key} (${r.kind}): limit ${fmt(r.qps_limit)}/s, seen ${fmt(r.current_qps)}/s` }))),
      ]);
    }));
  }

  // --- leases ---------------------------------------------------------------------------
  function renderLeases(stats) {
    const rows = stats.policies.filter((p) => isConcurrency(p.policy));
    $("lease-table").tBodies[0].replaceChildren(...rows.map((p) => {
      const c = policies.get(p.policy).config.concurrency;
      // Limits are per key: the bar is the busiest key held back now (from who is
      // throttled), against its limit on this node; none held back, no bar.
      const busiest = throttleRows.filter((r) => r.policy === p.policy)
        .sort((a, b) => b.in_flight - a.in_flight)[0];
      const bar = busiest ?
        [meter(`in flight of ${p.policy}'s busiest key against its limit`,
          busiest.in_flight, busiest.qps_limit), ` ${busiest.key}`] :
        ["no key at its limit"];
      return el("tr", { "data-policy": p.policy }, [
        el("td", { text: p.policy }), el("td", { class: "num", text: String(p.in_flight) }),
        el("td", { class: "num", text: fmt(c.node_limit) }),
        el("td", { class: "num", text: c.shared_limit ? fmt(c.shared_limit) : "–" }),
        el("td", {}, bar),
        el("td", { class: "num", text: String(p.leases_node) }),
        el("td", { class: "num", text: String(p.leases_shared) }),
      ]);
    }));
    const l = stats.leases;
    $("lease-totals").textContent = rows.length ?
      `${l.active} leases held · ${l.released} released · ${l.expired} expired unreleased. ` +
      "node_limit and shared_limit are per key: in flight is the policy's total over all keys." :
      "No concurrency policy.";
  }

  // --- cluster --------------------------------------------------------------------------
  function drawMarkers(u) {
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#c93c37";
    ctx.setLineDash([4, 4]);
    for (const m of markers) {
      const x = Math.round(u.valToPos(m.t, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  }

  // A member's state as the table shows it: how long one not alive has gone unseen, and
  // whether it lacks a vote in the policy log (a member still joining, or one removed).
  function memberState(m, view) {
    let text = m.state;
    if (m.unseen_for_ms != null) text += ` for ${fmt(m.unseen_for_ms / 1000, 0)} s`;
    if (m.state === "alive" && !m.owner) text += " (not an owner)";
    if (view.policy_log && !m.votes) text += " (no vote)";
    return text;
  }

  // What differs between this node's policies and member `id`'s, policy by policy.
  function driftOf(view, id) {
    const named = (view.config_drift ?? []).filter((d) => d.member === id)
      .map((d) => `${d.policy} (${d.how})`);
    return named.length ? `: ${named.join("; ")}` : "";
  }

  function renderCluster(view, stats) {
    clusterMode = view.mode;
    $("cluster-mode").textContent = `${view.mode} · ${view.ring.members} ring owner(s), ` +
      `${view.ring.vnodes} points each · ring generation ${stats.ring.generation}`;
    // A member whose policies are not this node's: its config file or rules differ, or it has
    // not applied a change of the cluster's yet.
    const differs = new Set(view.config_differs ?? []);
    $("member-table").tBodies[0].replaceChildren(...view.members.map((m) => {
      const share = stats.ring.shares[m.id];
      const version = m.config_version ?? "–";
      return el("tr", { "data-member": m.id, "data-config-differs": String(differs.has(m.id)) }, [
        el("td", { text: m.id + (m.id === stats.node_id ? " (this node)" : "") }),
        el("td", { text: m.grpc || "–" }), el("td", { text: memberState(m, view) }),
        el("td", { class: "num", text: share == null ? "–" : `${fmt(share * 100)}%` }),
        el("td", { class: "num", text: String(view.lent[m.id] ?? 0) }),
        el("td", { text: differs.has(m.id) ? `${version} — differs from this node's${driftOf(view, m.id)}` : version }),
      ]);
    }));
    const c = view.counters;
    const named = [
      ["shared pool admissions", c.shared], ["fail-open admissions", c.fail_open],
      ["fail-closed (unavailable)", c.unavailable], ["local share admissions", c.local_share],
      ["admitted from a loan", c.from_loan], ["units borrowed", c.borrowed],
      ["refused while lent", c.refused_while_lent], ["leases handed off", c.handed_off],
      ["buckets owned", c.buckets_owned], ["rate decisions forwarded", c.forwarded],
      ["forwards failed", c.forward_failed], ["decided for others", c.decided_for_others],
    ];
    $("cluster-counters").replaceChildren(...named.map(([k, v]) =>
      el("div", {}, [el("dt", { text: k }), el("dd", { class: "num", text: fmt(v, 0) })])));

    const t = stats.at_ms / 1000;
    // The members that answer: one suspect or gone is in the table, not in the count.
    const live = view.members.filter((m) => m.state === "alive" || m.state === "leaving");
    const ids = live.map((m) => m.id).sort().join(",");
    if ((lastMembers != null && ids !== lastMembers) ||
        (lastGeneration != null && stats.ring.generation !== lastGeneration)) {
      const text = `${new Date(stats.at_ms).toLocaleTimeString()}: members now ${live.length} (${ids})`;
      markers.push({ t, text });
      if (markers.length > 20) markers.shift();
      $("membership-changes").replaceChildren(...markers.map((m) => el("li", { text: m.text })));
    }
    lastMembers = ids;
    lastGeneration = stats.ring.generation;
    const dt = prevCluster ? t - prevCluster.t : 0;
    const rate = (f) => prevCluster && dt > 0 ? Math.max(0, (c[f] - prevCluster.counters[f]) / dt) : null;
    [t, live.length, rate("fail_open"), rate("unavailable")].forEach((v, i) => {
      clusterSeries[i].push(v);
      if (clusterSeries[i].length > POINTS) clusterSeries[i].shift();
    });
    prevCluster = { t, counters: c };
    if (!clusterChart) {
      const box = $("cluster-chart");
      clusterChart = new uPlot(chartOptions(Math.max(box.clientWidth, 280),
        ["members", "fail-open/s", "fail-closed/s"], drawMarkers), clusterSeries, box);
      new ResizeObserver(() => clusterChart.setSize({ width: Math.max(box.clientWidth, 280), height: 160 }))
        .observe(box);
      ui.clusterChart = clusterChart;
    } else {
      clusterChart.setData(clusterSeries);
    }
  }

  // --- the policy editor ----------------------------------------------------------------
  function fillPolicySelects() {
    const names = [...policies.keys()].sort();
    for (const [id, first] of [["throttle-policy", "all policies"], ["edit-policy", null]]) {
      const select = $(id);
      const current = select.value;
      const options = (first == null ? [] : [el("option", { value: "", text: first })])
        .concat(names.map((n) => el("option", { value: n, text: n })));
      const before = [...select.options].map((o) => o.value).join("\n");
      if (before !== options.map((o) => o.value).join("\n")) {
        select.replaceChildren(...options);
        if (names.includes(current) || current === "") select.value = current;
      }
    }
  }

  function showEdit(text, kind) {
    const out = $("edit-result");
    out.textContent = text;
    out.className = kind;
  }

  async function loadPolicy() {
    const name = $("edit-policy").value;
    if (!name) return;
    try {
      const { body, etag, source } = await getJson(`/v1/policies/${encodeURIComponent(name)}`);
      editing = { name, etag };
      $("edit-text").value = JSON.stringify(body, null, 2);
      // Where it comes from: a change saved here stands in place of the config file's.
      const from = source === "api; overrides=file"
        ? "changed over the API in place of the config file's (weir config revert brings the file's back)"
        : `from ${source ?? "?"}`;
      $("edit-etag").textContent = `ETag ${etag} · ${from}`;
      showEdit(`Loaded ${name}.`, "");
    } catch (e) {
      showEdit(`Could not load ${name}: ${e.message}`, "error");
    }
  }

  async function savePolicy() {
    if (writesNeedToken === false) {
      showEdit("Read-only: this server has no admin token, so the page does not edit " +
        "policies (set one to edit them here).", "error");
      return;
    }
    if (!token) {
      showEdit("Refused: editing needs the admin token; enter it above.", "error");
      return;
    }
    if (!editing.name) { showEdit("Load a policy first.", "error"); return; }
    let body;
    try { body = JSON.parse($("edit-text").value); } catch (e) {
      showEdit(`Not JSON: ${e.message}`, "error");
      return;
    }
    const headers = { "Content-Type": "application/json", "If-Match": editing.etag,
      Authorization: `Bearer ${token}` };
    let response, answer;
    try {
      response = await fetch(`/v1/policies/${encodeURIComponent(editing.name)}`,
        { method: "PUT", headers, body: JSON.stringify(body), cache: "no-store" });
      answer = await response.json().catch(() => ({}));
    } catch (e) {
      showEdit(`The server did not answer: ${e.message}`, "error");
      return;
    }
    const detail = answer.detail ? ` (${answer.detail})` : "";
    if (response.ok) {
      editing.etag = response.headers.get("ETag");
      $("edit-etag").textContent = `ETag ${editing.etag}`;
      showEdit(`Saved ${editing.name}: ${response.status}.`, "ok");
      ticks = 0; // read the configs again at the next tick
    } else if (response.status === 412) {
      showEdit(`Conflict (412): ${editing.name} was changed or removed by someone else since ` +
        `it was loaded; this edit was not applied and your text is kept. Load it again to ` +
        `see theirs.${detail}`, "error");
    } else if (response.status === 401) {
      showEdit(`Refused (401): editing needs the admin token; enter it above.${detail}`, "error");
    } else if (response.status === 403) {
      showEdit(`Refused (403): that is not the admin token.${detail}`, "error");
    } else {
      showEdit(`Refused (${response.status}): ${answer.error || ""}${detail}`, "error");
    }
  }

  // --- the loop -------------------------------------------------------------------------
  async function refresh() {
    if (ticks % POLICIES_EVERY === 0 || policies.size === 0) {
      const { body } = await getJson("/v1/policies");
      policies = new Map(body.policies.map((p) => [p.policy.name, { config: p.policy, etag: p.etag }]));
      fillPolicySelects();
    }
    ticks += 1;
    const filter = $("throttle-policy").value;
    const query = new URLSearchParams({ limit: "100" });
    if (filter) query.set("policy", filter);
    if (clusterMode === "cluster") query.set("scope", "cluster");
    const [stats, throttles, cluster] = await Promise.all([
      getJson("/v1/stats"), getJson(`/v1/throttles?${query}`), getJson("/v1/cluster"),
    ]);
    $("node").textContent = `· ${stats.body.node_id}`;
    if (writesNeedToken !== stats.body.writes_need_token) {
      writesNeedToken = stats.body.writes_need_token;
      $("edit-save").disabled = !writesNeedToken;
      $("edit-mode").textContent = writesNeedToken ? "" :
        "Read-only: this server has no admin token, so the page does not edit policies.";
    }
    throttleRows = throttles.body.rows;
    ui.throttleRows = throttleRows;
    ui.throttleFetchedAt = Date.now();
    renderPolicies(await policyStats(stats.body));
    renderThrottles();
    renderAdaptive(stats.body);
    renderLeases(stats.body);
    renderCluster(cluster.body, stats.body);
  }

  // The numbers the policy cards show: in a cluster, by default, every member's summed
  // (`/v1/stats?scope=cluster`); this node's otherwise, or when asked for. A change of scope
  // starts the charts afresh: rates across it would mix two sources.
  async function policyStats(nodeStats) {
    const inCluster = clusterMode === "cluster";
    $("stats-scope-control").hidden = !inCluster;
    const scope = inCluster ? $("stats-scope").value : "node";
    let shown = nodeStats;
    if (scope === "cluster") {
      const { body } = await getJson("/v1/stats?scope=cluster");
      const notes = [`totals over ${body.members.length} member(s)`];
      if (body.unanswered.length) notes.push(`not answering: ${body.unanswered.join(", ")}`);
      if (body.config_differs.length) notes.push(`policies differ on: ${body.config_differs.join(", ")}`);
      $("stats-members").textContent = notes.join(" · ");
      shown = { at_ms: Math.max(...body.members.map((m) => m.at_ms)), policies: body.totals };
    } else {
      $("stats-members").textContent = inCluster ? `${nodeStats.node_id} alone` : "";
    }
    if (scope !== shownScope) {
      shownScope = scope;
      prevStats = null;
      for (const data of series.values()) data.forEach((column) => { column.length = 0; });
    }
    return shown;
  }

  // The live region speaks only when the state changes, not at every reading.
  function setStatus(text, kind) {
    const status = $("status");
    if (status.textContent !== text) status.textContent = text;
    status.className = kind;
  }

  async function loop() {
    const started = performance.now();
    if (!document.hidden) {
      try {
        await refresh();
        ui.generation += 1;
        $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
        setStatus("", "muted");
      } catch (e) {
        setStatus(`cannot reach the server: ${e.message}`, "error");
      }
    }
    setTimeout(loop, Math.max(100, PERIOD_MS - (performance.now() - started)));
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    token = value || null;
    $("token").value = "";
    $("token-state").textContent = token ? "token set (kept in this page only)" : "read-only";
  });
  $("token-forget").addEventListener("click", () => {
    token = null;
    $("token").value = "";
    $("token-state").textContent = "read-only";
  });
  for (const b of document.querySelectorAll("#throttle-table th button")) {
    b.addEventListener("click", () => {
      const column = b.dataset.sort;
      sort = { column, descending: sort.column === column ? !sort.descending :
        ["current_qps", "throttled_qps", "qps_limit", "in_flight", "waiters"].includes(column) };
      renderThrottles();
    });
  }
  $("edit-load").addEventListener("click", loadPolicy);
  $("edit-save").addEventListener("click", savePolicy);
  loop();
})();
