// The idemgate console: one page over the admin API, with the token the operator types.
//
// Everything shown comes from clients (keys, paths) or from the configuration (route names):
// it is only ever put on the page as text (textContent, never HTML), and the page runs under a
// Content-Security-Policy without inline script. The token is kept in sessionStorage (this tab
// only, gone when it closes) and sent as a bearer header; there are no cookies, so there is
// nothing for a request from another site to ride on.
'use strict';

const TOKEN_KEY = 'idemgate.token';
const POLL_MS = 5000;
const WINDOW_MS = 5 * 60 * 1000;
const PAGE = 50;

const $ = (id) => document.getElementById(id);

const state = {
  token: null,
  role: null,
  routes: [],
  upstreams: {},
  samples: [],
  heldCursor: null,
  heldRoutes: [],
  auditCursor: null,
  record: null,
  timers: [],
};

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: 'Bearer ' + state.token };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, { method, headers, body, cache: 'no-store', credentials: 'omit' });
  const type = response.headers.get('content-type') || '';
  const payload = type.includes('json') ? await response.json().catch(() => null) : await response.text();
  if (!response.ok) {
    const detail = payload && typeof payload === 'object' ? payload.detail || payload.error || payload.title : String(payload || '');
    throw new ApiError(response.status, detail || response.statusText);
  }
  return payload;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  return q.toString();
}

// ---------- building the page, as text only ----------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const cell of cells) tr.appendChild(el('td', cell));
  return tr;
}

function say(text, error) {
  const status = $('status');
  status.textContent = text;
  status.classList.toggle('error', Boolean(error));
}

function fail(what, e) {
  if (e instanceof ApiError && e.status === 401) {
    signOut('The token was refused (401): sign in again.');
    return;
  }
  say(what + ': ' + (e && e.message ? e.message : String(e)), true);
}

function ago(ms) {
  const s = Math.round(ms / 1000);
  if (s < 120) return s + ' s ago';
  if (s < 7200) return Math.round(s / 60) + ' min ago';
  return Math.round(s / 3600) + ' h ago';
}

// ---------- signing in ----------

async function signIn(token) {
  state.token = token;
  try {
    const me = await api('GET', '/whoami');
    state.role = me.role;
    sessionStorage.setItem(TOKEN_KEY, token);
    $('who-text').textContent = 'Signed in as ' + me.name + ' (' + me.role + ')';
    document.body.classList.toggle('role-read', me.role !== 'operate');
    $('sign-in').hidden = true;
    $('who').hidden = false;
    $('main').hidden = false;
    say('');
    await start();
  } catch (e) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    say('Sign-in failed: ' + (e.status === 401 ? 'the token was refused' : e.message), true);
  }
}

function signOut(message) {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  state.token = null;
  state.role = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $('main').hidden = true;
  $('who').hidden = true;
  $('sign-in').hidden = false;
  $('token').value = '';
  say(message || 'Signed out.');
}

// One call at a time: a tab holds one connection of the admin listener's few, whatever it
// shows, so that open consoles never starve the probes.
async function start() {
  await loadRoutes();
  await pollOutcomes();
  await loadHeld(true);
  await loadAudit(true);
  state.timers.push(setInterval(refresh, POLL_MS));
}

let ticks = 0;
async function refresh() {
  await pollOutcomes();
  ticks += 1;
  if (ticks % 2 === 0) await loadAudit(true);
}

// ---------- routes ----------

async function loadRoutes() {
  try {
    state.routes = await api('GET', '/routes');
  } catch (e) {
    fail('Routes', e);
    return;
  }
  drawRoutes();
  const select = $('held-route');
  select.replaceChildren(el('option', 'every idempotent route'));
  select.firstChild.value = '';
  for (const r of state.routes.filter((r) => r.idempotency)) {
    const option = el('option', r.name);
    option.value = r.name;
    select.appendChild(option);
  }
}

function drawRoutes() {
  const body = $('routes').tBodies[0];
  body.replaceChildren();
  for (const r of state.routes) {
    const mode = r.idempotency ? r.idempotency.mode : 'pass-through';
    const instances = (state.upstreams[r.upstream] || []).map(describeInstance).join('; ');
    body.appendChild(row([r.name, (r.methods || ['any']).join(', '), r.path, (r.hosts || ['any']).join(', '), r.upstream, instances, mode]));
  }
}

