// Live fabric dashboard: keeps the server-rendered page current from ws/fabric/<group>/.
// No framework, no build step. The server sends {"type": "fabric.view", "view": {...}} (see
// dashboard/selectors.py merge_snapshots); each message re-renders the dynamic sections.
(function () {
  "use strict";
  var root = document.getElementById("fabric");
  if (!root) return;
  var DROP_LABELS = JSON.parse(document.getElementById("fabric-labels").textContent);
  var DROP_REASONS = Object.keys(DROP_LABELS);
  var STALE_AFTER_MS = 6000;
  var csrf = (root.querySelector("[name=csrfmiddlewaretoken]") || {}).value || "";
  var historyUrl = root.dataset.history;
  var pauseBase = root.dataset.pauseBase;
  var lastMessage = 0;
  var lastView = JSON.parse(document.getElementById("fabric-initial").textContent);
  var socket = null;
  var retry = 500;
  var closedFor = "";

  function esc(value) {
    return String(value === null || value === undefined ? "" : value).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function dash(value) { return value === null || value === undefined ? "–" : value; }
  function secs(value) {
    if (value === null || value === undefined) return "–";
    if (value < 60) return value.toFixed(1) + " s";
    var m = Math.floor(value / 60);
    if (m < 60) return m + " m " + Math.floor(value % 60) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " m";
  }
  function pct(part, whole) { return whole > 0 ? Math.min(100, Math.round((100 * (part || 0)) / whole)) : 0; }
  function sum(obj) { var n = 0; for (var k in obj) n += obj[k]; return n; }
  function chips(obj, cls) {
    var keys = Object.keys(obj || {});
    if (!keys.length) return '<span class="muted">–</span>';
    return keys.map(function (k) { return '<span class="chip ' + (cls || "") + '">' + esc(k) + " " + obj[k] + "</span>"; }).join("");
  }
  function setText(name, value) {
    var el = root.querySelector('[data-v="' + name + '"]');
    if (el) el.textContent = value;
  }

  function poolRow(p, maxQueue) {
    var paused = !!p.paused;
    var deficits = Object.keys(p.deficit || {}).map(function (d) {
      return '<span title="' + esc(d) + '">' + esc(p.deficit[d]) + "</span>";
    }).join(" · ") || "–";
    var minMark = p.min_concurrent ? '<b style="left:' + pct(p.min_concurrent, p.max_concurrent) + '%" title="min ' + p.min_concurrent + '"></b>' : "";
    var action = paused ? "resume" : "pause";
    var links = (p.admin_url ? '<a href="' + esc(p.admin_url) + '">admin</a> · ' : "") +
      '<a href="' + esc(historyUrl) + "?pool=" + encodeURIComponent(p.pool_id) + '">history</a>';
    var full = p.in_flight !== null && p.in_flight >= p.max_concurrent ? " full" : "";
    return '<tr data-pool="' + esc(p.pool_id) + '" class="' + (paused ? "paused" : "") + (p.enabled === false ? " disabled" : "") + '">' +
      '<td class="name"><strong>' + esc(p.display_name || p.pool_id) + '</strong> <small class="muted">' + esc(p.pool_id) + "</small>" +
      (paused ? ' <span class="pill warn">paused</span>' : "") + (p.enabled === false ? ' <span class="pill">disabled</span>' : "") +
      '<div class="links">' + links + "</div></td>" +
      '<td class="num" data-f="weight">' + esc(p.weight) + "</td>" +
      '<td class="bar-col"><span class="fig" data-f="queue_depth">' + esc(p.queue_depth || 0) + "</span>" +
      '<span class="bar queue"><i style="width:' + pct(p.queue_depth, maxQueue) + '%"></i></span></td>' +
      '<td class="bar-col"><span class="fig"><span data-f="in_flight">' + esc(dash(p.in_flight)) + "</span> / " + esc(p.max_concurrent) + "</span>" +
      '<span class="bar flight' + full + '"><i style="width:' + pct(p.in_flight, p.max_concurrent) + '%"></i>' + minMark + "</span>" +
      '<small class="muted">min ' + esc(p.min_concurrent) + "</small></td>" +
      '<td class="num" data-f="deficit">' + deficits + "</td>" +
      '<td class="num" data-f="oldest">' + secs(p.oldest_pending_age_s) + "</td>" +
      '<td class="num" data-f="head_cost">' + esc(dash(p.head_cost)) + "</td>" +
      '<td class="skips" data-f="skips">' + chips(p.skips) + "</td>" +
      '<td class="act"><form method="post" action="' + esc(pauseBase + encodeURIComponent(p.pool_id) + "/" + action + "/") + '" class="pause-form">' +
      '<input type="hidden" name="csrfmiddlewaretoken" value="' + esc(csrf) + '">' +
      '<button type="submit" class="' + action + '">' + (paused ? "Resume" : "Pause") + "</button></form></td></tr>";
  }

  function activeRow(a) {
    return "<tr><td><code title=\"" + esc(a.request_id) + "\">" + esc(String(a.request_id).slice(0, 12)) + "</code></td>" +
      "<td>" + esc(a.pool_id) + "</td><td><code>" + esc(String(a.producer_id).slice(0, 17)) + "</code></td>" +
      "<td>" + esc(a.model) + "</td><td>" + esc(a.stage) + '</td><td class="num">' + secs(a.age_s) + "</td>" +
      "<td>" + esc(a.dispatcher_id) + "</td></tr>";
  }

  // One pill per backend URL: its circuit breaker's mode (closed is healthy) and how often it opened.
  function breakers(map) {
    var urls = Object.keys(map || {});
    if (!urls.length) return '<span class="muted">–</span>';
    return urls.map(function (url) {
      var b = map[url], cls = b.mode === "closed" ? "ok" : b.mode === "open" ? "bad" : "warn";
      return '<span class="pill ' + cls + '" title="' + esc(url) + '">' + esc(b.mode.replace("_", "-")) +
        (b.trips ? " · opened " + b.trips + " times" : "") + "</span>";
    }).join(" ");
  }

  function dispatcherRow(d) {
    var up = d.up_since ? new Date(d.up_since * 1000).toLocaleString() : "–";
    return "<tr><td>" + esc(d.gateway_id) + "</td><td><code>" + esc(d.dispatcher_id) + "</code></td>" +
      "<td>" + esc(up) + ' <small class="muted">(' + secs(d.uptime_s) + ")</small></td>" +
      "<td>" + (d.valkey_ok ? '<span class="pill ok">ok</span>' : '<span class="pill bad">down</span>') + "</td>" +
      "<td>" + breakers(d.breakers) + "</td>" +
      '<td class="num">' + d.in_flight + " / " + esc(dash(d.concurrency)) + '</td><td class="num">' + d.completed + "</td>" +
      "<td>" + (Object.keys(d.failed || {}).length ? chips(d.failed, "bad") : '<span class="muted">none</span>') + "</td>" +
      "<td>" + (d.stopping ? '<span class="pill warn">stopping</span>' : '<span class="pill ok">running</span>') + "</td>" +
      '<td class="num">' + secs(d.age_s) + "</td></tr>";
  }

  function counterRows(view) {
    var totals = view.totals || { dropped: {}, failed: {} };
    var reasons = DROP_REASONS.slice();
    Object.keys(view.dropped).concat(Object.keys(totals.dropped)).forEach(function (r) {
      if (reasons.indexOf(r) < 0) reasons.push(r);
    });
    var rows = reasons.map(function (r) {
      var total = totals.dropped[r] || 0;
      return '<tr class="' + (total ? "hot" : "") + '"><td>Dropped: ' + esc(DROP_LABELS[r] || r) + '</td><td class="num">' +
        (view.dropped[r] || 0) + '</td><td class="num">' + total + "</td></tr>";
    });
    var types = Object.keys(view.failed);
    Object.keys(totals.failed).forEach(function (t) { if (types.indexOf(t) < 0) types.push(t); });
    types.sort().forEach(function (t) {
      var total = totals.failed[t] || 0;
      rows.push('<tr class="' + (total ? "hot" : "") + '"><td>Failed: ' + esc(t) + '</td><td class="num">' +
        (view.failed[t] || 0) + '</td><td class="num">' + total + "</td></tr>");
    });
    return rows.join("");
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
    el.className = "banner " + cls;
    el.innerHTML = html;
    var feed = document.getElementById("feed");
    var live = cls === "hidden";
    feed.className = "pill " + (live ? "ok" : cls === "bad" ? "bad" : "warn");
    feed.textContent = live ? "live" : closedFor ? "disconnected" : !view.dispatchers_running ? "no dispatcher" : "stale";
  }

  function render(view) {
    lastView = view;
    var totals = view.totals || {};
    setText("dispatchers_running", view.dispatchers_running);
    setText("group_in_flight", view.group_in_flight);
    if (view.total_concurrency !== null && view.total_concurrency !== undefined) setText("total_concurrency", view.total_concurrency);
    setText("queued", view.queued);
    setText("completed", totals.completed || 0);
    setText("failed_total", totals.failed_total || 0);
    setText("dropped_total", totals.dropped_total || 0);
    if (view.policy) setText("policy", view.policy);
    setText("active_count", view.active.length);
    var maxQueue = Math.max.apply(null, [1].concat(view.pools.map(function (p) { return p.queue_depth || 0; })));
    document.getElementById("pools").innerHTML = view.pools.length
      ? view.pools.map(function (p) { return poolRow(p, maxQueue); }).join("")
      : '<tr><td colspan="9" class="muted">This group has no pools.</td></tr>';
    document.getElementById("active").innerHTML = view.active.length
      ? view.active.map(activeRow).join("") : '<tr><td colspan="7" class="muted">Nothing in flight.</td></tr>';
    document.getElementById("dispatchers").innerHTML = view.dispatchers.length
      ? view.dispatchers.map(dispatcherRow).join("") : '<tr><td colspan="10" class="muted">No dispatcher is running.</td></tr>';
    document.getElementById("counters").innerHTML = counterRows(view);
    banner(view);
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

  // Pause/resume without a reload; the next snapshot confirms the new state.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("pause-form")) return;
    event.preventDefault();
    var button = form.querySelector("button");
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
      lastView.pools.forEach(function (p) { if (p.pool_id === result.pool_id) p.paused = result.paused; });
      render(lastView);
      if (socket && socket.readyState === 1) socket.send(JSON.stringify({ type: "refresh" }));
    }).catch(function (error) {
      button.disabled = false;
      button.textContent = "Retry";
      button.title = String(error);
    });
  });

  setInterval(function () { banner(lastView); }, 1000);
  lastMessage = Date.now();
  render(lastView);
  connect();
})();
