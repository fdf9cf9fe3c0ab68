-- Every recorded partition definition, with the time left to settle.
SELECT {partition_row} FROM {table}_partitions ORDER BY name
