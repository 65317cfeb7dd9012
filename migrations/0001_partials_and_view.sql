-- tally sink schema, version 1 (DESIGN §6).
-- Money is NUMERIC(39,0) pico-USD: exact, and wide enough for any u128 sum.

CREATE TABLE tenant_cost_partial (
    tenant_id         TEXT          NOT NULL,
    window_end        BIGINT        NOT NULL,  -- ms since the epoch, exclusive
    source_partition  INTEGER       NOT NULL,
    window_start      BIGINT        NOT NULL,
    cost_pico         NUMERIC(39,0) NOT NULL,
    requests          BIGINT        NOT NULL,
    prompt_tokens     NUMERIC(20,0) NOT NULL,
    completion_tokens NUMERIC(20,0) NOT NULL,
    version           BIGINT        NOT NULL,  -- events folded in
    generation        BIGINT        NOT NULL,
    pane              TEXT          NOT NULL,
    pane_index        INTEGER       NOT NULL,
    updated_at        TIMESTAMPTZ   NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, window_end, source_partition)
);

-- Adjustments from reprocessed late events: insert-or-ignore by request_id.
CREATE TABLE tenant_cost_adjustment (
    request_id        TEXT          PRIMARY KEY,
    tenant_id         TEXT          NOT NULL,
    window_start      BIGINT        NOT NULL,
    window_end        BIGINT        NOT NULL,
    cost_pico         NUMERIC(39,0) NOT NULL,
    prompt_tokens     NUMERIC(20,0) NOT NULL,
    completion_tokens NUMERIC(20,0) NOT NULL,
    generation        BIGINT        NOT NULL,
    source            TEXT          NOT NULL,  -- topic/partition/offset of the original event
    applied_at        TIMESTAMPTZ   NOT NULL DEFAULT now()
);

-- Kafka offsets the sink has applied, written in the same transaction as the rows.
CREATE TABLE sink_offsets (
    topic       TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset BIGINT  NOT NULL,
    PRIMARY KEY (topic, partition)
);

-- The invoice line per tenant per window.
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
       sum(cost_pico)::NUMERIC(39,0)                         AS cost_pico,
       (sum(cost_pico) / 1000000000000)::NUMERIC(40,12)      AS usd,
       sum(requests)::BIGINT                                 AS requests,
       sum(prompt_tokens)::NUMERIC(20,0)                     AS prompt_tokens,
       sum(completion_tokens)::NUMERIC(20,0)                 AS completion_tokens
FROM lines
GROUP BY tenant_id, window_end;
