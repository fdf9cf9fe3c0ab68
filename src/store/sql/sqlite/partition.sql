-- ?1 name. One recorded partition definition.
SELECT name, definition, epoch, MAX(0, settled_at_ms - {now_ms}) AS settling_ms
FROM {table}_partitions WHERE name = ?1
