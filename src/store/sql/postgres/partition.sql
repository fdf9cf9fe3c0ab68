-- $1 name. One recorded partition definition.
SELECT {partition_row} FROM {table}_partitions WHERE name = $1
