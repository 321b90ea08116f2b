// Overview: live rates, latency, fusion and spool (from /metrics/prometheus, differenced
// between polls), backlog and DLQ depth (/api/v1/resources/overview), maintenance (/health), and
// the queues with the most backlog or traffic (/api/v1/resources/queues).
// PERF(console): the counters come from the Prometheus text only; GET /metrics renders that same
// text and parses it again on the broker, which doubled the broker's CPU per poll.
import { LineChart } from '../chart.js';
import { api, badge, card, h, num, promTotals, rate, replace, section, table } from '../lib.js';

const POLL_MS = 2000;
const LATENCY = 'queen_http_request_duration_seconds';
const PUSHED = 'queen_batch_items_fired_total';
const POPPED = 'queen_messages_popped_total';
const ACKED = 'queen_messages_acked_total';
const COMMITS = 'queen_fusion_commits_total';
const SEGMENTS = 'queen_fusion_segments_total';
const SPOOL = 'queen_spool_pending';

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
    const [prom, health, ov, queues] = await Promise.all([
      api('/metrics/prometheus', { text: true }), api('/health'),
      api('/api/v1/resources/overview'), api('/api/v1/resources/queues?limit=1000')]);
    const p = promTotals(prom, [LATENCY, PUSHED, POPPED, ACKED, COMMITS, SEGMENTS, SPOOL]);
    const v = (name) => p[name] || 0;
    const now = { t, p };
    let push = null;
    let pop = null;
    let ack = null;
    let mean = null;
    let p99 = null;
    if (prev) {
      const dt = Math.max(0.001, t - prev.t);
      const d = (name) => Math.max(0, v(name) - (prev.p[name] || 0)) / dt;
      push = d(PUSHED);
      pop = d(POPPED);
      ack = d(ACKED);
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
      card('Segments / commit', v(COMMITS) ? num(v(SEGMENTS) / v(COMMITS), 2) : '—', { title: 'fusion since start: segments written per PostgreSQL commit' }),
      card('Backlog', num(msgs.pending), { testid: 'backlog' }),
      card('Processing', num(msgs.processing)),
      card('Dead letters', num(msgs.deadLetter), { kind: msgs.deadLetter ? 'warn' : '', testid: 'dlq-depth' }),
      card('Spool', num(v(SPOOL)), { kind: v(SPOOL) ? 'warn' : '', title: 'pushes buffered on disk' }),
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
