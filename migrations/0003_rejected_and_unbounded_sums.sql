-- tally sink schema, version 3 (docs/DESIGN.md §6): the records the sink rejects, and
-- sums that hold any total.

-- Result records the sink would not store (src/sink/check.rs, or PostgreSQL refusing
-- their data), with why and their bytes; written in the transaction that commits
-- their offsets, so every offset of the results topic is either applied or here.
CREATE TABLE sink_rejected (
    topic         TEXT        NOT NULL,
    partition     INTEGER     NOT NULL,
    record_offset BIGINT      NOT NULL,
    reason        TEXT        NOT NULL,
    payload       BYTEA       NOT NULL,
    rejected_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, record_offset)
);

-- The views and the rollup sum without a precision: a window holds up to 2^64 - 1
-- tokens and 2^128 - 1 pico-USD, and a month or a year of them, over any number of
-- partitions, overflows NUMERIC(20,0) and NUMERIC(39,0) (and `requests` BIGINT). Money
-- in USD is `cost_pico * 10^-12`: a product of numerics is exact, a quotient is
-- rounded to a chosen scale. The columns keep their names and order; only their types
-- widen. A view a user built on these must be dropped first (this migration then says
-- which): widening a view's column needs DROP VIEW.
DROP FUNCTION tally_usage(TEXT, TEXT, BIGINT, BIGINT, BOOLEAN, TEXT);
DROP VIEW tenant_cost_minute_line;
DROP VIEW tenant_cost_minute;

-- The pairs to wait for, counted in BIGINT: INTEGER × INTEGER overflowed for one
-- progress record naming 2^31 - 1 partitions, and the error failed every view with a
-- `final` column (the sink now rejects such a record; this holds whatever is stored).
CREATE OR REPLACE VIEW tally_final AS
WITH p AS (SELECT max(source_partitions) AS s, max(results_partitions) AS r FROM tally_progress)
SELECT CASE WHEN count(*) = max(p.s)::BIGINT * max(p.r) THEN min(t.final_through) END AS final_through
FROM tally_progress t, p
WHERE t.source_partition < p.s AND t.results_partition < p.r;

CREATE VIEW tenant_cost_minute AS
WITH lines AS (
    SELECT tenant_id, window_start, window_end, cost_pico, requests, prompt_tokens, completion_tokens
    FROM tenant_cost_partial
    UNION ALL
    SELECT tenant_id, window_start, window_end, cost_pico, 1, prompt_tokens, completion_tokens
    FROM tenant_cost_adjustment
)
SELECT tenant_id,
       window_end,
       min(window_start)                                     AS window_start,
       sum(cost_pico)                                        AS cost_pico,
       sum(cost_pico) * 0.000000000001                       AS usd,
       sum(requests)                                         AS requests,
       sum(prompt_tokens)                                    AS prompt_tokens,
       sum(completion_tokens)                                AS completion_tokens,
       coalesce(window_end <= (SELECT final_through FROM tally_final), false) AS final
FROM lines
GROUP BY tenant_id, window_end;

CREATE VIEW tenant_cost_minute_line AS
WITH lines AS (
    -- Only the lines of the partial's current (generation, version).
    SELECT l.tenant_id, l.window_start, l.window_end, l.model, l.cost_pico, l.requests,
           l.prompt_tokens, l.completion_tokens
    FROM tenant_cost_line_partial l
    JOIN tenant_cost_partial p USING (tenant_id, window_end, source_partition, generation, version)
    UNION ALL
    SELECT tenant_id, window_start, window_end, model, cost_pico, 1, prompt_tokens, completion_tokens
    FROM tenant_cost_adjustment
)
SELECT l.tenant_id,
       l.window_end,
       min(l.window_start)                                   AS window_start,
       l.model,
       sum(l.cost_pico)                                      AS cost_pico,
       sum(l.cost_pico) * 0.000000000001                     AS usd,
       sum(l.requests)                                       AS requests,
       sum(l.prompt_tokens)                                  AS prompt_tokens,
       sum(l.completion_tokens)                              AS completion_tokens,
       coalesce(l.window_end <= (SELECT final_through FROM tally_final), false) AS final
FROM lines l
GROUP BY l.tenant_id, l.window_end, l.model;

-- As in version 2, with unbounded sums (see above).
CREATE FUNCTION tally_usage(p_unit TEXT, p_tz TEXT, p_from BIGINT, p_to BIGINT, p_by_model BOOLEAN,
                            p_tenant TEXT)
RETURNS TABLE (window_start BIGINT, window_end BIGINT, tenant_id TEXT, model TEXT,
               cost_pico NUMERIC, requests NUMERIC, prompt_tokens NUMERIC,
               completion_tokens NUMERIC, final BOOLEAN, aligned BOOLEAN)
LANGUAGE sql STABLE AS $$
WITH src AS (
    SELECT m.tenant_id, m.model, m.window_start, m.window_end, m.cost_pico, m.requests,
           m.prompt_tokens, m.completion_tokens
    FROM tenant_cost_minute_line m
    WHERE p_by_model AND m.window_start >= p_from AND m.window_start < p_to
      AND (p_tenant IS NULL OR m.tenant_id = p_tenant)
    UNION ALL
    SELECT m.tenant_id, NULL, m.window_start, m.window_end, m.cost_pico, m.requests,
           m.prompt_tokens, m.completion_tokens
    FROM tenant_cost_minute m
    WHERE NOT p_by_model AND m.window_start >= p_from AND m.window_start < p_to
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
