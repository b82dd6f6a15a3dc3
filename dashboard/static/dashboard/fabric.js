// Live fabric dashboard: keeps the server-rendered page current from ws/fabric/<group>/.
// No framework, no build step. The server sends {"type": "fabric.view", "view": {...}} (see
// dashboard/selectors.py merge_snapshots) several times a second. Rows are keyed and updated in place:
// only text and attributes change, never the nodes, because a node replaced between a person's
// mouse-down and mouse-up swallows the click (the Pause/Resume buttons live in these rows). Nor do
// the rows move: fabric.css gives the pool rows a fixed height and the columns fixed widths, since a
// button that moved between mouse-down and mouse-up loses the click just the same.
(function () {
  "use strict";
  var root = document.getElementById("fabric");
  if (!root) return;
  // Plain-word labels and explanations of drop reasons, skip reasons and breaker modes
  // (dashboard/selectors.py reason_texts); a reason missing here is shown under its own name.
  var TEXTS = JSON.parse(document.getElementById("fabric-texts").textContent);
  var STALE_AFTER_MS = 6000;
  var PENDING_MS = 15000; // how long a saved pause/resume may wait for the dispatchers to apply it
  var csrf = (root.querySelector("[name=csrfmiddlewaretoken]") || {}).value || "";
  var historyUrl = root.dataset.history;
  var pauseBase = root.dataset.pauseBase;
  var lastMessage = 0;
  var lastView = JSON.parse(document.getElementById("fabric-initial").textContent);
  var socket = null;
  var retry = 500;
  var closedFor = "";
  var posting = {}; // pool_id -> true while its pause/resume request is on the way
  var wanted = {}; // pool_id -> {paused, at}: saved by the operator, not yet in the dispatchers' view
  var problems = {}; // pool_id -> what went wrong with the operator's last pause/resume

  // --- formatting -------------------------------------------------------------------------------
  function esc(value) {
    return String(value === null || value === undefined ? "" : value).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function dash(value) { return value === null || value === undefined ? "–" : String(value); }
  function secs(value) {
    if (value === null || value === undefined) return "–";
    if (value < 1) return Math.round(value * 1000) + " ms";
    if (value < 60) return value.toFixed(1) + " s";
    var m = Math.floor(value / 60);
    if (m < 60) return m + " m " + Math.floor(value % 60) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " m";
  }
  function times(n) { return n === 1 ? "once" : n + " times"; }
  function pct(part, whole) { return whole > 0 ? Math.min(100, Math.round((100 * (part || 0)) / whole)) : 0; }
  function reason(kind, name) {
    var known = (TEXTS[kind] || {})[name];
    return known || { label: String(name).replace(/_/g, " "), explanation: "Reported by the dispatcher as “" + name + "”." };
  }
  function chips(obj, kind, cls) {
    var keys = Object.keys(obj || {});
    if (!keys.length) return '<span class="muted">–</span>';
    return keys.map(function (k) {
      var text = kind ? reason(kind, k) : { label: k, explanation: k };
      return '<span class="chip ' + (cls || "") + '" title="' + esc(k + ": " + text.explanation) + '">' +
        esc(text.label) + " <b>" + esc(obj[k]) + "</b></span>";
    }).join("");
  }

  // --- in-place DOM updates ---------------------------------------------------------------------
  function setText(el, value) { if (el && el.textContent !== value) el.textContent = value; }
  function setHTML(el, html) { if (el && el.__html !== html) { el.innerHTML = html; el.__html = html; } }
  function setAttr(el, name, value) { if (el && el.getAttribute(name) !== value) el.setAttribute(name, value); }
  function setClass(el, name, on) { if (el && el.classList.contains(name) !== on) el.classList.toggle(name, on); }
  function setTile(name, value) { setText(root.querySelector('[data-v="' + name + '"]'), String(value)); }
  function fields(tr) {
    if (!tr.__fields) {
      tr.__fields = {};
      tr.querySelectorAll("[data-f]").forEach(function (el) { tr.__fields[el.dataset.f] = el; });
    }
    return tr.__fields;
  }

  // Keeps one <tr> per item (by key) in tbody: builds missing rows, updates every row, drops rows
  // whose item is gone, and moves a row only when the order changed.
  function syncRows(tbody, items, keyOf, build, update, emptyHTML) {
    var byKey = {};
    Array.prototype.slice.call(tbody.children).forEach(function (tr) {
      if (tr.dataset.key === undefined) tr.remove(); else byKey[tr.dataset.key] = tr;
    });
    var keep = {};
    items.forEach(function (item) { keep[keyOf(item)] = true; });
    Object.keys(byKey).forEach(function (key) { if (!keep[key]) { byKey[key].remove(); delete byKey[key]; } });
    items.forEach(function (item, i) {
      var key = keyOf(item);
      var tr = byKey[key];
      if (!tr) { tr = build(item); tr.dataset.key = key; byKey[key] = tr; }
      update(tr, item);
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
    });
    if (!items.length) {
      var empty = document.createElement("tr");
      empty.innerHTML = emptyHTML;
      tbody.appendChild(empty);
    }
  }
  function cellsRow(count) {
    return function () {
      var tr = document.createElement("tr");
      for (var i = 0; i < count; i++) tr.appendChild(document.createElement("td"));
      return tr;
    };
  }
  function setCells(tr, cells) {
    cells.forEach(function (cell, i) {
      var td = tr.children[i];
      setHTML(td, cell.html);
      td.className = cell.cls || "";
      if (cell.title !== undefined) setAttr(td, "title", cell.title);
    });
  }

  function deadLetterCells(d) {
    return [
      { html: esc(d.pool_id) },
      { html: esc(d.count), cls: "num" },
      { html: d.oldest_age_s === null || d.oldest_age_s === undefined ? "–" : esc(Math.round(d.oldest_age_s) + " s"), cls: "num" },
      { html: d.url ? '<a href="' + esc(d.url) + '">replay or discard</a>' : "" },
    ];
  }

  function num(value) { return value === null || value === undefined ? "–" : String(Math.round(value)); }
  function tenantItems(view) {
    var items = [];
    (view.tenant_pools || []).forEach(function (tp) {
      tp.rows.forEach(function (t) { items.push({ pool: tp, t: t, key: tp.pool_id + "/" + t.tenant }); });
    });
    return items;
  }
  function tenantCells(item) {
    var tp = item.pool, t = item.t;
    return [
      { html: esc(tp.pool_id) + ' <small class="muted">' + esc(tp.fairness) + " · " + esc(tp.backlogged) + " backlogged</small>" },
      { html: "<code>" + (t.tenant === "*" ? "(untagged)" : esc(t.tenant)) + "</code>" },
      { html: esc(t.queued), cls: "num" },
      { html: esc(t.in_flight), cls: "num" },
      { html: num(t.served_last_minute), cls: "num" },
      { html: num(t.served), cls: "num" },
      { html: num(t.counter), cls: "num" },
    ];
  }

  // --- pools ------------------------------------------------------------------------------------
  function isPaused(p) {
    var want = wanted[p.pool_id];
    if (want) {
      // Only a snapshot of the configuration our save published (or a newer one) settles the row: an
      // older one, still on its way, would flip the button back under the operator's pointer.
      var version = (lastView && lastView.config_version) || 0;
      var settled = want.version ? version >= want.version : !!p.paused === want.paused;
      if (settled || Date.now() - want.at > PENDING_MS) delete wanted[p.pool_id];
      else return want.paused;
    }
    return !!p.paused;
  }

  function buildPoolRow(p) {
    var tr = document.createElement("tr");
    tr.dataset.pool = p.pool_id;
    tr.innerHTML =
      '<td class="name"><strong data-f="name"></strong> <span data-f="pills"></span> ' +
      '<small class="muted" data-f="id"></small><div class="links" data-f="links"></div></td>' +
      '<td class="num" data-f="weight"></td>' +
      '<td class="bar-col"><span class="fig" data-f="queue_depth"></span><small class="muted" data-f="max_queued"></small>' +
      '<span class="bar queue"><i data-f="queue_bar"></i></span><small class="refused" data-f="rejected"></small></td>' +
      '<td class="bar-col"><span class="fig"><span data-f="in_flight"></span> / <span data-f="max_concurrent"></span></span>' +
      '<span class="bar flight" data-f="flight"><i data-f="flight_bar"></i><b data-f="min_mark"></b></span>' +
      '<small class="muted" data-f="min"></small></td>' +
      '<td class="num" data-f="deficit"></td><td class="num" data-f="oldest"></td>' +
      '<td class="num" data-f="head_cost"></td><td class="skips"><div class="chips" data-f="skips"></div></td>' +
      '<td class="act"><form method="post" class="pause-form" data-f="form">' +
      '<button type="submit" data-f="button"></button></form></td>';
    return tr;
  }

  function updatePoolRow(tr, p, maxQueue) {
    var f = fields(tr);
    var paused = isPaused(p);
    var applying = paused !== !!p.paused;
    setClass(tr, "paused", paused);
    setClass(tr, "disabled", p.enabled === false);
    setText(f.name, p.display_name || p.pool_id);
    setText(f.id, p.pool_id);
    setHTML(f.pills,
      (applying ? '<span class="pill warn" title="Saved and published; the dispatchers apply it within about a second">' +
        (paused ? "pausing…" : "resuming…") + "</span>"
        : paused ? '<span class="pill warn" title="Queued work stays queued until the pool is resumed">paused</span>' : "") +
      (p.enabled === false ? ' <span class="pill" title="Disabled in the admin: not scheduled">disabled</span>' : "") +
      (problems[p.pool_id] ? ' <span class="pill bad" title="' + esc(problems[p.pool_id].detail) + '">' +
        esc(problems[p.pool_id].label) + "</span>" : ""));
    setHTML(f.links, (p.admin_url ? '<a href="' + esc(p.admin_url) + '">admin</a> · ' : "") +
      '<a href="' + esc(historyUrl) + "?pool=" + encodeURIComponent(p.pool_id) + '">history</a>');
    setText(f.weight, dash(p.weight));
    setText(f.queue_depth, String(p.queue_depth || 0));
    f.queue_bar.style.width = pct(p.queue_depth, maxQueue) + "%";
    setText(f.max_queued, p.max_queued ? " / max " + p.max_queued : "");
    var rejected = p.rejected || {};
    setText(f.rejected, Object.keys(rejected).sort().map(function (r) {
      return "refused " + rejected[r] + " (" + r + ")";
    }).join(", "));
    setText(f.in_flight, dash(p.in_flight));
    setText(f.max_concurrent, dash(p.max_concurrent));
    setClass(f.flight, "full", p.in_flight !== null && p.in_flight >= p.max_concurrent);
    f.flight_bar.style.width = pct(p.in_flight, p.max_concurrent) + "%";
    f.min_mark.hidden = !p.min_concurrent;
    f.min_mark.style.left = pct(p.min_concurrent, p.max_concurrent) + "%";
    setAttr(f.min_mark, "title", "protected slots: " + p.min_concurrent);
    setText(f.min, "min " + dash(p.min_concurrent));
    var deficits = Object.keys(p.deficit || {});
    setHTML(f.deficit, deficits.map(function (d) {
      return '<span title="' + esc(d) + '">' + esc(p.deficit[d]) + "</span>";
    }).join(" · ") || "–");
    setText(f.oldest, secs(p.oldest_pending_age_s));
    setText(f.head_cost, dash(p.head_cost));
    setHTML(f.skips, chips(p.skips, "skip"));
    var action = paused ? "resume" : "pause";
    setAttr(f.form, "action", pauseBase + encodeURIComponent(p.pool_id) + "/" + action + "/");
    if (!posting[p.pool_id]) {
      f.button.disabled = false;
      setAttr(f.button, "class", action);
      setText(f.button, paused ? "Resume" : "Pause");
    }
  }

  // --- the other tables -------------------------------------------------------------------------
  function backendCells(b) {
    return [
      { html: "<strong>" + esc(b.name) + '</strong> <small class="muted">' + esc(b.backend_id) + " · " + esc(b.kind) + "</small>" },
      { html: esc(dash(b.running)), cls: "num" },
      { html: esc(dash(b.waiting)), cls: "num" },
      { html: b.kv_usage === null || b.kv_usage === undefined ? "–" : Math.round(100 * b.kv_usage) + "%", cls: "num",
        title: b.kv_metric ? "Read from " + b.kv_metric : "" },
      { html: esc(b.in_flight) + " / " + esc(b.limit) + ' <small class="muted">(max ' + esc(b.max_in_flight) + ")</small>", cls: "num" },
      { html: esc(b.breaker_words), cls: b.breaker === "closed" ? "" : "hot" },
      { html: esc(b.metrics_words), cls: b.metrics === "fresh" || b.metrics === "none" ? "" : "hot" },
      { html: esc(b.held || "–"), title: b.held_words || "" },
    ];
  }

  function activeCells(a) {
    var waited = a.queue_wait_s, running = a.execution_s;
    return [
      { html: '<code title="' + esc(a.request_id) + '">' + esc(String(a.request_id).slice(0, 12)) + "</code>" },
      { html: esc(a.pool_id) },
      { html: '<code title="' + esc(a.producer_id) + '">' + esc(String(a.producer_id).slice(0, 17)) + "</code>" },
      { html: esc(a.model), cls: "nowrap" },
      { html: esc(a.stage) },
      { html: waited === undefined ? "–" : secs(waited), cls: "num", title: "Time in the queue before a dispatcher started it" },
      { html: running === undefined ? secs(a.age_s) : secs(running), cls: "num", title: "Time since the backend call started" },
      { html: esc(a.dispatcher_id) },
    ];
  }

  function breakers(map) {
    var urls = Object.keys(map || {});
    if (!urls.length) return '<span class="muted">–</span>';
    return urls.map(function (url) {
      var b = map[url], text = reason("breaker", b.mode);
      var cls = b.mode === "closed" ? "ok" : b.mode === "open" ? "bad" : "warn";
      return '<span class="pill ' + cls + '" title="' + esc(url + " — " + text.explanation) + '">' + esc(text.label) +
        (b.trips ? " · opened " + times(b.trips) : "") + "</span>";
    }).join(" ");
  }

  // Which Valkey the dispatcher talks to (after a failover, the new primary) and since when.
  function valkeyCell(d) {
    var html = d.valkey_ok ? '<span class="pill ok">ok</span>' : '<span class="pill bad">unreachable</span>';
    if (d.valkey) html += ' <code class="valkey-server">' + esc(d.valkey) + "</code>";
    if (d.valkey_reconnected_at) {
      var since = new Date(d.valkey_reconnected_at * 1000).toLocaleTimeString();
      html += ' <small class="muted" title="connected to this Valkey at">since ' + esc(since) + "</small>";
    }
    return html;
  }

  function dispatcherCells(d) {
    var up = d.up_since ? new Date(d.up_since * 1000).toLocaleString() : "–";
    return [
      { html: esc(d.gateway_id) },
      { html: "<code>" + esc(d.dispatcher_id) + "</code>" },
      { html: esc(up) + ' <small class="muted">(' + secs(d.uptime_s) + ")</small>" },
      { html: valkeyCell(d) },
      { html: breakers(d.breakers) },
      { html: d.in_flight + " / " + esc(dash(d.concurrency)), cls: "num" },
      { html: String(d.completed), cls: "num" },
      { html: Object.keys(d.failed || {}).length ? chips(d.failed, null, "bad") : '<span class="muted">none</span>' },
      { html: d.stopping ? '<span class="pill warn">stopping</span>' : '<span class="pill ok">running</span>' },
      { html: secs(d.age_s), cls: "num" },
    ];
  }

  function counterItems(view) {
    var totals = view.totals || { dropped: {}, failed: {} };
    var reasons = (root.dataset.dropReasons || "").split(" ").filter(Boolean);
    Object.keys(view.dropped).concat(Object.keys(totals.dropped)).forEach(function (r) {
      if (reasons.indexOf(r) < 0) reasons.push(r);
    });
    var items = reasons.map(function (r) {
      var text = reason("drop", r);
      return { key: "drop:" + r, label: "Dropped: " + text.label, title: r + ": " + text.explanation,
        live: view.dropped[r] || 0, total: totals.dropped[r] || 0 };
    });
    var types = Object.keys(view.failed);
    Object.keys(totals.failed).forEach(function (t) { if (types.indexOf(t) < 0) types.push(t); });
    types.sort().forEach(function (t) {
      items.push({ key: "failed:" + t, label: "Failed: " + t, title: "Calls that ended with this error type (see History for each one).",
        live: view.failed[t] || 0, total: totals.failed[t] || 0 });
    });
    Object.keys(totals.unpersisted || {}).sort().forEach(function (o) {
      items.push({ key: "unpersisted:" + o, label: "Not persisted: " + o,
        title: "Durable pushes a producer answered without the persistence asked for (" + o + ").",
        live: 0, total: totals.unpersisted[o] || 0 });
    });
    return items;
  }

  function updateCounterRow(tr, item) {
    setClass(tr, "hot", item.total > 0);
    setCells(tr, [
      { html: esc(item.label), title: item.title },
      { html: String(item.live), cls: "num" },
      { html: String(item.total), cls: "num" },
    ]);
  }

  // Adds any reason the legend does not explain yet (a new one from a newer dispatcher).
  function updateLegend(view) {
    var seen = { drop: Object.keys(view.dropped).concat(Object.keys((view.totals || {}).dropped || {})), skip: [] };
    view.pools.forEach(function (p) { seen.skip = seen.skip.concat(Object.keys(p.skips || {})); });
    ["drop", "skip"].forEach(function (kind) {
      var list = document.getElementById("legend-" + kind);
      if (!list) return;
      seen[kind].forEach(function (r) {
        if (list.querySelector('[data-reason="' + CSS.escape(r) + '"]')) return;
        var text = reason(kind, r);
        var dt = document.createElement("dt");
        dt.dataset.reason = r;
        dt.innerHTML = esc(text.label) + ' <code>' + esc(r) + "</code>";
        var dd = document.createElement("dd");
        dd.textContent = text.explanation;
        list.appendChild(dt);
        list.appendChild(dd);
      });
    });
  }

  function banner(view) {
    var el = document.getElementById("banner");
    var html = "", cls = "hidden";
    if (closedFor) { html = closedFor; cls = "bad"; }
    else if (view.valkey_error) { html = "<strong>Valkey unreachable.</strong> Live figures cannot be read: " + esc(view.valkey_error); cls = "bad"; }
    else if (!view.dispatchers_running) {
      html = "<strong>No dispatcher is running for this group.</strong> Queued requests wait until one starts: " +
        "<code>python manage.py rundispatcher --group " + esc(root.dataset.group) + "</code>";
      cls = "bad";
    } else if (view.stale) { html = "<strong>The live feed is stale.</strong> The newest dispatcher snapshot is " + secs(view.age_s) + " old."; cls = "warn"; }
    else if (Date.now() - lastMessage > STALE_AFTER_MS) { html = "<strong>Live updates stopped.</strong> Reconnecting to the server…"; cls = "warn"; }
    setAttr(el, "class", "banner " + cls);
    setHTML(el, html);
    var feed = document.getElementById("feed");
    var live = cls === "hidden";
    setAttr(feed, "class", "pill " + (live ? "ok" : cls === "bad" ? "bad" : "warn"));
    setText(feed, live ? "live" : closedFor ? "disconnected" : !view.dispatchers_running ? "no dispatcher" : "stale");
  }

  function render(view) {
    lastView = view;
    var totals = view.totals || {};
    setTile("dispatchers_running", view.dispatchers_running);
    setTile("group_in_flight", view.group_in_flight);
    if (view.total_concurrency !== null && view.total_concurrency !== undefined) setTile("total_concurrency", view.total_concurrency);
    setTile("queued", view.queued);
    setTile("completed", totals.completed || 0);
    setTile("failed_total", totals.failed_total || 0);
    setTile("dropped_total", totals.dropped_total || 0);
    setTile("dead_letters_total", view.dead_letters_total || 0);
    setTile("rejected_total", view.pools.reduce(function (sum, p) {
      return sum + Object.keys(p.rejected || {}).reduce(function (n, r) { return n + p.rejected[r]; }, 0);
    }, 0));
    if (view.policy) setTile("policy", view.policy);
    setTile("active_count", view.active.length);
    var maxQueue = Math.max.apply(null, [1].concat(view.pools.map(function (p) { return p.queue_depth || 0; })));
    syncRows(document.getElementById("pools"), view.pools, function (p) { return p.pool_id; }, buildPoolRow,
      function (tr, p) { updatePoolRow(tr, p, maxQueue); },
      '<td colspan="9" class="muted">This group has no pools.</td>');
    syncRows(document.getElementById("backends"), view.backends || [], function (b) { return b.backend_id; },
      cellsRow(8), function (tr, b) { tr.dataset.backend = b.backend_id; setCells(tr, backendCells(b)); },
      '<td colspan="8" class="muted">No backend is published for this group.</td>');
    syncRows(document.getElementById("active"), view.active, function (a) { return a.dispatcher_id + "/" + a.request_id; },
      cellsRow(8), function (tr, a) { tr.dataset.request = a.request_id; setCells(tr, activeCells(a)); },
      '<td colspan="8" class="muted">Nothing in flight.</td>');
    syncRows(document.getElementById("dispatchers"), view.dispatchers, function (d) { return d.dispatcher_id; },
      cellsRow(10), function (tr, d) { setCells(tr, dispatcherCells(d)); },
      '<td colspan="10" class="muted">No dispatcher is running.</td>');
    syncRows(document.getElementById("counters"), counterItems(view), function (c) { return c.key; },
      cellsRow(3), updateCounterRow, "");
    syncRows(document.getElementById("tenants"), tenantItems(view), function (item) { return item.key; },
      cellsRow(7), function (tr, item) { tr.dataset.tenant = item.key; setCells(tr, tenantCells(item)); },
      '<td colspan="7" class="muted">' + ((view.tenant_pools || []).length ? "No tenant queued or in flight." : "No pool has tenant fairness on.") + "</td>");
    syncRows(document.getElementById("dead-letters"), view.dead_letters || [], function (d) { return d.pool_id; },
      cellsRow(4), function (tr, d) { setCells(tr, deadLetterCells(d)); },
      '<td colspan="4" class="muted">No dead letters.</td>');
    updateLegend(view);
    banner(view);
    restored(view.config_restored);
  }

  function restored(info) {
    var el = document.getElementById("config-restored");
    setAttr(el, "class", "banner warn" + (info ? "" : " hidden"));
    setHTML(el, info ? "<strong>Configuration restored at " + esc(info.at_text) + "</strong> from the database by " +
      esc(info.by) + " (" + esc(String(info.groups)) + " group(s)): Valkey had lost it." : "");
  }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(proto + location.host + root.dataset.ws);
    socket.onopen = function () { retry = 500; closedFor = ""; };
    socket.onmessage = function (event) {
      var msg = JSON.parse(event.data);
      if (msg.type === "fabric.view") { lastMessage = Date.now(); closedFor = ""; render(msg.view); }
    };
    socket.onclose = function (event) {
      if (event.code === 4401 || event.code === 4403) {
        closedFor = "<strong>Not allowed to watch this group.</strong> <a href=\"/admin/login/?next=" +
          encodeURIComponent(location.pathname) + "\">Log in as staff</a> and reload.";
        banner(lastView);
        return;
      }
      if (event.code === 4404) { closedFor = "<strong>This fabric group no longer exists.</strong>"; banner(lastView); return; }
      closedFor = "<strong>Disconnected from the live feed.</strong> Reconnecting…";
      banner(lastView);
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  // Pause/resume without a reload. The row shows the saved state at once ("pausing…" until the
  // dispatchers' snapshots agree), so the next live frame does not flip the button back.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("pause-form")) return;
    event.preventDefault();
    var tr = form.closest("tr");
    var poolId = tr ? tr.dataset.pool : "";
    var button = form.querySelector("button");
    posting[poolId] = true;
    button.disabled = true;
    button.textContent = button.classList.contains("pause") ? "Pausing…" : "Resuming…";
    fetch(form.action, {
      method: "POST",
      headers: { "X-CSRFToken": csrf, Accept: "application/json" },
      credentials: "same-origin",
    }).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.json();
    }).then(function (result) {
      delete posting[poolId];
      delete problems[poolId];
      if (!result.published) {
        // Saved in the database, but running dispatchers keep their previous configuration.
        problems[poolId] = { label: "not published", detail: (result.errors || []).join("; ") };
      }
      wanted[result.pool_id] = { paused: result.paused, at: Date.now(), version: result.version || 0 };
      render(lastView);
      if (socket && socket.readyState === 1) socket.send(JSON.stringify({ type: "refresh" }));
    }).catch(function (error) {
      delete posting[poolId];
      problems[poolId] = { label: "not saved", detail: "The server refused or did not answer (" + error + "); try again." };
      render(lastView);
    });
  });

  setInterval(function () { banner(lastView); }, 1000);
  lastMessage = Date.now();
  // The server painted the first frame; from here the script owns the rows (built once, then updated).
  ["pools", "active", "dispatchers", "counters", "dead-letters"].forEach(function (id) {
    document.getElementById(id).innerHTML = "";
  });
  render(lastView);
  connect();
})();
