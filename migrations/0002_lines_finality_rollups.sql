-- tally sink schema, version 2 (docs/DESIGN.md §6): line items per model,
-- finality from the workers' progress records, calendar rollups in a time zone.

-- One model's share of a partial; replaced together with its partial (same
-- `(generation, version)` rule: the sink rewrites a partial's lines exactly when
-- it replaces the partial).
CREATE TABLE tenant_cost_line_partial (
    tenant_id         TEXT          NOT NULL,
    window_end        BIGINT        NOT NULL,
    source_partition  INTEGER       NOT NULL,
    model             TEXT          NOT NULL,
    window_start      BIGINT        NOT NULL,
    cost_pico         NUMERIC(39,0) NOT NULL,
    requests          BIGINT        NOT NULL,
    prompt_tokens     NUMERIC(20,0) NOT NULL,
    completion_tokens NUMERIC(20,0) NOT NULL,
    version           BIGINT        NOT NULL,
    generation        BIGINT        NOT NULL,
    PRIMARY KEY (tenant_id, window_end, source_partition, model)
);
-- The partials sunk before line items: one line of model '' each.
INSERT INTO tenant_cost_line_partial
SELECT tenant_id, window_end, source_partition, '', window_start, cost_pico, requests,
       prompt_tokens, completion_tokens, version, generation
FROM tenant_cost_partial;
CREATE INDEX tenant_cost_line_partial_start ON tenant_cost_line_partial (window_start);
CREATE INDEX tenant_cost_partial_start ON tenant_cost_partial (window_start);
CREATE INDEX tenant_cost_adjustment_start ON tenant_cost_adjustment (window_start);

-- An adjustment's model ('' for adjustments of a tally before line items).
ALTER TABLE tenant_cost_adjustment ADD COLUMN model TEXT NOT NULL DEFAULT '';

-- Each source partition's progress, as each results partition delivered it:
-- every window ending at or before `final_through` is purged there.
CREATE TABLE tally_progress (
    source_partition   INTEGER     NOT NULL,
    results_partition  INTEGER     NOT NULL,
    final_through      BIGINT      NOT NULL,
    watermark          BIGINT      NOT NULL,
    source_partitions  INTEGER     NOT NULL,
    results_partitions INTEGER     NOT NULL,
    generation         BIGINT      NOT NULL,
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source_partition, results_partition)
);

-- Every window ending at or before `final_through` is final: each source partition
-- has purged it, and each results partition has delivered that news after the
-- window's panes. NULL until every (source, results) pair has reported.
CREATE VIEW tally_final AS
WITH p AS (SELECT max(source_partitions) AS s, max(results_partitions) AS r FROM tally_progress)
SELECT CASE WHEN count(*) = max(p.s) * max(p.r) THEN min(t.final_through) END AS final_through
FROM tally_progress t, p
WHERE t.source_partition < p.s AND t.results_partition < p.r;

-- The invoice line per tenant, window and model (partials' lines plus adjustments).
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
       sum(l.cost_pico)::NUMERIC(39,0)                       AS cost_pico,
       (sum(l.cost_pico) / 1000000000000)::NUMERIC(40,12)    AS usd,
       sum(l.requests)::BIGINT                               AS requests,
       sum(l.prompt_tokens)::NUMERIC(20,0)                   AS prompt_tokens,
       sum(l.completion_tokens)::NUMERIC(20,0)               AS completion_tokens,
       coalesce(l.window_end <= (SELECT final_through FROM tally_final), false) AS final
FROM lines l
GROUP BY l.tenant_id, l.window_end, l.model;

-- The invoice line per tenant and window, now with `final` (appended: the
-- columns before it are version 1's).
CREATE OR REPLACE VIEW tenant_cost_minute AS
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
       sum(cost_pico)::NUMERIC(39,0)                         AS cost_pico,
       (sum(cost_pico) / 1000000000000)::NUMERIC(40,12)      AS usd,
       sum(requests)::BIGINT                                 AS requests,
       sum(prompt_tokens)::NUMERIC(20,0)                     AS prompt_tokens,
       sum(completion_tokens)::NUMERIC(20,0)                 AS completion_tokens,
       coalesce(window_end <= (SELECT final_through FROM tally_final), false) AS final
FROM lines
GROUP BY tenant_id, window_end;

-- Calendar rollups: the windows starting in [p_from, p_to) (ms), summed per
-- bucket of `p_unit` ('minute', 'hour', 'day' or 'month') in the IANA zone `p_tz`,
-- per tenant (only `p_tenant`'s unless NULL), and per model when `p_by_model`
-- (else `model` is NULL). A bucket's
-- bounds are clipped to [p_from, p_to). `final`: the bucket's end is final.
-- `aligned` is false when a window crosses a bucket boundary (the window size
-- does not divide the bucket in that zone's offsets): the caller must refuse.
CREATE FUNCTION tally_usage(p_unit TEXT, p_tz TEXT, p_from BIGINT, p_to BIGINT, p_by_model BOOLEAN,
                            p_tenant TEXT)
RETURNS TABLE (window_start BIGINT, window_end BIGINT, tenant_id TEXT, model TEXT,
               cost_pico NUMERIC(39,0), requests BIGINT, prompt_tokens NUMERIC(20,0),
               completion_tokens NUMERIC(20,0), final BOOLEAN, aligned BOOLEAN)
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
           sum(cost_pico)::NUMERIC(39,0)          AS cost_pico,
           sum(requests)::BIGINT                  AS requests,
           sum(prompt_tokens)::NUMERIC(20,0)      AS prompt_tokens,
           sum(completion_tokens)::NUMERIC(20,0)  AS completion_tokens,
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
