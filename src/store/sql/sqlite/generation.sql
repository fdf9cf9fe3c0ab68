SELECT generation FROM {table}_changes WHERE id = 1
