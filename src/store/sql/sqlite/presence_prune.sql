DELETE FROM {table}_members WHERE expires_at_ms < {now_ms} - 3600000