function describeInstance(i) {
  if (i.left_out) {
    return i.address + ': left out for ' + Math.ceil(i.left_out_for_ms / 1000) + ' s more (' + i.left_out_because.replace(/_/g, ' ') + ', ejection ' + i.ejections + ')';
  }
  return i.address + ': serving, ' + i.in_flight + ' in flight';
}

async function loadUpstreams() {
  try {
    const list = await api('GET', '/upstreams');
    state.upstreams = {};
    for (const u of list) state.upstreams[u.name] = u.instances;
  } catch (e) {
    return fail('Upstreams', e);
  }
  drawRoutes();
}

// ---------- outcomes, from /metrics ----------

const OUTCOMES = [
  ['first', ['executed']],
  ['replayed', ['replayed']],
  ['rejected reuse', ['mismatch']],
  ['conflict', ['in_flight']],
  ['unknown', ['outcome_unknown']],
  ['store error', ['store_unavailable', 'bypassed']],
  ['passed through', ['passed_through']],
  ['observed', ['observed']],
];

function parseLabels(text) {
  const labels = {};
  const re = /(\w+)="((?:[^"\\]|\\.)*)"/g;
  let m;
  while ((m = re.exec(text)) !== null) labels[m[1]] = m[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
  return labels;
}

// Counts by route: {outcomes: {label: n}, would: {label: n}}.
function parseMetrics(text) {
  const routes = {};
  const at = (route) => (routes[route] = routes[route] || { outcomes: {}, would: {} });
  for (const line of text.split('\n')) {
    const m = /^(idemgate_requests_total|idemgate_observed_total)\{([^}]*)\} (\S+)/.exec(line);
    if (!m) continue;
    const labels = parseLabels(m[2]);
    const value = Number(m[3]);
    if (!labels.route || !Number.isFinite(value)) continue;
    if (m[1] === 'idemgate_requests_total' && labels.outcome) at(labels.route).outcomes[labels.outcome] = value;
    if (m[1] === 'idemgate_observed_total' && labels.would) at(labels.route).would[labels.would] = value;
  }
  return routes;
}

async function pollOutcomes() {
  let text;
  try {
    text = await api('GET', '/metrics');
  } catch (e) {
    fail('Metrics', e);
    return;
  }
  const now = Date.now();
  state.samples.push({ at: now, routes: parseMetrics(text) });
  while (state.samples.length > 2 && now - state.samples[0].at > WINDOW_MS) state.samples.shift();
  drawOutcomes();
  await loadUpstreams();
}

function drawOutcomes() {
  const last = state.samples[state.samples.length - 1];
  // Until a second sample, the totals since the gateway started; then the window.
  const first = state.samples.length > 1 ? state.samples[0] : { at: last.at, routes: {} };
  const seconds = Math.round((last.at - first.at) / 1000);
  $('outcomes-window').textContent = state.samples.length > 1
    ? 'over the last ' + seconds + ' s (since this page opened, up to 5 min)'
    : 'since the gateway started (the window starts with the next refresh)';
  const delta = (route, kind, label) => {
    const now = ((last.routes[route] || {})[kind] || {})[label] || 0;
    const then = ((first.routes[route] || {})[kind] || {})[label] || 0;
    return Math.max(0, now - then);
  };
  const body = $('outcomes').tBodies[0];
  body.replaceChildren();
  const report = $('observe-report');
  report.replaceChildren();
  for (const r of state.routes) {
    const cells = [r.name];
    for (const [, labels] of OUTCOMES) cells.push(labels.reduce((sum, l) => sum + delta(r.name, 'outcomes', l), 0));
    body.appendChild(row(cells));
    if (r.idempotency && r.idempotency.mode === 'observe') {
      const would = Object.keys((last.routes[r.name] || {}).would || {}).sort();
      const parts = would.map((w) => w.replace(/_/g, ' ') + ': ' + delta(r.name, 'would', w)).join(', ');
      report.appendChild(el('p', 'Route ' + r.name + ' only observes. Enforcing would have changed, in the same window: ' + (parts || 'nothing yet') + '.'));
    }
  }
}

// ---------- keys that need an operator ----------

