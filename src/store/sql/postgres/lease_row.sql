role, holder_id, holder_address, token,
       CASE WHEN holder_id IS NOT NULL AND expires_at > clock_timestamp()
            THEN ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
            ELSE 0 END AS remaining_ms
