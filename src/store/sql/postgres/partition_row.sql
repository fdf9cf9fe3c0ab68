name, definition, epoch,
    GREATEST(0, ceil(extract(epoch FROM settled_at - clock_timestamp()) * 1000))::bigint AS settling_ms
