// linkguard topology dashboard: plain SVG + vanilla JS, no build step, no dependencies.
//
// Consumes (paths relative to this page, the topology service's HTTP API v1):
//   api/v1/fabric           spines, leaves (rail, SU), hosts with their HCAs
//   api/v1/ports?...        per-port state with "shown" (fabrics <= 256 hosts; a drilled SU)
//   api/v1/summary          per SU x rail counts (fabrics > 256 hosts)
//   api/v1/hosts/{host}     the host view (HCAs, rail map, plan)
//   api/v1/events           the event timeline (newest first)
//   api/v1/report           the ledger's report numbers (503: no ledger)
//   api/v1/stream           server-sent events: "port" recolours a link in place, "resync"
//                           reloads, port_event / host / plans / health / audit go to the timeline;
//                           a health "probe_verdict" on a port marks (clears) it probe-drained
// Produces: the page. Elements tests and tools can find:
//   line.link  id "link-<host>-<hca>-<port>"  data-host data-hca data-port data-rail data-su data-shown
//                                             data-drained="probe" (a probe verdict drains it)
//   rect.port  id "port-<host>-<hca>-<port>"  (the host end of the same link, same data-*)
//   rect.leaf  id "leaf-<leaf>"               data-leaf data-rail data-su data-shown (worst link)
//   rect.cell  id "cell-su<su>-r<rail>"       data-su data-rail data-leaf data-shown (worst)
//                                             data-up data-hosts ... data-drained-probe (count),
//                                             data-drained="probe" when any (aggregate view)
//   #not-acking  data-count data-hosts (space-separated): online hosts past their ack deadline
//                (api/v1/summary "not_acking", polled every NOT_ACKING_POLL_MS); g.host of such a
//                host gets class "not-acking"; the host view's #host-not-acking says since when
//   body data-mode ("detail" | "aggregate"), data-rendered (ms from navigation start to the
//   first complete fabric picture), data-renders (pictures drawn), data-stream (open | error)
// Every text from the API goes through textContent / setAttribute: never innerHTML.
"use strict";

