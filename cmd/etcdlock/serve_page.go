package main

// fleetPage is serve's live page: one file, no build step, nothing from
// elsewhere. Its script reads /events (the state, then each lock that
// changed) and draws each lock with textContent only: a name, a holder's
// record or a value cannot inject markup. Ages tick every second between
// events.
const fleetPage = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>etcdlock: locks</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; margin: 0 0 .2em; }
#status { color: #666; margin-bottom: 1em; }
#status.down { color: #b00; }
.lock { border: 1px solid #ccc; border-radius: 6px; padding: .6em .8em; margin: 0 0 .8em; max-width: 60em; }
.lock.held { border-left: 6px solid #2a7; }
.lock.free { border-left: 6px solid #bbb; }
.lock.blocked { border-left: 6px solid #d80; }
.name { font-weight: 600; font-family: ui-monospace, monospace; }
.state { margin-left: .6em; color: #444; }
.row { margin: .2em 0 0 1em; }
.label { color: #666; }
ol { margin: .2em 0 0 1em; padding-left: 1.4em; }
.key { font-family: ui-monospace, monospace; color: #555; }
.asked { color: #b00; font-weight: 600; }
</style>
</head>
<body>
<h1>Locks<span id="prefix"></span></h1>
<div id="status">connecting…</div>
<div id="locks"></div>
<script>
"use strict";
const locks = new Map();
let revision = 0;
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};
const dur = (s) => {
  s = Math.max(0, Math.floor(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60) + "s";
  return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
};
const who = (k) => {
  let s = k.by ? k.by : (k.queued_at || k.held_since ? "etcdlock run" : "");
  if (k.name) s += (s ? " " : "") + JSON.stringify(k.name);
  if (k.command) s += (s ? " " : "") + k.command;
  if (k.pid) s += (s ? ", " : "") + "pid " + k.pid;
  if (k.host) s += " on " + k.host;
  if (!s && k.value !== undefined && k.value !== null) s = "value " + JSON.stringify(k.value);
  if (!s && k.identity) s = typeof k.identity === "string" ? k.identity : JSON.stringify(k.identity);
  return s || "(recorded nothing)";
};
const since = (lk) => {
  const h = lk.holder;
  if (!h) return null;
  const t = h.held_since || lk.seen_since;
  return t ? new Date(t) : null;
};
function drawLock(lk) {
  const box = el("div", "lock");
  box.dataset.name = lk.name;
  const head = el("div");
  head.append(el("span", "name", lk.name));
  let state;
  if (lk.holder) {
    box.classList.add("held");
    const t = since(lk);
    state = "held" + (t ? " for " + dur((Date.now() - t) / 1000) + (lk.holder.held_since ? "" : " (at least: seen by serve)") : "");
  } else if (lk.waiters.length > 0) {
    box.classList.add("blocked");
    state = "held by nobody, " + lk.waiters.length + " waiting";
  } else {
    box.classList.add("free");
    state = "free";
  }
  head.append(el("span", "state", " — " + state));
  box.append(head);
  for (const h of lk.holders) {
    const r = el("div", "row holder");
    r.append(el("span", "label", "holder: "), el("span", "who", who(h)), el("span", null, ", token " + h.token + ", key "), el("span", "key", h.key));
    if (h.release_requested) r.append(el("span", "asked", " — asked to release"));
    box.append(r);
  }
  if (lk.waiters.length > 0) {
    const r = el("div", "row");
    r.append(el("span", "label", "waiting:"));
    const ol = el("ol", "waiters");
    for (const w of lk.waiters) {
      const li = el("li", "waiter");
      li.append(el("span", "who", who(w)), el("span", null, ", token " + w.token + ", key "), el("span", "key", w.key));
      ol.append(li);
    }
    r.append(ol);
    box.append(r);
  }
  for (const d of (lk.lock_delays || [])) {
    const r = el("div", "row delay");
    let s = (d.min_hold_seconds ? "minimum hold " : "lock delay ") + dur(d.delay_seconds) + " after " + d.key;
    s += d.started ? (d.left_seconds !== undefined ? ", " + dur(d.left_seconds) + " left" : ", running") : ", not begun";
    r.append(el("span", "label", "pending: "), el("span", null, s));
    box.append(r);
  }
  return box;
}
function draw() {
  const list = document.getElementById("locks");
  const names = [...locks.keys()].sort();
  list.replaceChildren(...names.map((n) => drawLock(locks.get(n))));
  if (names.length === 0) list.append(el("p", "none", "no locks"));
}
function connect() {
  const es = new EventSource("events");
  const status = document.getElementById("status");
  es.addEventListener("state", (e) => {
    const st = JSON.parse(e.data);
    locks.clear();
    for (const lk of st.locks) locks.set(lk.name, lk);
    revision = st.revision;
    document.getElementById("prefix").textContent = st.prefix ? " under " + st.prefix : "";
    status.className = "";
    status.textContent = "live, etcd revision " + revision;
    draw();
  });
  es.addEventListener("locks", (e) => {
    for (const lk of JSON.parse(e.data)) {
      if (lk.gone) locks.delete(lk.name); else locks.set(lk.name, lk);
      revision = Math.max(revision, lk.revision || 0);
    }
    status.textContent = "live, etcd revision " + revision;
    draw();
  });
  es.onerror = () => {
    status.className = "down";
    status.textContent = "lost the connection to etcdlock serve: reconnecting…";
  };
}
connect();
setInterval(draw, 1000);
</script>
</body>
</html>
`
