// System: the instance (/health), its processes and PostgreSQL (/api/v1/status/system), its
// pool and requests (/metrics), the disk spool (/api/v1/status/buffers), and the maintenance
// switches (admin: /api/v1/system/maintenance*).
import { act, api, badge, button, bytes, duration, h, num, replace, section, table } from '../lib.js';

const POLL_MS = 3000;

const kv = (pairs) => h('table.kv', h('tbody', pairs.map(([k, v]) => h('tr', h('th', k), h('td', v)))));

export async function render(main, _args, life) {
  const instance = h('div');
  const processes = h('div');
  const postgres = h('div');
  const maintenance = h('div');
  const spool = h('div');
  main.append(h('h1', 'System'), h('div.columns', section('Instance', instance), section('PostgreSQL', postgres)),
    section('Processes', processes), section('Maintenance', maintenance), section('Disk spool', spool));
  const load = async () => {
    const [health, m, buf, sys] = await Promise.all([api('/health'), api('/metrics'),
      api('/api/v1/status/buffers'), api('/api/v1/status/system')]);
    if (!life.alive) return;
    const alive = (on) => badge(on ? 'alive' : 'down', on ? 'ok' : 'warn');
    replace(processes, table([
      { label: 'Process', value: (p) => p.kind },
      { label: 'Pid', num: true, value: (p) => String(p.pid || '—') },
      { label: 'State', value: (p) => alive(p.alive) },
      { label: 'Restarts', num: true, value: (p) => num(p.restarts) },
      { label: 'Note', value: (p) => p.note || '' },
    ], [
      { kind: 'supervisor', pid: sys.supervisorPid, alive: true, restarts: 0, note: `instance ${sys.instance}` },
      ...sys.frontWorkers.map((w) => ({ kind: `front worker ${w.slot}`, pid: w.pid, alive: w.alive, restarts: w.restarts,
        note: w.pid === sys.answeredBy.pid ? 'answered this page' : '' })),
      ...sys.shards.map((x) => ({ kind: `shard ${x.index}`, pid: x.pid, alive: x.alive, restarts: x.restarts,
        note: x.lastBeatMsAgo === null ? 'no owner' : `beat ${num(x.lastBeatMsAgo)} ms ago` })),
    ], { rowAttrs: (p) => ({ dataset: { testid: 'process' } }) }));
    const pg = sys.postgres;
    const c = pg.connections;
    replace(postgres, kv([
      ['Version', pg.version], ['Role', pg.inRecovery ? 'standby (read-only)' : 'primary'],
      ['Database', `${pg.database} · ${bytes(pg.databaseBytes)}`],
      ['Connections', `${num(c.total)} of ${num(pg.maxConnections)} · ${num(c.queenMp)} queen-mp · ${num(c.active)} active · ${
        num(c.idleInTransaction)} idle in transaction`],
      ['Replication', pg.replication.length ? pg.replication.map((r) => `${r.name || r.clientAddr} ${r.state} ${r.syncState}${
        r.replayLagSeconds === null ? '' : ` lag ${num(r.replayLagSeconds, 1)} s`}`).join(', ') : 'no replica'],
      ['Up since', pg.startedAt],
    ]));
    replace(instance, kv([
      ['Status', badge(health.status, health.status === 'healthy' ? 'ok' : 'warn')],
      ['Instance', health.instance], ['Version', health.version], ['Uptime', duration(health.uptimeSeconds)],
      ['Shards alive', `${health.shards.alive} of ${health.shards.total}`],
      ['Answered by front worker', String(health.workerId)],
      ['PostgreSQL', `${health.database}${health.databaseHost ? ` · ${health.databaseHost}` : ''}${
        health.databaseWritable === false ? ' · read-only (standby)' : ''}`],
      ['Pool (this worker)', `${num(m.database.poolSize)} connections · ${num(m.database.idleConnections)} idle · ${
        num(m.database.waitingRequests)} waiting`],
      ['Requests', `${num(m.requests.total)} since start`],
      ['Parked pops', num(m.parkedPops)],
      ['Fusion', `${num(m.fusion.commits)} commits · ${num(m.fusion.segmentsPerCommit, 2)} segments per commit`],
      health.error ? ['Problem', h('span.error-text', health.error)] : null,
    ].filter(Boolean)));
    const toggle = (label, path, on) => h('div.switch', { dataset: { testid: path.endsWith('/pop') ? 'pop-maintenance' : 'push-maintenance' } },
      h('span', label, ' ', on ? badge('on', 'warn') : badge('off', 'ok')),
      button('admin', on ? 'Turn off' : 'Turn on', (btn) => act(btn, `${label} ${on ? 'off' : 'on'}`, async () => {
        await api(path, { method: 'POST', body: { enabled: !on } });
        await load();
      })));
    replace(maintenance,
      h('p.muted', 'Push maintenance writes pushes to the disk spool (answered "buffered") and replays them when turned off; pop maintenance makes pops claim nothing.'),
      toggle('Push maintenance', '/api/v1/system/maintenance', health.maintenanceMode),
      toggle('Pop maintenance', '/api/v1/system/maintenance/pop', health.popMaintenanceMode));
    replace(spool, kv([
      ['Pending', num(buf.pending)], ['Failed for good', num(buf.failed)], ['Files', `${num(buf.files)} · ${bytes(buf.bytes)}`],
      ['Draining', buf.draining ? 'yes' : 'no'], ['Last drain', buf.lastDrainAt || '—'],
      ['Database healthy', buf.dbHealthy ? 'yes' : 'no'],
    ]), h('div.actions', button('admin', 'Drain now', (btn) => act(btn, 'Drain started', async () => {
      await api('/api/v1/system/spool/drain', { method: 'POST', body: {} });
      await load();
    }))));
  };
  life.every(POLL_MS, load);
}