(() => {
  const API = "api/v1/";
  const SVGNS = "http://www.w3.org/2000/svg";
  const SHOWN = ["up", "down", "held_down", "suppressed", "degraded", "unknown"];
  const LABEL = {
    up: "up", down: "down", held_down: "held down", suppressed: "suppressed",
    degraded: "degraded", unknown: "unknown",
  };
  // "worst colour" order of a leaf or an aggregate cell
  const SEVERITY = { up: 0, unknown: 1, degraded: 2, held_down: 3, suppressed: 4, down: 5 };
  const DETAIL_MAX_HOSTS = 256; // above: one cell per leaf (SU x rail), drill down on click
  const PAGE = 1000; // ports per api/v1/ports request
  const TIMELINE_MAX = 300;
  const TIMELINE_KINDS = ["port_event", "host", "plans", "health", "audit"];
  const MIN_ROW_W = 480; // px: SU blocks wrap into rows as wide as the panel, at least this
  const NOT_ACKING_POLL_MS = 2000; // how often the hosts that do not ack are looked up

  const S = {
    fabric: null,
    mode: null,
    rails: [],
    hostsBySu: new Map(), // su -> [host objects from api/v1/fabric]
    hostInfo: new Map(), // host -> {host, su, hcas}
    ports: new Map(), // "host/hca/port" -> {host, hca, port, rail, leaf, su, rate}
    shown: new Map(), // "host/hca/port" -> shown (ports whose state this page knows)
    leafCounts: new Map(), // leaf -> {shown: n}  (detail mode and drilled SU)
    totals: null, // shown -> n, for the legend
    railRate: new Map(), // rail -> highest rate_gbps seen on an "up" port (degraded test)
    summary: null,
    drillSu: null,
    selectedHost: null,
    loaded: false,
    pending: [],
    renders: 0,
    offline: new Set(),
    probeDrained: new Set(), // "host/hca/port" of ports a probe verdict drains (drained_by "probe")
    notAcking: new Set(), // hosts past their ack deadline (api/v1/summary not_acking)
  };

  // ---------- small DOM helpers (text only through textContent) ----------
  const $ = (id) => document.getElementById(id);
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) e.setAttribute(k, String(v));
    for (const c of children) {
      if (c == null) continue;
      e.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
    }
    return e;
  }
  function s(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) e.setAttribute(k, String(v));
    if (text != null) e.textContent = String(text);
    return e;
  }
  function title(elem, text) {
    elem.append(s("title", null, text));
    return elem;
  }
  const portKey = (host, hca, port) => `${host}/${hca}/${port}`;
  const linkId = (host, hca, port) => `link-${host}-${hca}-${port}`;
  const portElId = (host, hca, port) => `port-${host}-${hca}-${port}`;
  const cellId = (su, rail) => `cell-su${su}-r${rail}`;
  const fmtTime = (t) => {
    if (typeof t !== "number" || !Number.isFinite(t)) return "";
    const d = new Date(t * 1000);
    return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  };
  const fmtNum = (v) => {
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    return v.toLocaleString("en-US", { maximumFractionDigits: 3 });
  };

  async function getJSON(path) {
    const r = await fetch(API + path, { headers: { accept: "application/json" } });
    if (!r.ok) {
      let detail = "";
      try {
        const body = await r.json();
        detail = typeof body.detail === "string" ? body.detail : "";
      } catch (_) { /* not JSON */ }
      const err = new Error(`${path}: HTTP ${r.status}${detail ? " " + detail : ""}`);
      err.status = r.status;
      throw err;
    }
    return r.json();
  }

  async function fetchPorts(query) {
    const q = query ? query + "&" : "";
    const first = await getJSON(`ports?${q}limit=${PAGE}&offset=0`);
    let ports = first.ports || [];
    const rest = [];
    for (let off = PAGE; off < (first.total || 0); off += PAGE) {
      rest.push(getJSON(`ports?${q}limit=${PAGE}&offset=${off}`));
    }
    for (const page of await Promise.all(rest)) ports = ports.concat(page.ports || []);
    return ports;
  }

  // ---------- state ----------
  // What the dashboard shows of a PortState (api_spec: "shown"): the server's when it sent one.
  function shownOf(st) {
    if (!st) return "unknown";
    if (typeof st.shown === "string" && st.shown in SEVERITY) return st.shown;
    const status = st.status;
    if (status === "down") return "down";
    if (status === "held_down") return "held_down";
    if (status === "suppressed" || (st.damping && st.damping.suppressed)) return "suppressed";
    if (status === "degraded") return "degraded";
    if (status === "up") {
      const info = S.ports.get(portKey(st.host, st.hca, st.port));
      const linkRate = (info && info.rate) || S.railRate.get(st.rail);
      if (st.usable !== false && linkRate && typeof st.rate_gbps === "number" && st.rate_gbps < linkRate) {
        return "degraded";
      }
      return "up";
    }
    return "unknown";
  }

  function learnRate(st, shown) {
    if (shown === "up" && typeof st.rate_gbps === "number" && st.rate_gbps > 0) {
      if (!(st.rate_gbps <= (S.railRate.get(st.rail) || 0))) S.railRate.set(st.rail, st.rate_gbps);
    }
  }

  function worstOf(counts) {
    let worst = null;
    for (const k of SHOWN) {
      if ((counts[k] || 0) > 0 && (worst === null || SEVERITY[k] > SEVERITY[worst])) worst = k;
    }
    return worst || "unknown";
  }

  function emptyCounts() {
    const c = {};
    for (const k of SHOWN) c[k] = 0;
    return c;
  }

  // Set one port's shown state: counts, the link and port elements, its leaf, the host view.
  function setShown(key, shown) {
    const info = S.ports.get(key);
    const prev = S.shown.get(key) || "unknown";
    S.shown.set(key, shown);
    if (!info) return;
    if (prev !== shown) {
      const lc = S.leafCounts.get(info.leaf);
      if (lc) {
        lc[prev] = Math.max(0, (lc[prev] || 0) - 1);
        lc[shown] = (lc[shown] || 0) + 1;
        const leafEl = $("leaf-" + info.leaf);
        if (leafEl) leafEl.setAttribute("data-shown", worstOf(lc));
      }
      if (S.mode === "detail" && S.totals) {
        S.totals[prev] = Math.max(0, S.totals[prev] - 1);
        S.totals[shown] += 1;
        scheduleLegend();
      }
    }
    const line = $(linkId(info.host, info.hca, info.port));
    if (line) line.setAttribute("data-shown", shown);
    const cell = $(portElId(info.host, info.hca, info.port));
    if (cell) cell.setAttribute("data-shown", shown);
  }

  // Mark (or clear) one port as drained by a probe verdict: its link and port elements.
  function setProbeDrained(key, drained) {
    if (drained) S.probeDrained.add(key);
    else S.probeDrained.delete(key);
    const info = S.ports.get(key);
    if (!info) return;
    for (const id of [linkId(info.host, info.hca, info.port), portElId(info.host, info.hca, info.port)]) {
      const e = $(id);
      if (!e) continue;
      if (drained) e.setAttribute("data-drained", "probe");
      else e.removeAttribute("data-drained");
    }
    if (S.mode === "detail") scheduleLegend();
  }

  // The port of ``host`` on ``rail`` ("host/hca/port"; null: not in the fabric).
  function portOnRail(host, rail) {
    const info = S.hostInfo.get(host);
    const hca = info && (info.hcas || []).find((x) => x.rail === rail);
    return hca ? portKey(host, hca.hca, hca.port) : null;
  }

  // ---------- legend ----------
  let legendTimer = null;
  function scheduleLegend() {
    if (legendTimer === null) legendTimer = setTimeout(() => { legendTimer = null; drawLegendCounts(); }, 100);
  }
  function drawLegend() {
    const ul = $("legend");
    ul.replaceChildren();
    for (const k of SHOWN) {
      ul.append(h("li", { "data-shown": k },
        h("span", { class: "swatch" }),
        h("span", null, LABEL[k]),
        h("span", { class: "count", id: "count-" + k })));
    }
    ul.append(h("li", { "data-drained": "probe" },
      h("span", { class: "swatch" }),
      h("span", null, "drained by probes"),
      h("span", { class: "count", id: "count-probe-drained" })));
  }
  function drawLegendCounts() {
    if (!S.totals) return;
    for (const k of SHOWN) {
      const e = $("count-" + k);
      if (e) e.textContent = fmtNum(S.totals[k] || 0);
    }
    const drained = S.mode === "aggregate" && S.summary
      ? ((S.summary.drained || {}).probe || 0) : S.probeDrained.size;
    $("count-probe-drained").textContent = fmtNum(drained);
  }

  // ---------- layout ----------
  // Place blocks ({g, w, h}) in rows as wide as the svg's container; size the svg to them,
  // scaled up to ``maxScale`` to fill the container's width.
  function layoutBlocks(svg, blocks, maxScale) {
    const gap = 10;
    const rowW = Math.max(MIN_ROW_W, (svg.parentElement ? svg.parentElement.clientWidth : 0) - 12);
    let x = 0, y = 0, rowH = 0, width = 0;
    for (const b of blocks) {
      if (x > 0 && x + b.w > rowW) { x = 0; y += rowH + gap; rowH = 0; }
      b.g.setAttribute("transform", `translate(${x},${y})`);
      x += b.w + gap;
      rowH = Math.max(rowH, b.h);
      width = Math.max(width, x - gap);
    }
    const height = y + rowH;
    const frag = document.createDocumentFragment();
    for (const b of blocks) frag.append(b.g);
    svg.replaceChildren(frag);
    const scale = Math.max(1, Math.min(maxScale, rowW / (width + 8)));
    svg.setAttribute("viewBox", `-4 -4 ${width + 8} ${height + 8}`);
    svg.setAttribute("width", String(Math.round((width + 8) * scale)));
    svg.setAttribute("height", String(Math.round((height + 8) * scale)));
  }

  function spreadX(i, n, x0, w) {
    return x0 + (i + 0.5) * (w / Math.max(n, 1));
  }

  // One SU with every host's port links: spines on top, the SU's leaves (one per rail), links,
  // hosts (one column each, a cell per port).
  function detailBlock(su, hosts, leaves, spines) {
    const R = Math.max(S.rails.length, 1);
    const n = Math.max(hosts.length, 1);
    const hostW = Math.max(8, Math.min(48, Math.floor(256 / n)));
    const cellH = R <= 8 ? 5 : Math.max(2, Math.floor(40 / R));
    const pad = 6;
    const innerW = Math.max(n * hostW, R * 26);
    const hostsX0 = pad + (innerW - n * hostW) / 2;
    const yLabel = 10, ySpine = 18, yLeaf = 48, leafH = 12, yHost = 128;
    const stackH = R * cellH;
    const labels = hostW >= 12;
    const blockH = yHost + stackH + (labels ? 44 : 6);
    const g = s("g", { class: "su", "data-su": su });
    g.append(s("text", { x: pad, y: yLabel, class: "su-label" }, `SU ${su} · ${hosts.length} hosts`));

    const leafX = new Map();
    const leafW = Math.min(24, innerW / R - 4);
    const byRail = new Map(leaves.map((l) => [l.rail, l]));
    const spineW = 7;
    const spX = spines.map((_, i) => spreadX(i, spines.length, pad, innerW));
    let up = "";
    S.rails.forEach((rail, ri) => {
      const x = spreadX(ri, R, pad, innerW);
      leafX.set(rail, x);
      if (byRail.has(rail)) for (const sx of spX) up += `M${x.toFixed(1)} ${yLeaf}L${sx.toFixed(1)} ${ySpine + spineW}`;
    });
    if (up) g.append(s("path", { class: "uplinks", d: up }));
    spines.forEach((sp, i) => {
      g.append(title(s("rect", {
        class: "spine", x: (spX[i] - spineW / 2).toFixed(1), y: ySpine, width: spineW, height: spineW,
        "data-spine": sp.name,
      }), `spine ${sp.name}`));
    });

    const links = document.createDocumentFragment();
    const cols = document.createDocumentFragment();
    hosts.forEach((host, hi) => {
      const hx = hostsX0 + hi * hostW;
      const hg = s("g", { class: S.notAcking.has(host.host) ? "host not-acking" : "host", "data-host": host.host });
      if (S.offline.has(host.host)) hg.classList.add("offline");
      if (S.selectedHost === host.host) hg.classList.add("selected");
      for (const hca of host.hcas) {
        const ri = Math.max(0, S.rails.indexOf(hca.rail));
        const key = portKey(host.host, hca.hca, hca.port);
        const shown = S.shown.get(key) || "unknown";
        const data = {
          "data-host": host.host, "data-hca": hca.hca, "data-port": hca.port,
          "data-rail": hca.rail, "data-su": su, "data-shown": shown,
          "data-drained": S.probeDrained.has(key) ? "probe" : null,
        };
        const lx = leafX.get(hca.rail);
        if (lx !== undefined) {
          links.append(s("line", {
            class: "link", id: linkId(host.host, hca.hca, hca.port), ...data,
            x1: lx.toFixed(1), y1: yLeaf + leafH, x2: (hx + (ri + 0.5) * (hostW / R)).toFixed(1), y2: yHost - 2,
          }));
        }
        hg.append(title(s("rect", {
          class: "port", id: portElId(host.host, hca.hca, hca.port), ...data,
          x: hx + 1, y: yHost + ri * cellH, width: hostW - 2, height: cellH - 1,
        }), `${host.host} ${hca.hca}/${hca.port} rail ${hca.rail} → ${hca.leaf || "?"}`));
      }
      if (labels) {
        const tx = hx + hostW / 2, ty = yHost + stackH + 4;
        hg.append(s("text", {
          class: "host-label", x: tx, y: ty, transform: `rotate(60 ${tx} ${ty})`,
        }, host.host));
      }
      cols.append(hg);
    });
    g.append(links);
    for (const rail of S.rails) {
      const leaf = byRail.get(rail);
      if (!leaf) continue;
      const x = leafX.get(rail);
      const lc = S.leafCounts.get(leaf.name);
      g.append(title(s("rect", {
        class: "leaf", id: "leaf-" + leaf.name, x: (x - leafW / 2).toFixed(1), y: yLeaf,
        width: leafW.toFixed(1), height: leafH, rx: 2,
        "data-leaf": leaf.name, "data-rail": rail, "data-su": su,
        "data-shown": lc ? worstOf(lc) : "unknown",
      }), `leaf ${leaf.name} (rail ${rail}, SU ${su})`));
      if (leafW >= 14) g.append(s("text", { x: x, y: yLeaf + 9, class: "cell-label" }, `r${rail}`));
    }
    g.append(cols);
    return { g, w: innerW + 2 * pad, h: blockH };
  }

  // One SU of a big fabric: its spines, one cell per leaf (rail) with counts and the worst
  // colour, a host bar; a click drills down into the SU.
  function aggregateBlock(su, cells, spines, hostsCount) {
    const R = Math.max(S.rails.length, 1);
    const cellW = 28, cellH = 24, pad = 4;
    const innerW = R * cellW;
    const ySpine = 16, yCell = 36, yBar = yCell + cellH + 6, barH = 14;
    const g = s("g", { class: "su", "data-su": su });
    if (S.drillSu === su) g.classList.add("selected");
    g.append(s("text", { x: pad, y: 10, class: "su-label" }, `SU ${su}`));
    const spW = Math.min(6, Math.max(2, innerW / Math.max(spines.length, 1) - 1));
    const spX = spines.map((_, i) => spreadX(i, spines.length, pad, innerW));
    let up = "";
    const byRail = new Map(cells.map((c) => [c.rail, c]));
    S.rails.forEach((rail, ri) => {
      const x = spreadX(ri, R, pad, innerW);
      if (byRail.has(rail) && spines.length <= 16) for (const sx of spX) up += `M${x.toFixed(1)} ${yCell}L${sx.toFixed(1)} ${ySpine + spW}`;
    });
    if (up) g.append(s("path", { class: "uplinks", d: up }));
    spines.forEach((sp, i) => {
      g.append(s("rect", {
        class: "spine", x: (spX[i] - spW / 2).toFixed(1), y: ySpine, width: spW.toFixed(1), height: spW.toFixed(1),
        "data-spine": sp.name,
      }));
    });
    S.rails.forEach((rail, ri) => {
      const c = byRail.get(rail);
      if (!c) return;
      const x = pad + ri * cellW;
      const counts = Object.assign(emptyCounts(), c.counts || {});
      const attrs = {
        class: "cell", id: cellId(su, rail), x: x + 1, y: yCell, width: cellW - 2, height: cellH, rx: 2,
        "data-su": su, "data-rail": rail, "data-leaf": c.leaf, "data-hosts": c.hosts,
        "data-shown": worstOf(counts),
      };
      for (const k of SHOWN) attrs["data-" + k.replace("_", "-")] = counts[k];
      const probe = probeDrainedOf(c);
      attrs["data-drained-probe"] = probe;
      if (probe) attrs["data-drained"] = "probe";
      const rect = title(s("rect", attrs), cellTitle(c, counts));
      rect.addEventListener("click", () => drill(su));
      g.append(rect);
      const bad = counts.down + counts.held_down + counts.suppressed + counts.degraded;
      g.append(s("text", { x: x + cellW / 2, y: yCell + 10, class: "cell-label", id: cellId(su, rail) + "-n" },
        bad ? `${bad}✕` : fmtNum(counts.up)));
      g.append(s("text", { x: x + cellW / 2, y: yCell + 20, class: "cell-label" }, `r${rail}`));
    });
    const bar = title(s("rect", {
      class: "hostbar", x: pad, y: yBar, width: innerW, height: barH, rx: 2, "data-su": su,
    }), `SU ${su}: ${hostsCount} hosts; click to show their links`);
    bar.addEventListener("click", () => drill(su));
    g.append(bar);
    g.append(s("text", { x: pad + innerW / 2, y: yBar + 10, class: "hostbar-label" }, `${hostsCount} hosts`));
    return { g, w: innerW + 2 * pad, h: yBar + barH + 2 };
  }

  const probeDrainedOf = (c) => (c.drained && c.drained.probe) || 0;

  function cellTitle(c, counts) {
    const parts = SHOWN.filter((k) => counts[k]).map((k) => `${LABEL[k]} ${counts[k]}`);
    if (probeDrainedOf(c)) parts.push(`drained by probes ${probeDrainedOf(c)}`);
    return `leaf ${c.leaf} (SU ${c.su}, rail ${c.rail}), ${c.hosts} hosts: ${parts.join(", ") || "no ports"}`;
  }

  function updateCell(c) {
    const rect = $(cellId(c.su, c.rail));
    if (!rect) return false;
    const counts = Object.assign(emptyCounts(), c.counts || {});
    rect.setAttribute("data-shown", worstOf(counts));
    for (const k of SHOWN) rect.setAttribute("data-" + k.replace("_", "-"), counts[k]);
    rect.setAttribute("data-drained-probe", probeDrainedOf(c));
    if (probeDrainedOf(c)) rect.setAttribute("data-drained", "probe");
    else rect.removeAttribute("data-drained");
    const t = rect.querySelector("title");
    if (t) t.textContent = cellTitle(c, counts);
    const label = $(cellId(c.su, c.rail) + "-n");
    const bad = counts.down + counts.held_down + counts.suppressed + counts.degraded;
    if (label) label.textContent = bad ? `${bad}✕` : fmtNum(counts.up);
    return true;
  }

  // ---------- the fabric picture ----------
  function indexFabric(fabric) {
    S.fabric = fabric;
    S.rails = [...(fabric.rails || [])].sort((a, b) => a - b);
    S.hostsBySu = new Map();
    S.hostInfo = new Map();
    S.ports = new Map();
    for (const host of fabric.hosts || []) {
      S.hostInfo.set(host.host, host);
      if (!S.hostsBySu.has(host.su)) S.hostsBySu.set(host.su, []);
      S.hostsBySu.get(host.su).push(host);
      for (const hca of host.hcas || []) {
        if (!S.rails.includes(hca.rail)) S.rails.push(hca.rail);
        S.ports.set(portKey(host.host, hca.hca, hca.port), {
          host: host.host, hca: hca.hca, port: hca.port, rail: hca.rail, leaf: hca.leaf, su: host.su,
          rate: typeof hca.rate_gbps === "number" ? hca.rate_gbps : null,
        });
      }
    }
    S.rails.sort((a, b) => a - b);
  }

  function sus() {
    const all = new Set([...(S.fabric.sus || []), ...S.hostsBySu.keys()]);
    return [...all].sort((a, b) => a - b);
  }
  const leavesOf = (su) => (S.fabric.leaves || []).filter((l) => l.su === su);
  function spinesOf(su) {
    const all = S.fabric.spines || [];
    const own = all.filter((sp) => sp.su === su);
    return own.length || all.length > 16 ? own : all;
  }

  // Reset the leaf counts of ``hosts`` (all unknown) and apply ``ports`` (api/v1/ports rows).
  function loadPortStates(hosts, ports) {
    for (const host of hosts) {
      for (const hca of host.hcas || []) {
        const key = portKey(host.host, hca.hca, hca.port);
        S.shown.set(key, "unknown");
        if (!S.leafCounts.has(hca.leaf)) S.leafCounts.set(hca.leaf, emptyCounts());
      }
    }
    for (const host of hosts) for (const hca of host.hcas || []) S.leafCounts.get(hca.leaf).unknown += 1;
    for (const st of ports) {
      const shown = shownOf(st);
      learnRate(st, shown);
      const key = portKey(st.host, st.hca, st.port);
      if (st.drained_by === "probe") S.probeDrained.add(key);
      else S.probeDrained.delete(key);
      const info = S.ports.get(key);
      if (!info) continue;
      const lc = S.leafCounts.get(info.leaf);
      const prev = S.shown.get(key) || "unknown";
      if (lc) { lc[prev] -= 1; lc[shown] = (lc[shown] || 0) + 1; }
      S.shown.set(key, shown);
    }
  }

  function renderDetail() {
    const blocks = sus().map((su) => detailBlock(su, S.hostsBySu.get(su) || [], leavesOf(su), spinesOf(su)));
    layoutBlocks($("fabric"), blocks, 3);
    S.totals = emptyCounts();
    for (const key of S.ports.keys()) S.totals[S.shown.get(key) || "unknown"] += 1;
    drawLegendCounts();
  }

  function renderAggregate() {
    const cellsBySu = new Map();
    for (const c of S.summary.cells || []) {
      if (!cellsBySu.has(c.su)) cellsBySu.set(c.su, []);
      cellsBySu.get(c.su).push(c);
    }
    const blocks = sus().map((su) => {
      const cells = cellsBySu.get(su) || [];
      const hosts = (S.hostsBySu.get(su) || []).length || Math.max(0, ...cells.map((c) => c.hosts || 0));
      return aggregateBlock(su, cells, spinesOf(su), hosts);
    });
    layoutBlocks($("fabric"), blocks, 1);
    totalsFromSummary();
  }

  function totalsFromSummary() {
    S.totals = emptyCounts();
    for (const c of S.summary.cells || []) for (const k of SHOWN) S.totals[k] += (c.counts || {})[k] || 0;
    drawLegendCounts();
  }

  let summaryTimer = null;
  function scheduleSummary() {
    if (summaryTimer !== null) return;
    summaryTimer = setTimeout(async () => {
      try {
        const summary = await getJSON("summary");
        S.summary = summary;
        let missing = false;
        for (const c of summary.cells || []) if (!updateCell(c)) missing = true;
        if (missing) renderAggregate();
        else totalsFromSummary();
        headerStats();
      } catch (err) {
        showError(err);
      } finally {
        summaryTimer = null;
      }
    }, 400);
  }

  async function drill(su) {
    S.drillSu = su;
    for (const g of $("fabric").querySelectorAll("g.su")) g.classList.toggle("selected", g.dataset.su === String(su));
    const hosts = S.hostsBySu.get(su) || [];
    $("drill").hidden = false;
    $("drill-title").textContent = `SU ${su}: ${hosts.length} hosts, loading…`;
    try {
      const ports = await fetchPorts(`su=${encodeURIComponent(su)}`);
      if (S.drillSu !== su) return;
      // forget the previously drilled SU's per-port state: only this SU's is kept current
      for (const [key, info] of S.ports) if (info.su !== su && S.mode === "aggregate") S.shown.delete(key);
      for (const leaf of leavesOf(su)) S.leafCounts.delete(leaf.name);
      loadPortStates(hosts, ports);
      const block = detailBlock(su, hosts, leavesOf(su), spinesOf(su));
      layoutBlocks($("drill-svg"), [block], 2);
      $("drill-title").textContent = `SU ${su}: ${hosts.length} hosts`;
      $("drill").scrollIntoView({ block: "nearest" });
    } catch (err) {
      $("drill-title").textContent = `SU ${su}: ${err.message}`;
    }
  }

  function closeDrill() {
    S.drillSu = null;
    $("drill").hidden = true;
    $("drill-svg").replaceChildren();
    for (const g of $("fabric").querySelectorAll("g.su.selected")) g.classList.remove("selected");
  }

  function headerStats() {
    const f = S.fabric;
    if (!f) return;
    $("fabric-name").textContent = `fabric ${f.name}`;
    const hosts = f.hosts_count ?? (f.hosts || []).length;
    const online = S.summary && typeof S.summary.online === "number" ? `, ${fmtNum(S.summary.online)} online` : "";
    $("fabric-stats").textContent =
      `${fmtNum(hosts)} hosts${online} · ${S.rails.length} rails · ${sus().length} SUs · ` +
      `${(f.leaves || []).length} leaves · ${(f.spines || []).length} spines`;
  }

  // online hosts that have not acked their current epoch in time (the service re-sends to them)
  function drawNotAcking(rows) {
    const el = $("not-acking");
    const hosts = rows.map((r) => r.host);
    el.dataset.count = String(rows.length);
    el.dataset.hosts = hosts.join(" ");
    el.hidden = rows.length === 0;
    const first = rows.slice(0, 5).map((r) => `${r.host} (epoch ${r.epoch}, ${Math.round(r.age_s)} s, ${r.resends} re-sends)`);
    el.textContent = rows.length
      ? `${rows.length} not acking: ${first.join(", ")}${rows.length > 5 ? ", …" : ""}`
      : "";
    const late = new Set(hosts);
    S.notAcking = late;
    for (const g of document.querySelectorAll("g.host")) g.classList.toggle("not-acking", late.has(g.dataset.host));
  }

  async function loadNotAcking() {
    try {
      const summary = await getJSON("summary");
      const rows = summary.not_acking || [];
      drawNotAcking(rows);
      const sel = S.selectedHost;
      // the host view follows: its age while late, and its line gone once it acked
      if (sel && (Boolean($("host-not-acking")) || rows.some((r) => r.host === sel))) scheduleHost(sel);
    } catch (err) {
      // the next poll tries again; the stream's status says when the service is gone
    }
  }

  function showError(err) {
    const p = $("fabric-error");
    p.hidden = false;
    p.textContent = String(err && err.message ? err.message : err);
  }

  async function loadFabric() {
    const [fabric, summary] = await Promise.all([getJSON("fabric"), getJSON("summary").catch(() => null)]);
    indexFabric(fabric);
    S.summary = summary;
    const count = fabric.hosts_count ?? (fabric.hosts || []).length;
    S.mode = count <= DETAIL_MAX_HOSTS ? "detail" : "aggregate";
    document.body.dataset.mode = S.mode;
    S.shown = new Map();
    S.leafCounts = new Map();
    S.probeDrained = new Set();
    if (S.mode === "detail") {
      loadPortStates(fabric.hosts || [], await fetchPorts(""));
      renderDetail();
      $("fabric-hint").textContent = "Every host's port links. Click a host or a link for its view.";
    } else {
      if (!S.summary) S.summary = await getJSON("summary");
      renderAggregate();
      $("fabric-hint").textContent =
        `${fmtNum(count)} hosts: one cell per leaf (SU × rail) with its worst link; ` +
        "the number is up ports, or ✕ ports not up. Click a cell or a host bar to drill down.";
    }
    headerStats();
    $("fabric-error").hidden = true;
    S.renders += 1;
    document.body.dataset.renders = String(S.renders);
    if (!document.body.dataset.rendered) document.body.dataset.rendered = String(Math.round(performance.now()));
  }

  // ---------- host view ----------
  let hostTimer = null;
  function scheduleHost(host) {
    if (S.selectedHost !== host || hostTimer !== null) return;
    hostTimer = setTimeout(() => { hostTimer = null; if (S.selectedHost) showHost(S.selectedHost); }, 300);
  }

  async function showHost(host) {
    if (S.selectedHost !== host) {
      for (const g of document.querySelectorAll("g.host.selected")) g.classList.remove("selected");
      for (const g of document.querySelectorAll("g.host")) if (g.dataset.host === host) g.classList.add("selected");
    }
    S.selectedHost = host;
    const view = $("host-view");
    let doc;
    try {
      doc = await getJSON("hosts/" + encodeURIComponent(host));
    } catch (err) {
      view.replaceChildren(h("p", { class: "error" }, err.message));
      return;
    }
    if (S.selectedHost !== host) return;
    const parts = [];
    parts.push(h("p", { id: "host-title" },
      h("strong", null, doc.host), ` · SU ${doc.su} · `,
      h("span", { class: doc.online ? "" : "error" }, doc.online ? "online" : "offline"),
      ` · plan epoch ${doc.plan_epoch ?? "–"}, acked ${doc.acked_epoch ?? "–"}` +
      (doc.plan_epoch != null && doc.plan_epoch === doc.acked_epoch ? " ✓" : "")));
    if (doc.not_acking) {
      const n = doc.not_acking;
      parts.push(h("p", { id: "host-not-acking", class: "error", "data-epoch": String(n.epoch) },
        `not acking epoch ${n.epoch} for ${Math.round(n.age_s)} s: its plan was re-sent ` +
        `${n.resends} times (lost on the bus, or its agent does not take plans: read its log)`));
    }

    const hcaRows = (doc.hcas || []).map((x) => {
      const st = x.state || {};
      const d = st.damping || {};
      return h("tr", { "data-hca": x.hca, "data-shown": x.shown, "data-drained": x.drained_by ?? null },
        h("td", null, `${x.hca}/${x.port}`), h("td", { class: "num" }, x.rail),
        h("td", null, x.leaf ?? ""), h("td", null, x.netdev ?? ""),
        h("td", null, h("span", { class: "badge", "data-shown": x.shown }, LABEL[x.shown] || String(x.shown)),
          x.drained_by === "probe" ? h("span", { class: "badge", "data-drained": "probe" }, "drained by probes") : null),
        h("td", { class: "num" }, st.rate_gbps != null ? `${fmtNum(st.rate_gbps)}` : ""),
        h("td", { class: "num" }, d.flaps != null ? fmtNum(d.flaps) : ""),
        h("td", null, st.reason ?? ""));
    });
    parts.push(h("h3", null, "HCAs"), h("table", { id: "host-hcas" },
      h("thead", null, h("tr", null, ...["port", "rail", "leaf", "netdev", "shown", "Gb/s", "flaps", "reason"].map((t) => h("th", null, t)))),
      h("tbody", null, ...hcaRows)));

    const rm = doc.rail_map || [];
    parts.push(h("h3", null, "Rail map"));
    if (rm.length) {
      parts.push(h("table", { id: "host-railmap" },
        h("thead", null, h("tr", null, ...["GPU", "endpoint", "port", "rail", "home"].map((t) => h("th", null, t)))),
        h("tbody", null, ...rm.map((r) => h("tr", { class: r.rail !== r.home_rail ? "moved" : "" },
          h("td", { class: "num" }, r.gpu), h("td", null, r.endpoint), h("td", null, `${r.hca}/${r.port}`),
          h("td", { class: "num" }, r.rail), h("td", { class: "num" }, r.home_rail))))));
    } else {
      parts.push(h("p", { class: "muted" }, "no rail map yet"));
    }

    parts.push(h("h3", null, "Plan"));
    const plan = doc.plan;
    if (plan) {
      const moved = (plan.rail_assignments || []).filter((r) => r.rail !== r.home_rail).length;
      parts.push(kv([
        ["epoch", String(plan.epoch)],
        ["issued", fmtTime(plan.issued_at)],
        ["GPUs moved off their rail", moved],
        ["prefix routes", (plan.prefix_routes || []).length],
        ["/32 routes", (plan.routes || []).length],
        ["backups", (plan.backups || []).length],
        ["unreachable", (plan.unreachable || []).length],
        ["compact (shared)", plan.shared ? "yes" : "no"],
      ], "host-plan"));
    } else {
      parts.push(h("p", { class: "muted" }, "no plan yet"));
    }
    $("host-view").replaceChildren(...parts);
  }

  function kv(pairs, id) {
    const dl = h("dl", { class: "kv", id });
    for (const [k, v] of pairs) dl.append(h("dt", null, k), h("dd", null, v == null ? "–" : typeof v === "number" ? fmtNum(v) : String(v)));
    return dl;
  }

  // ---------- timeline ----------
  function describe(ev) {
    const d = ev.data && typeof ev.data === "object" ? ev.data : {};
    if (d.previous !== undefined && d.current !== undefined) {
      return `${d.previous} → ${d.current}${d.reason ? " (" + d.reason + ")" : ""}`;
    }
    if (ev.kind === "host" && typeof d.online === "boolean") return d.online ? "online" : "offline";
    if (ev.kind === "plans") {
      const n = Array.isArray(d.hosts) ? d.hosts.length : d.hosts;
      return `epoch ${d.epoch ?? "?"}: ${n ?? "?"} hosts re-planned` + (d.solve_ms != null ? `, solve ${d.solve_ms} ms` : "");
    }
    if (ev.kind === "health" && d.probe_verdict && typeof d.probe_verdict === "object") {
      const v = d.probe_verdict;
      return `probe verdict ${v.kind} ${v.subject} ${v.state} (${v.lossy}/${v.witnesses} lossy)` +
        (v.effect && v.effect !== "logged" ? `: ${v.effect.replace("_", " ")}` : "");
    }
    if (ev.kind === "health" && Array.isArray(d.degraded_rails)) {
      return d.degraded_rails.length ? `degraded rails ${d.degraded_rails.join(", ")}` : "no degraded rails";
    }
    const bits = [];
    for (const [k, v] of Object.entries(d)) {
      if (["host", "hca", "port", "rail", "at"].includes(k)) continue;
      if (v === null || typeof v === "object") {
        if (Array.isArray(v)) bits.push(`${k}: ${v.length}`);
        continue;
      }
      bits.push(`${k}=${v}`);
      if (bits.length >= 4) break;
    }
    return bits.join(" ");
  }

  // One timeline line; consecutive events of the same kind with the same description (a
  // fleet's hosts coming online, a leaf's ports going down) within GROUP_S share one line
  // with a count ("×32") and the hosts named in its tooltip.
  const GROUP_S = 5;
  function eventItem(ev, live) {
    const d = ev.data && typeof ev.data === "object" ? ev.data : {};
    const host = ev.host ?? d.host;
    const hca = ev.hca ?? d.hca;
    const port = ev.port ?? d.port;
    const rail = ev.rail ?? d.rail;
    let where = "";
    if (host) where += host;
    if (hca) where += ` ${hca}${port != null ? "/" + port : ""}`;
    if (rail != null) where += ` rail ${rail}`;
    const text = describe(ev);
    const at = ev.at ?? d.at;
    const li = h("li", { class: live ? "live" : null, "data-kind": ev.kind, "data-host": host ?? null },
      h("span", { class: "t" }, fmtTime(at)),
      h("span", { class: "k" }, String(ev.kind)),
      where ? h("span", { class: "w" }, where.trim() + " ") : null,
      h("span", { class: "d" }, text),
      h("span", { class: "n" }));
    li._group = { key: `${ev.kind}|${text}`, at: typeof at === "number" ? at : 0, count: 1, hosts: host ? [host] : [], unit: hca ? "ports" : "hosts" };
    if (host && S.hostInfo.has(host)) li.addEventListener("click", () => showHost(host));
    return li;
  }

  // Fold ``li`` into ``into`` when they group; true when folded.
  function fold(into, li) {
    const a = into && into._group, b = li._group;
    if (!a || a.key !== b.key || Math.abs(a.at - b.at) > GROUP_S || !b.hosts.length) return false;
    a.count += 1;
    if (a.hosts.length < 64) a.hosts.push(...b.hosts);
    const w = into.querySelector(".w");
    if (w) w.textContent = `${a.count} ${a.unit} `;
    else into.querySelector(".n").textContent = ` ×${a.count}`;
    into.title = a.hosts.join(" ") + (a.count > a.hosts.length ? " …" : "");
    return true;
  }

  function addLiveEvent(change) {
    const ol = $("timeline");
    const li = eventItem(change, true);
    if (!fold(ol.firstElementChild, li)) ol.prepend(li);
    while (ol.children.length > TIMELINE_MAX) ol.lastElementChild.remove();
    countEvents();
  }
  function countEvents() {
    $("events-count").textContent = `(${$("timeline").children.length} lines)`;
  }

  async function loadEvents() {
    const ol = $("timeline");
    try {
      // one page per kind shown (acks and port states would crowd out everything else)
      const pages = await Promise.all(TIMELINE_KINDS.map((k) => getJSON(`events?kind=${k}&limit=50`).catch((err) => {
        if (err.status === 503) throw err;
        return { events: [] };
      })));
      const events = pages.flatMap((p) => p.events || []);
      events.sort((a, b) => (b.at || 0) - (a.at || 0));
      const items = [];
      for (const e of events.slice(0, 200)) {
        const li = eventItem(e, false);
        if (!fold(items[items.length - 1], li)) items.push(li);
      }
      // keep live events that arrived while loading on top
      const live = [...ol.querySelectorAll("li.live")];
      ol.replaceChildren(...live, ...items);
      if (!items.length && !live.length) ol.append(h("li", { class: "muted" }, "no events"));
    } catch (err) {
      ol.replaceChildren(h("li", { class: "muted" }, err.status === 503 ? "no ledger" : err.message));
    }
    countEvents();
  }

  // ---------- report ----------
  // api/v1/report is the ledger report's JSON form (linkguard.ledgerreport: with_linkguard /
  // without_linkguard costs of one transport, named by doc.transport (schema v2; the others in
  // doc.transports), reference = Meta's published rate, worst_links, per_rail, per_leaf);
  // another shape is shown generically (its scalars and small tables).
  async function loadReport() {
    const box = $("report");
    let doc;
    try {
      doc = await getJSON("report");
    } catch (err) {
      box.replaceChildren(h("p", { class: "muted", id: "report-none" },
        err.status === 503 ? "no ledger" : `report unavailable (${err.message})`));
      return;
    }
    if (!doc || typeof doc !== "object") {
      box.replaceChildren(h("p", { class: "muted" }, "empty report"));
      return;
    }
    const parts = doc.with_linkguard && doc.without_linkguard ? ledgerReport(doc) : genericReport(doc);
    box.replaceChildren(...parts);
  }

  const pct = (v) => (typeof v === "number" ? `${(100 * v).toFixed(4)} %` : "–");
  const num = (v, digits) => (typeof v === "number" ? (digits == null ? fmtNum(v) : v.toFixed(digits)) : "–");

  function ledgerReport(doc) {
    const w = doc.window || {}, f = doc.fabric || {}, oc = doc.outage_counts || {};
    const withL = doc.with_linkguard || {}, without = doc.without_linkguard || {}, ref = doc.reference || {};
    const ttr = doc.time_to_reroute_ms || {};
    const pairs = [
      ["window", `${w.since_iso || "?"} → ${w.until_iso || "?"} (${num(w.days, 2)} days)`],
      ["fabric", `${f.name ?? "?"}: ${num(f.gpus)} GPUs, ${num(doc.gpu_days, 1)} GPU-days`],
      ["outages", `${num(oc.outages)} (open ${num(oc.open)}, isolated ${num(oc.isolated)})`],
      ["priced for", doc.transport ? `the ${doc.transport} transport (linkguard report --transport for the others)` : "–"],
      ["interruptions / 1,000 GPU-days", `${num(withL.interruptions_per_1000_gpu_days, 3)} with linkguard, ` +
        `${num(without.interruptions_per_1000_gpu_days, 3)} without`],
      ["Meta (Llama 3) / 1,000 GPU-days", `${num(ref.per_1000_gpu_days, 3)} all causes, ` +
        `${num(ref.link_caused_per_1000_gpu_days, 3)} link-caused`],
      ["interruptions avoided", num(doc.interruptions_avoided)],
      ["GPU-hours saved", `${num(doc.gpu_hours_saved, 2)} ($${num(doc.dollars_saved, 2)} at $${num(doc.price_per_gpu_hour, 2)}/GPU-hour)`],
      ["goodput", `${pct(withL.goodput)} with, ${pct(without.goodput)} without`],
      ["reroutes", `${num(doc.reroutes)} (needless ${num(doc.needless_reroutes)}, unconfirmed ${num(doc.unconfirmed_reroutes)})`],
      ["time to reroute", ttr.count ? `p50 ${num(ttr.p50, 1)} ms, p99 ${num(ttr.p99, 1)} ms, max ${num(ttr.max, 1)} ms` : "–"],
      ["port downs / suppressions", `${num(doc.port_downs)} / ${num(doc.suppressions)}`],
    ];
    const parts = [kv(pairs, "report-numbers")];
    for (const [name, rows, limit] of [["worst links", doc.worst_links, 5], ["per rail", doc.per_rail, 16], ["per leaf", doc.per_leaf, 8]]) {
      const t = smallTable(name, rows, limit);
      if (t) parts.push(...t);
    }
    return parts;
  }

  function genericReport(doc) {
    const scalars = [];
    const parts = [];
    for (const [k, v] of Object.entries(doc)) {
      if (v === null || typeof v !== "object") scalars.push([k.replaceAll("_", " "), v]);
      else if (!Array.isArray(v)) {
        for (const [k2, v2] of Object.entries(v)) {
          if (v2 === null || typeof v2 !== "object") scalars.push([`${k} ${k2}`.replaceAll("_", " "), v2]);
        }
      }
    }
    parts.push(kv(scalars, "report-numbers"));
    for (const [k, v] of Object.entries(doc)) {
      if (!Array.isArray(v)) continue;
      const t = smallTable(k.replaceAll("_", " "), v, 8);
      if (t) parts.push(...t);
    }
    return parts;
  }

  // A heading and a table of the first ``limit`` object rows' scalar columns (null: none).
  function smallTable(name, rows, limit) {
    if (!Array.isArray(rows)) return null;
    const objs = rows.filter((r) => r && typeof r === "object" && !Array.isArray(r)).slice(0, limit);
    if (!objs.length) return null;
    const cols = Object.keys(objs[0]).filter((c) => objs.every((r) => r[c] === null || typeof r[c] !== "object")).slice(0, 6);
    const cell = (v) => h("td", { class: typeof v === "number" ? "num" : null },
      v == null ? "" : typeof v === "number" ? fmtNum(v) : String(v));
    return [
      h("h3", null, name + (rows.length > objs.length ? ` (top ${objs.length} of ${rows.length})` : "")),
      h("table", null,
        h("thead", null, h("tr", null, ...cols.map((c) => h("th", null, c.replaceAll("_", " "))))),
        h("tbody", null, ...objs.map((r) => h("tr", null, ...cols.map((c) => cell(r[c])))))),
    ];
  }

  // ---------- the change stream ----------
  function apply(kind, change) {
    const d = change.data || {};
    if (kind === "port") {
      const shown = shownOf(d);
      learnRate(d, shown);
      setShown(portKey(d.host, d.hca, d.port), shown);
      if (S.mode === "aggregate") scheduleSummary();
      scheduleHost(d.host);
    } else if (kind === "host") {
      if (d.online === false) S.offline.add(d.host);
      else S.offline.delete(d.host);
      for (const g of document.querySelectorAll("g.host")) if (g.dataset.host === d.host) g.classList.toggle("offline", d.online === false);
      if (S.mode === "aggregate") scheduleSummary();
      scheduleHost(d.host);
    } else if (kind === "plans") {
      if (S.selectedHost && Array.isArray(d.hosts) && d.hosts.includes(S.selectedHost)) scheduleHost(S.selectedHost);
    } else if (kind === "ack") {
      scheduleHost(d.host);
    } else if (kind === "health" && d.probe_verdict && typeof d.probe_verdict === "object") {
      const v = d.probe_verdict;
      const key = v.kind === "port" ? portOnRail(v.host, v.rail) : null;
      if (key && (v.effect === "rail_unusable" || v.effect === "rail_usable")) {
        setProbeDrained(key, v.effect === "rail_unusable");
        if (S.mode === "aggregate") scheduleSummary();
        scheduleHost(v.host);
      }
    }
    if (TIMELINE_KINDS.includes(kind)) addLiveEvent(change);
  }

  function onChange(kind, ev) {
    let change;
    try {
      change = JSON.parse(ev.data);
    } catch (_) {
      return;
    }
    if (!change || typeof change !== "object") return;
    if (!S.loaded) S.pending.push([kind, change]);
    else apply(kind, change);
  }

  function connect() {
    if (typeof EventSource === "undefined") return;
    const es = new EventSource(API + "stream");
    const status = $("stream-status");
    const setState = (state, text) => {
      status.dataset.state = state;
      status.textContent = text;
      document.body.dataset.stream = state;
    };
    es.onopen = () => setState("open", "stream: live");
    es.onerror = () => setState("error", "stream: reconnecting…");
    for (const kind of ["port", "port_event", "host", "plans", "ack", "audit", "health"]) {
      es.addEventListener(kind, (ev) => onChange(kind, ev));
    }
    es.addEventListener("resync", () => { reload(); });
  }

  let reloading = null;
  async function reload() {
    if (reloading) return reloading;
    reloading = (async () => {
      S.loaded = false;
      try {
        await loadFabric();
        S.loaded = true;
        const pending = S.pending;
        S.pending = [];
        for (const [kind, change] of pending) apply(kind, change);
        if (S.mode === "aggregate" && S.drillSu !== null) await drill(S.drillSu);
        if (S.selectedHost) showHost(S.selectedHost);
      } catch (err) {
        showError(err);
        S.loaded = true;
      } finally {
        reloading = null;
      }
    })();
    return reloading;
  }

  function onFabricClick(ev) {
    const t = ev.target;
    if (!(t instanceof Element)) return;
    const host = t.getAttribute("data-host") || (t.closest("g.host") && t.closest("g.host").getAttribute("data-host"));
    if (host) showHost(host);
  }

  function main() {
    drawLegend();
    $("fabric").addEventListener("click", onFabricClick);
    $("drill-svg").addEventListener("click", onFabricClick);
    $("drill-close").addEventListener("click", closeDrill);
    connect(); // first: changes during the load are buffered, then applied
    reload();
    loadEvents();
    loadReport();
    setInterval(loadReport, 60000);
    loadNotAcking();
    setInterval(loadNotAcking, NOT_ACKING_POLL_MS);
    let resizeTimer = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        if (!S.loaded || !S.fabric) return;
        if (S.mode === "detail") renderDetail();
        else if (S.summary) renderAggregate();
      }, 200);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main);
  else main();
})();
