// Traces (docs/api.md 2.13): the names consumers recorded events under (/api/v1/traces/names),
// the events of one name (/api/v1/traces/by-name/{name}), or of one message
// (/api/v1/traces/{partitionId}/{transactionId}).
import { api, h, num, q, replace, seg, table, toast, when } from '../lib.js';

const events = (traces, byName) => table([
  { label: 'When', value: (t) => when(t.createdAt) },
  ...(byName ? [{ label: 'Queue', value: (t) => `${t.queue}${t.partition ? ` / ${t.partition}` : ''}` }] : []),
  { label: 'Message', value: (t) => h('code', t.transactionId) },
  { label: 'Group', value: (t) => (t.consumerGroup === '__QUEUE_MODE__' ? 'queue mode' : t.consumerGroup) },
  { label: 'Event', value: (t) => t.eventType },
  { label: 'Names', value: (t) => t.traceNames.join(', ') },
  { label: 'Data', value: (t) => h('pre.payload', JSON.stringify(t.data, null, 2)) },
], traces, { empty: 'No event recorded.', rowAttrs: () => ({ dataset: { testid: 'trace' } }) });

export async function render(main, args) {
  const names = h('div');
  const shown = h('div');
  const pid = h('input', { type: 'text', name: 'partitionId', placeholder: 'partition id', 'aria-label': 'Partition id', inputmode: 'numeric' });
  const txn = h('input', { type: 'search', name: 'transactionId', placeholder: 'transactionId', 'aria-label': 'Transaction id' });
  const byMessage = h('form.toolbar', { on: { submit: async (e) => {
    e.preventDefault();
    if (!pid.value.trim() || !txn.value.trim()) return;
    try {
      const page = await api(`/api/v1/traces/${seg(pid.value.trim())}/${seg(txn.value.trim())}`);
      replace(shown, h('h2', 'Message ', h('code', txn.value.trim())),
        page.truncated ? h('p.muted', `the first ${num(page.count)} events`) : null, events(page.traces, false));
    } catch (err) {
      toast(err.message, 'error');
    }
  } } }, pid, txn, h('button', { type: 'submit' }, 'Show the message\'s events'));

  const showName = async (name) => {
    const page = await api(`/api/v1/traces/by-name/${seg(name)}${q({ limit: 200 })}`);
    replace(shown, h('h2', 'Trace ', h('code', name)),
      h('p.muted', `${num(page.total)} events${page.total > page.count ? `, the first ${num(page.count)} shown` : ''}`),
      events(page.traces, true));
  };
  main.append(h('h1', 'Traces'),
    h('p.muted', 'Events consumers recorded on messages (msg.trace in the clients), by name or by message.'),
    byMessage, h('h2', 'Names'), names, shown);
  const list = await api(`/api/v1/traces/names${q({ limit: 200 })}`);
  replace(names, table([
    { label: 'Name', value: (n) => h('button.link', { type: 'button', on: { click: () => showName(n.traceName) } }, n.traceName) },
    { label: 'Events', num: true, value: (n) => num(n.traceCount) },
    { label: 'Messages', num: true, value: (n) => num(n.messageCount) },
    { label: 'Last seen', value: (n) => when(n.lastSeen) },
  ], list.traceNames, { empty: 'No trace recorded yet.' }));
  if (args[0]) await showName(args[0]);
}
