// Dead letters (/api/v1/dlq): filter by queue and group, see the error, attempts and payload,
// retry (replay to the tail of the partition) or delete one row, or every row the filter
// matches, server side (POST /api/v1/dlq/retry, DELETE /api/v1/dlq), not only the page shown.
import { act, api, badge, button, h, num, q, replace, seg, table, toast, when } from '../lib.js';

const PAGE = 100;
// rows one by-filter call may act on (the API's most), and calls one click makes at most
const BULK_LIMIT = 1000;
const BULK_CALLS = 100;

const rowPath = (r) => `/api/v1/messages/${seg(r.partitionId)}/${seg(r.transactionId)}${q({ consumerGroup: r.consumerGroup })}`;
const retryPath = (r) => `/api/v1/messages/${seg(r.partitionId)}/${seg(r.transactionId)}/retry${q({ consumerGroup: r.consumerGroup })}`;

export async function render(main, args) {
  const queues = await api('/api/v1/resources/queues?limit=1000');
  const queue = h('select', { name: 'queue', 'aria-label': 'Queue' }, h('option', { value: '' }, 'every queue'),
    queues.queues.filter((x) => x.messages.deadLetter > 0 || x.name === args[0])
      .map((x) => h('option', { value: x.name }, `${x.name} (${x.messages.deadLetter})`)));
  if (args[0]) queue.value = args[0];
  const group = h('input', { type: 'search', name: 'consumerGroup', placeholder: 'consumer group', 'aria-label': 'Consumer group' });
  const list = h('div');
  const pager = h('div.pager');
  const bulk = h('div.actions');
  let offset = 0;
  let total = 0;
  // Every row the filter matches, a bounded batch per call, until none is left or a call
  // does nothing (rows whose partition is gone stay: the broker skips them).
  const every = (label, path, method, count) => async (btn) => {
    const filter = { queue: queue.value, consumerGroup: group.value.trim() };
    const scope = filter.queue || filter.consumerGroup ? 'matching this filter' : 'of every queue';
    if (!window.confirm(`${label} all ${num(total)} dead letters ${scope}?`)) return;
    const n = await act(btn, `${label}: done`, async () => {
      let done = 0;
      for (let i = 0; i < BULK_CALLS; i += 1) {
        const out = await api(`${path}${q({ ...filter, all: filter.queue || filter.consumerGroup ? '' : 'true', limit: BULK_LIMIT })}`, { method });
        done += count(out);
        if (!out.remaining || !count(out)) break;
      }
      offset = 0;
      await load();
      return done;
    });
    if (n !== undefined) toast(`${label}: ${num(n)} dead letters`);
  };
  replace(bulk, button('read-write', 'Retry all matching', every('Retry', '/api/v1/dlq/retry', 'POST', (o) => o.replayed)),
    button('read-write', 'Delete all matching', every('Delete', '/api/v1/dlq', 'DELETE', (o) => o.deleted), 'danger'));

  const detail = (r) => h('tr.detail', h('td', { colSpan: 8 },
    h('pre.payload', JSON.stringify(r.data, null, 2)),
    h('p.muted', `message id ${r.id} · producer ${r.producerSub || '—'} · created ${r.createdAt}`)));

  async function load() {
    const page = await api(`/api/v1/dlq${q({ queue: queue.value, consumerGroup: group.value.trim(), limit: PAGE, offset })}`);
    const rows = page.messages;
    total = page.total;
    const t = table([
      { label: 'Queue', value: (r) => h('a', { href: `#/queues/${encodeURIComponent(r.queue)}` }, r.queue) },
      { label: 'Partition', value: (r) => r.partition },
      { label: 'Offset', num: true, value: (r) => num(r.offset) },
      { label: 'Group', value: (r) => (r.consumerGroup === '__QUEUE_MODE__' ? 'queue mode' : r.consumerGroup) },
      { label: 'Error', value: (r) => h('span.error-text', r.errorMessage || '—') },
      { label: 'Attempts', num: true, value: (r) => num(r.retryCount + 1) },
      { label: 'Failed', value: (r) => when(r.failedAt) },
      { label: '', value: (r) => h('span.actions',
        h('button.link', { type: 'button', on: { click: (e) => {
          const tr = e.currentTarget.closest('tr');
          if (tr.nextSibling && tr.nextSibling.classList.contains('detail')) tr.nextSibling.remove();
          else tr.after(detail(r));
        } } }, 'Payload'),
        button('read-write', 'Retry', (btn) => act(btn, 'Dead letter replayed', async () => {
          await api(retryPath(r), { method: 'POST' });
          await load();
        })),
        button('read-write', 'Delete', (btn) => {
          if (!window.confirm('Delete this dead letter? The log keeps the message.')) return;
          act(btn, 'Dead letter deleted', async () => {
            await api(rowPath(r), { method: 'DELETE' });
            await load();
          });
        }, 'danger')) },
    ], rows, { empty: 'No dead letter.', rowAttrs: (r) => ({ dataset: { testid: 'dlq-row', txn: r.transactionId } }) });
    replace(list, t);
    replace(pager, `${num(page.total)} dead letters `, page.total ? badge(`page ${offset / PAGE + 1}`) : '',
      h('button', { type: 'button', disabled: offset === 0, on: { click: () => { offset = Math.max(0, offset - PAGE); load(); } } }, 'Previous'),
      h('button', { type: 'button', disabled: offset + PAGE >= page.total, on: { click: () => { offset += PAGE; load(); } } }, 'Next'));
    bulk.hidden = !rows.length;
  }
  const refresh = () => { offset = 0; load().catch((e) => toast(e.message, 'error')); };
  queue.addEventListener('change', refresh);
  group.addEventListener('change', refresh);
  main.append(h('h1', 'Dead letters'), h('div.toolbar', queue, group,
    h('button', { type: 'button', on: { click: refresh } }, 'Refresh')), list, pager, bulk);
  await load();
}
