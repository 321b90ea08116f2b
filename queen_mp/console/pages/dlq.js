// Dead letters (/api/v1/dlq): filter by queue, group, partition and failure time, see the
// error, attempts and payload,
// retry (replay to the tail of the partition) or delete one row, or every row the filter
// matches, server side (POST /api/v1/dlq/retry, DELETE /api/v1/dlq), not only the page shown.
import { act, api, badge, button, h, num, payloadView, q, replace, seg, table, toast, when } from '../lib.js';

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
  const partition = h('input', { type: 'search', name: 'partition', placeholder: 'partition', 'aria-label': 'Partition' });
  const since = h('input', { type: 'datetime-local', name: 'from', 'aria-label': 'Failed from' });
  const until = h('input', { type: 'datetime-local', name: 'to', 'aria-label': 'Failed until' });
  const iso = (input) => (Number.isNaN(new Date(input.value).getTime()) ? '' : new Date(input.value).toISOString());
  // the listing's filters, which the by-filter actions take as they are ('' = none)
  const filter = () => ({ queue: queue.value, consumerGroup: group.value.trim(), partition: partition.value.trim(),
    from: iso(since), to: iso(until) });
  const list = h('div');
  const pager = h('div.pager');
  const bulk = h('div.actions');
  let offset = 0;
  let total = 0;
  // Every row the filter matches, a bounded batch per call, until none is left or a call
  // does nothing (rows whose partition is gone stay: the broker skips them).
  const every = (label, path, method, count) => async (btn) => {
    const f = filter();
    const any = Object.values(f).some((v) => v);
    if (!window.confirm(`${label} all ${num(total)} dead letters ${any ? 'matching this filter' : 'of every queue'}?`)) return;
    const n = await act(btn, `${label}: done`, async () => {
      let done = 0;
      for (let i = 0; i < BULK_CALLS; i += 1) {
        const out = await api(`${path}${q({ ...f, all: any ? '' : 'true', limit: BULK_LIMIT })}`, { method });
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
    payloadView(r),
    h('p.muted', `message id ${r.id} · producer ${r.producerSub || '—'} · created ${r.createdAt}`)));

  let latest = 0; // the newest load: an older answer arriving after it is dropped
  async function load() {
    const mine = ++latest;
    const page = await api(`/api/v1/dlq${q({ ...filter(), limit: PAGE, offset })}`);
    if (mine !== latest) return;
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
  for (const input of [queue, group, partition, since, until]) input.addEventListener('change', refresh);
  main.append(h('h1', 'Dead letters'), h('div.toolbar', queue, group, partition,
    h('label.muted', 'failed from ', since), h('label.muted', 'until ', until),
    h('button', { type: 'button', on: { click: refresh } }, 'Refresh')), list, pager, bulk);
  await load();
}
