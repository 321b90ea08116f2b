// The console's small toolkit: the API client (token, role), DOM building, formatting.
// Everything the pages show comes through api() from the broker's public HTTP API (docs/api.md).

const TOKEN_KEY = 'queen-mp.token';
const RANK = { 'read-only': 1, 'read-write': 2, admin: 3 };

export const authMode = () =>
  document.querySelector('meta[name="queen-auth"]')?.content === 'jwt' ? 'jwt' : 'off';

export const getToken = () => sessionStorage.getItem(TOKEN_KEY);
export const setToken = (t) => (t ? sessionStorage.setItem(TOKEN_KEY, t) : sessionStorage.removeItem(TOKEN_KEY));

// The token's claims, decoded but not verified: the broker verifies; the console only reads
// the role to hide what would answer 403 (docs/api.md 1.5: 'role' or 'roles', highest wins).
export function claims(token = getToken()) {
  try {
    const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    const text = new TextDecoder().decode(Uint8Array.from(atob(part), (c) => c.charCodeAt(0)));
    const obj = JSON.parse(text);
    return obj && typeof obj === 'object' ? obj : {};
  } catch {
    return {};
  }
}

export function role() {
  if (authMode() === 'off') return 'admin'; // authentication off: everyone may do everything
  const c = claims();
  const names = [...(typeof c.role === 'string' ? [c.role] : []),
    ...(Array.isArray(c.roles) ? c.roles.filter((r) => typeof r === 'string') : [])];
  return names.filter((n) => n in RANK).sort((a, b) => RANK[b] - RANK[a])[0] || 'none';
}

export const can = (need) => (RANK[role()] || 0) >= RANK[need];

export class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.error || body.message)) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

// One call of the API; JSON in and out. 401 means the token is gone or bad: the app asks again.
export async function api(path, { method = 'GET', body, text = false } = {}) {
  const headers = { Accept: text ? 'text/plain' : 'application/json' };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 204) return null;
  const raw = await r.text();
  let parsed = raw;
  if (!text) {
    try { parsed = raw ? JSON.parse(raw) : null; } catch { parsed = { error: raw }; }
  }
  if (!r.ok) {
    const err = new ApiError(r.status, parsed);
    if (r.status === 401) window.dispatchEvent(new CustomEvent('queen:unauthorized', { detail: err }));
    throw err;
  }
  return parsed;
}

export const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') s.set(k, v);
  const t = s.toString();
  return t ? `?${t}` : '';
};
export const seg = encodeURIComponent;

// h('tag.class', {attr, on: {click}}, ...children): DOM without innerHTML (no markup injection).
export function h(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split('.');
  const el = document.createElement(tag || 'div');
  if (classes.length) el.className = classes.join(' ');
  if (attrs === null || typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs)) {
    children.unshift(attrs);
    attrs = {};
  }
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k in el && k !== 'list' && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export const replace = (el, ...children) => { el.replaceChildren(); append(el, children); return el; };

// A table from rows; columns: [{label, value: row => node|text, sort: row => key, cls}].
export function table(columns, rows, { sortKey, sortDesc, onSort, empty = 'Nothing here.', rowAttrs } = {}) {
  if (!rows.length) return h('p.muted.empty', empty);
  const head = h('tr', columns.map((c, i) => h(`th${c.num ? '.num' : ''}`,
    c.sort && onSort ? { on: { click: () => onSort(i) }, class: `sortable${sortKey === i ? (sortDesc ? ' desc' : ' asc') : ''}` } : {},
    c.label)));
  const body = rows.map((r) => h('tr', rowAttrs ? rowAttrs(r) : {},
    columns.map((c) => h(`td${c.num ? '.num' : ''}`, c.value(r)))));
  return h('table', h('thead', head), h('tbody', body));
}

export const num = (n, digits = 0) => (n === null || n === undefined || Number.isNaN(n) ? '—'
  : Number(n).toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: 0 }));
export const rate = (n) => (n === null || n === undefined ? '—' : n >= 100 ? num(n) : num(n, 1));

export function ago(iso) {
  if (!iso) return '—';
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

export function duration(sec) {
  if (sec === null || sec === undefined) return '—';
  if (sec < 120) return `${Math.round(sec)} s`;
  if (sec < 7200) return `${Math.round(sec / 60)} min`;
  if (sec < 172800) return `${(sec / 3600).toFixed(1)} h`;
  return `${(sec / 86400).toFixed(1)} d`;
}

export const when = (iso) => (iso ? h('time', { datetime: iso, title: iso }, ago(iso)) : '—');
export const bytes = (n) => (n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB`
  : n < 1073741824 ? `${(n / 1048576).toFixed(1)} MiB` : `${(n / 1073741824).toFixed(2)} GiB`);

export const badge = (text, kind = '') => h(`span.badge${kind ? `.${kind}` : ''}`, text);
export const card = (label, value, { kind = '', title, testid } = {}) =>
  h(`div.card${kind ? `.${kind}` : ''}`, { title, dataset: testid ? { testid } : undefined },
    h('div.card-label', label), h('div.card-value', value));
export const section = (title, ...body) => h('section', h('h2', title), ...body);

// A message's or a dead letter's payload. The broker withholds an encrypted one from a
// read-only token (data null, dataWithheld: docs/api.md 1.5): say so instead of a blank.
const WITHHELD = 'Encrypted payload withheld: the read-only role may not read an encrypted '
  + "queue's payloads; a read-write or admin token shows it decrypted.";
export const payloadView = (m) => (m.dataWithheld
  ? h('p.payload.withheld', { dataset: { testid: 'payload-withheld' } }, badge('encrypted', 'warn'), ' ', WITHHELD)
  : h('pre.payload', m.data === null && m.encrypted ? '—' : JSON.stringify(m.data, null, 2)));

export function toast(message, kind = 'ok') {
  const el = document.getElementById('toast');
  replace(el, h(`div.toast.${kind}`, message));
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => el.replaceChildren(), 4000);
}

// Run an action from a button: disabled while it runs, the answer or the error as a toast.
export async function act(button, label, fn) {
  button.disabled = true;
  try {
    const out = await fn();
    toast(label);
    return out;
  } catch (err) {
    toast(`${label} failed: ${err.message}`, 'error');
    return undefined;
  } finally {
    button.disabled = false;
  }
}

// A button that is only there when the role may use it (a read-only token sees none).
export const button = (need, label, onClick, cls = '') =>
  (can(need) ? h(`button${cls ? `.${cls}` : ''}`, { type: 'button', on: { click: (e) => onClick(e.currentTarget) } }, label) : null);

// Prometheus text: sum of each family over its labels, plus histogram buckets by 'le'.
export function promTotals(text, families) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m || !families.some((f) => m[1].startsWith(f))) continue;
    const v = Number(m[3]);
    if (!Number.isFinite(v)) continue;
    let key = m[1];
    if (key.endsWith('_bucket')) key += `|${(/le="([^"]*)"/.exec(m[2] || '') || [])[1]}`;
    out[key] = (out[key] || 0) + v;
  }
  return out;
}