async function loadHeld(fresh) {
  const route = $('held-route').value;
  const held = $('held-state').value;
  const body = $('held').tBodies[0];
  if (fresh) {
    body.replaceChildren();
    state.heldRoutes = route ? [route] : state.routes.filter((r) => r.idempotency).map((r) => r.name);
    state.heldCursor = null;
  }
  try {
    while (state.heldRoutes.length > 0) {
      const name = state.heldRoutes[0];
      const page = await api('GET', '/keys?' + query({ route: name, state: held, cursor: state.heldCursor, limit: PAGE }));
      for (const r of page.records) body.appendChild(heldRow(name, r));
      state.heldCursor = page.next_cursor;
      if (state.heldCursor) break;
      state.heldRoutes.shift();
    }
  } catch (e) {
    fail('Held keys', e);
  }
  $('held-more').hidden = state.heldRoutes.length === 0;
  if (body.rows.length === 0) {
    const tr = row(['No key is ' + held + (route ? ' on ' + route : '') + '.']);
    tr.cells[0].colSpan = 7;
    body.appendChild(tr);
  }
}

function heldRow(route, r) {
  const tr = row([ago(r.since_ms), route, r.key, r.method, r.path, r.state, r.attempt]);
  tr.addEventListener('click', () => {
    for (const other of $('held').tBodies[0].rows) other.classList.remove('chosen');
    tr.classList.add('chosen');
    showRecord({ route, key: r.key, scope_hash: r.scope_hash, method: r.method, path: r.path, since_ms: r.since_ms, held: r.state });
  });
  return tr;
}

// ---------- one record ----------

function recordQuery(extra) {
  const r = state.record;
  return query({ route: r.route, key: r.key, scope_hash: r.scope_hash, ...extra });
}

async function showRecord(which) {
  state.record = which;
  $('record-section').hidden = false;
  const list = $('record');
  list.replaceChildren();
  let found;
  try {
    found = await api('GET', '/keys?' + recordQuery({ include: 'answer' }));
  } catch (e) {
    found = e.status === 404 ? { state: 'absent' } : null;
    if (!found) return fail('Record', e);
  }
  const add = (name, value) => {
    if (value === undefined || value === null) return;
    list.appendChild(el('dt', name));
    list.appendChild(el('dd', value));
  };
  add('route', which.route);
  add('key', which.key);
  add('scope hash', which.scope_hash);
  add('request', which.method && which.path ? which.method + ' ' + which.path : undefined);
  add('listed', which.since_ms !== undefined ? which.held + ' since ' + ago(which.since_ms) : undefined);
  add('state', found.state);
  add('attempts', found.attempt);
  add('status', found.status);
  add('body bytes', found.body_bytes);
  add('expires in', found.expires_in_ms !== undefined ? Math.round(found.expires_in_ms / 1000) + ' s' : undefined);
  add('lease left', found.lease_left_ms !== undefined ? Math.round(found.lease_left_ms / 1000) + ' s' : undefined);
  add('lookup running', found.lookup_in_flight);
  const answer = found.answer;
  if (answer) {
    add('answer status', answer.status);
    for (const [name, values] of Object.entries(answer.headers)) add('answer header ' + name, values.join(', '));
    if (answer.body_preview !== undefined) {
      const shown = answer.body_preview_encoding === 'base64' ? '(base64) ' + answer.body_preview : answer.body_preview;
      add('answer body' + (answer.body_preview_truncated ? ' (first 4 KiB)' : ''), shown);
    } else {
      add('answer body', answer.body_bytes + ' bytes, not shown: ' + answer.body_preview_withheld);
    }
  }
  state.record.found = found;
}

function confirmDialog(title, text, typed) {
  return new Promise((resolve) => {
    const dialog = $('confirm');
    $('confirm-title').textContent = title;
    $('confirm-text').textContent = text;
    const input = $('confirm-typed');
    input.value = '';
    input.hidden = !typed;
    $('confirm-typed-label').hidden = !typed;
    $('confirm-key').textContent = typed || '';
    $('confirm-ok').classList.toggle('danger', Boolean(typed));
    dialog.onclose = () => resolve(dialog.returnValue === 'ok' && (!typed || input.value === typed));
    dialog.returnValue = '';
    dialog.showModal();
  });
}

