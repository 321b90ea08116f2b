-- 018_retention_enabled.sql: retentionEnabled switched on for the queues whose retention acted
-- before the switch was honoured (issue 27).
--
-- Tables: queen.queues (retention_enabled set to true where retention_seconds > 0 or
--   completed_retention_seconds > 0; no other column, updated_at included, changes).
--
-- Why: retention_partition_v2 and retention_partitions_v2 (functions/retention.sql) apply
-- retentionSeconds and completedRetentionSeconds only while retentionEnabled is true, as
-- upstream's retention sweeps do; until now the two values acted whatever the switch said (it was
-- stored and echoed only). A queue configured with seconds and without the switch would
-- silently stop being trimmed by the upgrade, and its log would grow without the operator
-- knowing: this keeps the retention it had. Such a queue that should keep everything, as it
-- would upstream, takes `retentionEnabled: false` through POST /api/v1/configure after the
-- upgrade. Queues configured from now on need `retentionEnabled: true` for their retention
-- seconds to act (docs/api.md 4); maxWaitTimeSeconds acts whatever the switch says.

UPDATE queen.queues
SET retention_enabled = true
WHERE NOT retention_enabled
  AND (retention_seconds > 0 OR completed_retention_seconds > 0);
