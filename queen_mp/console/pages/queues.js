// Queues: every queue of the tenant (/api/v1/resources/queues), searchable and sortable by
// depth, traffic (messages in per second, measured between polls), processing, DLQ and lag:
// the most any consumer group of the queue is behind, in messages and in seconds
// (/api/v1/consumer-groups, one row per group and queue).
import { api, duration, h, num, rate, replace, table, when } from '../lib.js';

const POLL_MS = 3000;

export async function render(main, _args, life) {
  const search = h('input', { type: 'search', placeholder: 'Search queues', 'aria-label': 'Search queues', id: 'queue-search' });
  const list = h('div');
  main.append(h('h1', 'Queues'), h('div.toolbar', search), list);
  const columns = [
    { label: 'Queue', sort: (r) => r.name, value: (r) => h('a', { href: `#/queues/${encodeURIComponent(r.name)}` }, r.name) },
    { label: 'Namespace', sort: (r) => r.namespace || '', value: (r) => r.namespace || '—' },
    { label: 'Partitions', num: true, sort: (r) => r.partitions, value: (r) => num(r.partitions) },
    { label: 'Backlog', num: true, sort: (r) => r.messages.pending, value: (r) => num(r.messages.pending) },
    { label: 'Processing', num: true, sort: (r) => r.messages.processing, value: (r) => num(r.messages.processing) },
    { label: 'Dead letters', num: true, sort: (r) => r.messages.deadLetter, value: (r) => num(r.messages.deadLetter) },
    { label: 'Lag', num: true, sort: (r) => r.lag ?? -1, value: (r) => num(r.lag) },
    { label: 'Time lag', num: true, sort: (r) => r.timeLag ?? -1, value: (r) => duration(r.timeLag) },
    { label: 'Retained', num: true, sort: (r) => r.messages.total, value: (r) => num(r.messages.total) },
    { label: 'In /s', num: true, sort: (r) => r.rate ?? -1, value: (r) => rate(r.rate) },
    { label: 'Created', sort: (r) => r.createdAt, value: (r) => when(r.createdAt) },
  ];
  let sortKey = 3;
  let sortDesc = true;
  let rows = [];
  const first = new Map();
  const draw = () => {
    const needle = search.value.trim().toLowerCase();
    const key = columns[sortKey].sort;
    const shown = rows.filter((r) => r.name.toLowerCase().includes(needle))
      .sort((a, b) => {
        const x = key(a);
        const y = key(b);
        const c = x < y ? -1 : x > y ? 1 : 0;
        return sortDesc ? -c : c;
      });
    replace(list, table(columns, shown, {
      sortKey, sortDesc,
      onSort: (i) => { sortDesc = sortKey === i ? !sortDesc : i !== 0; sortKey = i; draw(); },
      empty: rows.length ? 'No queue matches.' : 'No queue yet.',
      rowAttrs: (r) => ({ dataset: { queue: r.name } }),
    }));
  };
  search.addEventListener('input', draw);
  life.every(POLL_MS, async () => {
    const t = performance.now() / 1000;
    const [page, groups] = await Promise.all([api('/api/v1/resources/queues?limit=1000'), api('/api/v1/consumer-groups')]);
    const lag = new Map(); // queue -> [messages, seconds], the most of its groups
    for (const g of groups) {
      const [m, s] = lag.get(g.queueName) || [0, 0];
      lag.set(g.queueName, [Math.max(m, g.totalLag || 0), Math.max(s, g.maxTimeLag || 0)]);
    }
    rows = page.queues.map((qu) => {
      if (!first.has(qu.name)) first.set(qu.name, [t, qu.messages.total]);
      const [t0, n0] = first.get(qu.name);
      const [lagN, lagS] = lag.get(qu.name) || [null, null];
      return { ...qu, lag: lagN, timeLag: lagS, rate: t > t0 ? Math.max(0, qu.messages.total - n0) / (t - t0) : null };
    });
    draw();
  });
}
