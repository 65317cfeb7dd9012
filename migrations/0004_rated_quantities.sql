-- tally sink schema, version 4 (docs/DESIGN.md §6): a rating's line items (§3.2) —
-- per (model, variant, plan) and per quantity billed, for partials and adjustments.
-- Today's pricing writes none of these rows; its lines stay in tenant_cost_line_partial.

-- One quantity of a rated line of a partial (and the line's fees, as the quantity
-- `fee` counting its requests); replaced with its partial by the same
-- `(generation, version)` rule as the lines.
CREATE TABLE tenant_cost_quantity_partial (
    tenant_id         TEXT          NOT NULL,
    window_end        BIGINT        NOT NULL,
    source_partition  INTEGER       NOT NULL,
    model             TEXT          NOT NULL,
    variant           TEXT          NOT NULL,
    plan              TEXT          NOT NULL,
    quantity          TEXT          NOT NULL,
    window_start      BIGINT        NOT NULL,
    count             NUMERIC(20,0) NOT NULL,
    cost_pico         NUMERIC(39,0) NOT NULL,
    version           BIGINT        NOT NULL,
    generation        BIGINT        NOT NULL,
    PRIMARY KEY (tenant_id, window_end, source_partition, model, variant, plan, quantity)
);
CREATE INDEX tenant_cost_quantity_partial_start ON tenant_cost_quantity_partial (window_start);

-- An adjustment's variant and plan ('' when none), and its quantities (and fee).
ALTER TABLE tenant_cost_adjustment ADD COLUMN variant TEXT NOT NULL DEFAULT '';
ALTER TABLE tenant_cost_adjustment ADD COLUMN plan TEXT NOT NULL DEFAULT '';
CREATE TABLE tenant_cost_adjustment_quantity (
    request_id  TEXT          NOT NULL,
    quantity    TEXT          NOT NULL,
    count       NUMERIC(20,0) NOT NULL,
    cost_pico   NUMERIC(39,0) NOT NULL,
    generation  BIGINT        NOT NULL,
    PRIMARY KEY (request_id, quantity)
);

-- The invoice line per tenant, window, model, variant, plan and quantity: what a
-- provider's invoice reads as "large — cached input". Its cost per window sums to
-- tenant_cost_minute's for the windows a rating billed.
CREATE VIEW tenant_cost_minute_quantity AS
WITH q AS (
    SELECT q.tenant_id, q.window_start, q.window_end, q.model, q.variant, q.plan,
           q.quantity, q.count, q.cost_pico
    FROM tenant_cost_quantity_partial q
    JOIN tenant_cost_partial p USING (tenant_id, window_end, source_partition, generation, version)
    UNION ALL
    SELECT a.tenant_id, a.window_start, a.window_end, a.model, a.variant, a.plan,
           aq.quantity, aq.count, aq.cost_pico
    FROM tenant_cost_adjustment_quantity aq
    JOIN tenant_cost_adjustment a USING (request_id, generation)
)
SELECT tenant_id,
       window_end,
       min(window_start)                AS window_start,
       model,
       variant,
       plan,
       quantity,
       sum(count)                       AS count,
       sum(cost_pico)                   AS cost_pico,
       sum(cost_pico) * 0.000000000001  AS usd,
       coalesce(window_end <= (SELECT final_through FROM tally_final), false) AS final
FROM q
GROUP BY tenant_id, window_end, model, variant, plan, quantity;

-- `tally_usage` per quantity: the minutes' quantity rows starting in `[from, to)`, summed
-- per hour, day or month in an IANA zone, per tenant, model, variant, plan and quantity,
-- each bucket clipped to `[from, to)`, `final` when its end is and `aligned` when no
-- window crosses its end — the same buckets and rules as `tally_usage`. Windows priced
-- by a price table have no quantity rows, so none here.
CREATE FUNCTION tally_usage_quantity(p_unit TEXT, p_tz TEXT, p_from BIGINT, p_to BIGINT,
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
    WHERE m.window_start >= p_from AND m.window_start < p_to
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
