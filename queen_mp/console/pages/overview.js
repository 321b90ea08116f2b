// Overview: live rates and latency (from /metrics and /metrics/prometheus, differenced between
// polls), backlog and DLQ depth (/api/v1/resources/overview), maintenance (/health), spool, and
// the queues with the most backlog or traffic (/api/v1/resources/queues).
import { LineChart } from '../chart.js';
import { api, badge, card, h, num, promTotals, rate, replace, section, table } from '../lib.js';

const POLL_MS = 2000;
const LATENCY = 'queen_http_request_duration_seconds';

// The quantile q of the requests between two readings of the summed histogram buckets.
function quantile(prev, now, q) {
  const les = Object.keys(now).filter((k) => k.startsWith(`${LATENCY}_bucket|`))
    .map((k) => k.split('|')[1]).sort((a, b) => Number(a) - Number(b));
  const count = (le) => (now[`${LATENCY}_bucket|${le}`] || 0) - (prev[`${LATENCY}_bucket|${le}`] || 0);
  const total = count('+Inf');
  if (!(total > 0)) return null;
  const le = les.find((l) => count(l) >= q * total);
  return le === '+Inf' ? null : Number(le);
}

export async function render(main, _args, life) {
  const cards = h('div.cards');
  const rates = new LineChart('Messages per second', [
    { name: 'push', cls: 's1' }, { name: 'pop', cls: 's2' }, { name: 'ack', cls: 's3' }]);
  const latency = new LineChart('Request latency', [
    { name: 'mean', cls: 's1' }, { name: 'p99 ≤', cls: 's4' }], { unit: ' ms' });
  const backlog = new LineChart('Backlog', [
    { name: 'pending', cls: 's2' }, { name: 'processing', cls: 's3' }, { name: 'DLQ', cls: 's4' }]);
  const top = h('div');
  main.append(h('h1', 'Overview'), cards, h('div.charts', rates.el, latency.el, backlog.el),
    section('Top queues', h('p.muted', 'By backlog, then by traffic since the page opened.'), top));

  let prev = null;
  const seen = new Map(); // queue -> [t, total] of the first reading
  life.every(POLL_MS, async () => {
    const t = performance.now() / 1000;
    const [m, prom, health, ov, queues] = await Promise.all([
      api('/metrics'), api('/metrics/prometheus', { text: true }), api('/health'),
      api('/api/v1/resources/overview'), api('/api/v1/resources/queues?limit=1000')]);
    const p = promTotals(prom, [LATENCY]);
    const now = { t, m, p };
    let push = null;
    let pop = null;
    let ack = null;
    let mean = null;
    let p99 = null;
    if (prev) {
      const dt = Math.max(0.001, t - prev.t);
      const d = (f) => Math.max(0, f(m) - f(prev.m)) / dt;
      push = d((x) => x.messages.pushed);
      pop = d((x) => x.messages.popped);
      ack = d((x) => x.messages.acked);
      const n = (p[`${LATENCY}_count`] || 0) - (prev.p[`${LATENCY}_count`] || 0);
      mean = n > 0 ? (1000 * ((p[`${LATENCY}_sum`] || 0) - (prev.p[`${LATENCY}_sum`] || 0))) / n : 0;
      const q99 = quantile(prev.p, p, 0.99);
      p99 = q99 === null ? (n > 0 ? null : 0) : q99 * 1000;
      rates.push(push, pop, ack);
      latency.push(mean, p99);
    }
    prev = now;
    const msgs = ov.messages;
    backlog.push(msgs.pending, msgs.processing, msgs.deadLetter);
    const maint = (on) => (on ? badge('on', 'warn') : badge('off', 'ok'));
    replace(cards,
      card('Push /s', rate(push), { testid: 'push-rate' }),
      card('Pop /s', rate(pop)),
      card('Ack /s', rate(ack)),
      card('Latency', mean === null ? '—' : `${num(mean, 1)} ms`, { title: 'mean over the last poll' }),
      card('Segments / commit', num(m.fusion.segmentsPerCommit, 2), { title: 'fusion: segments written per PostgreSQL commit' }),
      card('Backlog', num(msgs.pending), { testid: 'backlog' }),
      card('Processing', num(msgs.processing)),
      card('Dead letters', num(msgs.deadLetter), { kind: msgs.deadLetter ? 'warn' : '', testid: 'dlq-depth' }),
      card('Spool', num(m.spool.pending), { kind: m.spool.pending ? 'warn' : '', title: 'pushes buffered on disk' }),
      card('Push maintenance', maint(health.maintenanceMode), { testid: 'maintenance' }),
      card('Pop maintenance', maint(health.popMaintenanceMode)),
      card('Queues · partitions', `${num(ov.queues)} · ${num(ov.partitions)}`));

    const rows = queues.queues.map((qu) => {
      if (!seen.has(qu.name)) seen.set(qu.name, [t, qu.messages.total]);
      const [t0, n0] = seen.get(qu.name);
      return { ...qu, rate: t > t0 ? Math.max(0, qu.messages.total - n0) / (t - t0) : null };
    }).sort((a, b) => b.messages.pending - a.messages.pending || (b.rate || 0) - (a.rate || 0)).slice(0, 10);
    replace(top, table([
      { label: 'Queue', value: (r) => h('a', { href: `#/queues/${encodeURIComponent(r.name)}` }, r.name) },
      { label: 'Backlog', num: true, value: (r) => num(r.messages.pending) },
      { label: 'Processing', num: true, value: (r) => num(r.messages.processing) },
      { label: 'Dead letters', num: true, value: (r) => num(r.messages.deadLetter) },
      { label: 'In /s', num: true, value: (r) => rate(r.rate) },
      { label: 'Partitions', num: true, value: (r) => num(r.partitions) },
    ], rows, { empty: 'No queue yet: push a message and it shows here.' }));
  });
}
