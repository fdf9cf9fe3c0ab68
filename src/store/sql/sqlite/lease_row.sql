role, holder_id, holder_address, token,
       CASE WHEN holder_id IS NOT NULL AND expires_at_ms > now.ms
            THEN expires_at_ms - now.ms ELSE 0 END AS remaining_ms
