-- Every recorded partition definition, with the time left to settle.
SELECT name, definition, epoch, MAX(0, settled_at_ms - {now_ms}) AS settling_ms
FROM {table}_partitions ORDER BY name
