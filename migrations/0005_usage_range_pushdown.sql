-- tally sink schema, version 5 (docs/DESIGN.md §6): the usage functions read only the
-- windows they sum.
--
-- A view's `window_start` is `min(window_start)` of its rows, an aggregate, so
-- `window_start >= p_from` cannot reach the tables under `tenant_cost_minute`,
-- `tenant_cost_minute_line` and `tenant_cost_minute_quantity`: PostgreSQL summed every
-- window ever stored and only then kept those of the range (a sequential scan of the
-- partials for every query of all tenants, and every window of a tenant for one).
-- `window_end > p_from` is implied (a stored window ends after it starts, DESIGN §6)
-- and names a grouping column, so it reaches the tables: a tenant's windows are read
-- from the primary key's range `(tenant_id, window_end > p_from)`, and a query of all
-- tenants aggregates only the windows ending after `p_from`. The answers are the same.
-- Signatures and result columns are unchanged (CREATE OR REPLACE).

CREATE OR REPLACE FUNCTION tally_usage(p_unit TEXT, p_tz TEXT, p_from BIGINT, p_to BIGINT, p_by_model BOOLEAN,
                            p_tenant TEXT)
RETURNS TABLE (window_start BIGINT, window_end BIGINT, tenant_id TEXT, model TEXT,
               cost_pico NUMERIC, requests NUMERIC, prompt_tokens NUMERIC,
               completion_tokens NUMERIC, final BOOLEAN, aligned BOOLEAN)
LANGUAGE sql STABLE AS $$
WITH src AS (
    SELECT m.tenant_id, m.model, m.window_start, m.window_end, m.cost_pico, m.requests,
           m.prompt_tokens, m.completion_tokens
    FROM tenant_cost_minute_line m
    WHERE p_by_model AND m.window_start >= p_from AND m.window_start < p_to AND m.window_end > p_from
      AND (p_tenant IS NULL OR m.tenant_id = p_tenant)
    UNION ALL
    SELECT m.tenant_id, NULL, m.window_start, m.window_end, m.cost_pico, m.requests,
           m.prompt_tokens, m.completion_tokens
    FROM tenant_cost_minute m
    WHERE NOT p_by_model AND m.window_start >= p_from AND m.window_start < p_to AND m.window_end > p_from
      AND (p_tenant IS NULL OR m.tenant_id = p_tenant)
),
bucketed AS (
    SELECT s.*, b.start_ts,
           CASE WHEN p_unit IN ('minute', 'hour') THEN b.start_ts + ('1 ' || p_unit)::INTERVAL
                ELSE ((b.start_ts AT TIME ZONE p_tz) + ('1 ' || p_unit)::INTERVAL) AT TIME ZONE p_tz
           END AS end_ts
    FROM src s,
         LATERAL (SELECT date_trunc(p_unit, TIMESTAMPTZ 'epoch' + s.window_start * INTERVAL '1 millisecond', p_tz) AS start_ts) b
),
summed AS (
    SELECT (extract(epoch FROM start_ts) * 1000)::BIGINT AS b_start,
           (extract(epoch FROM end_ts) * 1000)::BIGINT   AS b_end,
           tenant_id, model,
           sum(cost_pico)          AS cost_pico,
           sum(requests)           AS requests,
           sum(prompt_tokens)      AS prompt_tokens,
           sum(completion_tokens)  AS completion_tokens,
           bool_and(window_end <= (extract(epoch FROM end_ts) * 1000)::BIGINT) AS aligned
    FROM bucketed
    GROUP BY start_ts, end_ts, tenant_id, model
)
SELECT greatest(b_start, p_from), least(b_end, p_to), tenant_id, model, cost_pico, requests,
       prompt_tokens, completion_tokens,
       coalesce(least(b_end, p_to) <= (SELECT final_through FROM tally_final), false),
       aligned
FROM summed
$$;

CREATE OR REPLACE FUNCTION tally_usage_quantity(p_unit TEXT, p_tz TEXT, p_from BIGINT, p_to BIGINT,
                                     p_tenant TEXT)
RETURNS TABLE (window_start BIGINT, window_end BIGINT, tenant_id TEXT, model TEXT,
               variant TEXT, plan TEXT, quantity TEXT, count NUMERIC, cost_pico NUMERIC,
               final BOOLEAN, aligned BOOLEAN)
LANGUAGE sql STABLE AS $$
WITH bucketed AS (
    SELECT m.*, b.start_ts,
           CASE WHEN p_unit IN ('minute', 'hour') THEN b.start_ts + ('1 ' || p_unit)::INTERVAL
                ELSE ((b.start_ts AT TIME ZONE p_tz) + ('1 ' || p_unit)::INTERVAL) AT TIME ZONE p_tz
           END AS end_ts
    FROM tenant_cost_minute_quantity m,
         LATERAL (SELECT date_trunc(p_unit, TIMESTAMPTZ 'epoch' + m.window_start * INTERVAL '1 millisecond', p_tz) AS start_ts) b
    WHERE m.window_start >= p_from AND m.window_start < p_to AND m.window_end > p_from
      AND (p_tenant IS NULL OR m.tenant_id = p_tenant)
),
summed AS (
    SELECT (extract(epoch FROM start_ts) * 1000)::BIGINT AS b_start,
           (extract(epoch FROM end_ts) * 1000)::BIGINT   AS b_end,
           tenant_id, model, variant, plan, quantity,
           sum(count)      AS count,
           sum(cost_pico)  AS cost_pico,
           bool_and(window_end <= (extract(epoch FROM end_ts) * 1000)::BIGINT) AS aligned
    FROM bucketed
    GROUP BY start_ts, end_ts, tenant_id, model, variant, plan, quantity
)
SELECT greatest(b_start, p_from), least(b_end, p_to), tenant_id, model, variant, plan, quantity,
       count, cost_pico,
       coalesce(least(b_end, p_to) <= (SELECT final_through FROM tally_final), false),
       aligned
FROM summed
$$;