async function resolveRecord(event) {
  event.preventDefault();
  const r = state.record;
  const status = Number($('resolve-status').value);
  let headers;
  try {
    headers = JSON.parse($('resolve-headers').value || '{}');
  } catch (e) {
    return say('The headers are not JSON: ' + e.message, true);
  }
  const answer = JSON.stringify({ status, headers, body: $('resolve-body').value });
  const ok = await confirmDialog(
    'Resolve ' + r.key + ' on ' + r.route + '?',
    'Every retry with this key will get this answer (status ' + status + ') instead of running again, for the route\'s retention. The upstream is not called: answer only what the request really did.',
  );
  if (!ok) return say('Nothing changed.');
  try {
    const done = await api('PUT', '/keys?' + recordQuery(), answer);
    say('Resolved (it was ' + done.was + '): retries now get your answer.');
  } catch (e) {
    return fail('Resolve', e);
  }
  await afterChange();
}

async function releaseRecord(force) {
  const r = state.record;
  const ok = force
    ? await confirmDialog(
        'Force the release of ' + r.key + '?',
        'A request may hold this key and be running upstream now. Released, the next retry runs the request a second time beside it. Force only a key whose gateway is gone and whose upstream never saw the request.',
        r.key,
      )
    : await confirmDialog(
        'Release ' + r.key + ' on ' + r.route + '?',
        'The next request with this key runs upstream again, as attempt ' + ((r.found && r.found.attempt) || 0) + ' + 1. Release only a request that did not take effect.',
      );
  if (!ok) return say('Nothing changed.');
  try {
    const done = await api('DELETE', '/keys?' + recordQuery(force ? { force: 'true' } : {}));
    say(done.released ? 'Released (it was ' + done.was + '): the next retry runs again.' : 'Nothing to release.');
  } catch (e) {
    return fail('Release', e);
  }
  await afterChange();
}

async function afterChange() {
  if (state.record) await showRecord(state.record);
  await loadHeld(true);
  await loadAudit(true);
}

async function reload() {
  const ok = await confirmDialog('Reload the configuration?', 'The gateway reads its configuration file again. A file with errors is refused and the running configuration stays; some settings only take effect at a restart.');
  if (!ok) return say('Nothing changed.');
  try {
    const done = await api('POST', '/reload');
    say('Reloaded.' + (done.needs_restart.length ? ' Needs a restart: ' + done.needs_restart.join(', ') : ''));
  } catch (e) {
    return fail('Reload', e);
  }
  await loadRoutes();
  await loadAudit(true);
}

// ---------- the audit trail ----------

async function loadAudit(fresh) {
  const body = $('audit').tBodies[0];
  if (fresh) state.auditCursor = null;
  let page;
  try {
    page = await api('GET', '/audit?' + query({ cursor: state.auditCursor, limit: PAGE }));
  } catch (e) {
    return fail('Audit trail', e);
  }
  if (fresh) body.replaceChildren();
  for (const a of page.entries) {
    const states = a.before || a.after ? (a.before || '–') + ' → ' + (a.after || '–') : '';
    body.appendChild(row([a.at, a.by, a.role, a.action, a.route || '', a.record || '', states, a.outcome + ' (' + a.status + ')', a.from, a.gateway]));
  }
  state.auditCursor = page.next_cursor;
  $('audit-more').hidden = !state.auditCursor;
}

// ---------- wiring ----------

document.addEventListener('DOMContentLoaded', () => {
  $('sign-in').addEventListener('submit', (e) => {
    e.preventDefault();
    const token = $('token').value.trim();
    if (token) signIn(token);
  });
  $('sign-out').addEventListener('click', () => signOut());
  $('reload').addEventListener('click', reload);
  $('held-filter').addEventListener('submit', (e) => {
    e.preventDefault();
    loadHeld(true);
  });
  $('held-more').addEventListener('click', () => loadHeld(false));
  $('audit-more').addEventListener('click', () => loadAudit(false));
  $('resolve-form').addEventListener('submit', resolveRecord);
  $('release').addEventListener('click', () => releaseRecord(false));
  $('force-release').addEventListener('click', () => releaseRecord(true));
  const kept = sessionStorage.getItem(TOKEN_KEY);
  if (kept) signIn(kept);
});
