// The Flink side of the issue-18 comparison (BENCHMARKS.md §1.3): the same billing
// query as `tally run --input-file` on the same JSON lines, in Flink SQL.
//
// Streaming mode, event time with the same 5 s bounded-out-of-orderness watermark,
// 1-minute TUMBLE per tenant, exact integer sums in pico-USD (BIGINT: no float on
// the money path, as in tally). The prices are the benchmark config's
// (scripts/bench.sh), per token in pico-USD. Each round is a new job in the same JVM,
// so the later rounds run on a warm JIT; the script reports the best of them.
//
// Prints one line per round: seconds, events, panes, cost_pico, so the totals can be
// checked against tally's output of the same file.

import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.types.Row;
import org.apache.flink.util.CloseableIterator;

public final class TallyTumble {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: TallyTumble <events.jsonl> <rounds> <parallelism>");
            System.exit(2);
        }
        String path = args[0];
        int rounds = Integer.parseInt(args[1]);
        String parallelism = args[2];
        for (int round = 1; round <= rounds; round++) {
            TableEnvironment t = TableEnvironment.create(EnvironmentSettings.inStreamingMode());
            t.getConfig().set("parallelism.default", parallelism);
            t.getConfig().set("table.local-time-zone", "UTC");
            t.executeSql(
                "CREATE TABLE requests ("
                    + " request_id STRING, tenant_id STRING, model STRING,"
                    + " prompt_tokens BIGINT, completion_tokens BIGINT,"
                    + " completed_ts BIGINT, started_ts BIGINT,"
                    + " ts AS TO_TIMESTAMP_LTZ(completed_ts, 3),"
                    + " WATERMARK FOR ts AS ts - INTERVAL '5' SECOND"
                    + ") WITH ('connector' = 'filesystem', 'path' = '" + path + "',"
                    + " 'format' = 'json', 'json.fail-on-missing-field' = 'false',"
                    + " 'json.ignore-parse-errors' = 'true')");
            long started = System.nanoTime();
            TableResult r = t.executeSql(
                "SELECT tenant_id, window_end, COUNT(*) AS requests,"
                    + " SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,"
                    + " SUM(CASE model"
                    + "   WHEN 'small' THEN prompt_tokens * 150000 + completion_tokens * 600000"
                    + "   WHEN 'medium' THEN prompt_tokens * 3000000 + completion_tokens * 15000000"
                    + "   WHEN 'large' THEN prompt_tokens * 50000000 + completion_tokens * 100000000"
                    + " END) AS cost_pico"
                    + " FROM TABLE(TUMBLE(TABLE requests, DESCRIPTOR(ts), INTERVAL '1' MINUTE))"
                    + " GROUP BY tenant_id, window_start, window_end");
            long events = 0, panes = 0, cost = 0;
            try (CloseableIterator<Row> it = r.collect()) {
                while (it.hasNext()) {
                    Row row = it.next();
                    panes++;
                    events += (Long) row.getField(2);
                    cost = Math.addExact(cost, (Long) row.getField(5));
                }
            }
            double seconds = (System.nanoTime() - started) / 1e9;
            System.out.printf(
                "round=%d seconds=%.2f events=%d panes=%d cost_pico=%d events_per_s=%.0f%n",
                round, seconds, events, panes, cost, events / seconds);
        }
        System.exit(0);
    }
}
