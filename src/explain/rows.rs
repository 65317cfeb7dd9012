//! The explanation as flat rows, one per request (billed or routed elsewhere),
//! in `(partition, offset)` order: what the usage API pages and writes as CSV.
//! Pure. Invariant: every request of `billed` and `elsewhere` is one row, and
//! the order is total (a partition's offsets are unique), so a page can resume
//! after `(partition, offset)`.

use serde::{Deserialize, Serialize};

use super::{Explanation, Quantity, Routed};

/// One request of an explanation. Fields that do not apply to its route are
/// `None` (`null` in JSON, empty in CSV).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub partition: i32,
    pub offset: i64,
    pub window_end: i64,
    pub request_id: Option<String>,
    /// `billed`, `duplicate`, `too_late` or `dead_letter`.
    pub route: String,
    pub model: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Billed: its cost; too late: what it costs (billed by an adjustment).
    pub cost_pico: Option<String>,
    /// Billed: `on_time` or `late`.
    pub pane: Option<String>,
    pub price_effective_from: Option<i64>,
    pub plan: Option<String>,
    /// Billed by a rating: the variant that priced it (`None`: the default).
    pub variant: Option<String>,
    /// Billed by a rating: the tier that priced it, its `above`.
    pub tier_above: Option<u64>,
    /// Billed by a rating: its quantities, its fee as the quantity `fee` — as
    /// `tally explain --json` lists them (`None`: it bills none — a price
    /// table's request, or a rated one without usage). In CSV one cell,
    /// `name=count:cost_pico` joined by `;`.
    pub quantities: Option<Vec<Quantity>>,
    /// Billed: the watermark it met; too late: the one that made it so.
    pub watermark: Option<i64>,
    pub duplicate_of_offset: Option<i64>,
    pub adjusted: Option<bool>,
    pub dead_letter_code: Option<String>,
}

/// The CSV columns, in `Row`'s field order.
pub const CSV_HEADER: &str = "partition,offset,window_end,request_id,route,model,prompt_tokens,\
completion_tokens,cost_pico,pane,price_effective_from,plan,variant,tier_above,quantities,watermark,duplicate_of_offset,\
adjusted,dead_letter_code";

fn empty(route: &str, partition: i32, offset: i64, window_end: i64) -> Row {
    Row {
        partition,
        offset,
        window_end,
        request_id: None,
        route: route.into(),
        model: None,
        prompt_tokens: None,
        completion_tokens: None,
        cost_pico: None,
        pane: None,
        price_effective_from: None,
        plan: None,
        variant: None,
        tier_above: None,
        quantities: None,
        watermark: None,
        duplicate_of_offset: None,
        adjusted: None,
        dead_letter_code: None,
    }
}

impl Explanation {
    /// Every request, in `(partition, offset)` order.
    pub fn rows(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .billed
            .iter()
            .map(|b| Row {
                request_id: Some(b.request_id.clone()),
                model: Some(b.model.clone()),
                prompt_tokens: Some(b.prompt_tokens),
                completion_tokens: Some(b.completion_tokens),
                cost_pico: Some(b.cost_pico.clone()),
                pane: Some(b.pane.clone()),
                price_effective_from: b.price_effective_from,
                plan: b.plan.clone(),
                variant: b.variant.clone(),
                tier_above: b.tier_above,
                quantities: (!b.quantities.is_empty()).then(|| b.quantities.clone()),
                watermark: b.watermark,
                ..empty("billed", b.partition, b.offset, b.window_end)
            })
            .collect();
        for e in &self.elsewhere {
            let base = |route| Row {
                request_id: e.request_id.clone(),
                ..empty(route, e.partition, e.offset, e.window_end)
            };
            rows.push(match &e.route {
                Routed::Duplicate { of_offset, .. } => Row {
                    duplicate_of_offset: *of_offset,
                    ..base("duplicate")
                },
                Routed::TooLate {
                    watermark,
                    cost_pico,
                    adjustment,
                    ..
                } => Row {
                    watermark: Some(*watermark),
                    cost_pico: Some(cost_pico.clone()),
                    adjusted: *adjustment,
                    ..base("too_late")
                },
                Routed::DeadLetter { code, .. } => Row {
                    dead_letter_code: Some(code.clone()),
                    ..base("dead_letter")
                },
            });
        }
        rows.sort_by_key(|r| (r.partition, r.offset));
        rows
    }
}

impl Row {
    /// The quantities as one CSV cell: `name=count:cost_pico`, joined by `;`,
    /// in the CLI's order (`None`: none).
    pub fn quantities_cell(&self) -> Option<String> {
        self.quantities.as_ref().map(|qs| {
            qs.iter()
                .map(|q| format!("{}={}:{}", q.quantity, q.count, q.cost_pico))
                .collect::<Vec<_>>()
                .join(";")
        })
    }

    /// The row as a CSV line (`\r\n`-terminated); `text` quotes a text cell.
    pub fn csv_line(&self, text: impl Fn(&str) -> String) -> String {
        fn n<T: ToString>(v: Option<T>) -> String {
            v.map_or(String::new(), |v| v.to_string())
        }
        let t = |v: &Option<String>| v.as_deref().map_or(String::new(), &text);
        [
            self.partition.to_string(),
            self.offset.to_string(),
            self.window_end.to_string(),
            t(&self.request_id),
            self.route.clone(),
            t(&self.model),
            n(self.prompt_tokens),
            n(self.completion_tokens),
            n(self.cost_pico.as_ref()),
            n(self.pane.as_ref()),
            n(self.price_effective_from),
            t(&self.plan),
            t(&self.variant),
            n(self.tier_above),
            t(&self.quantities_cell()),
            n(self.watermark),
            n(self.duplicate_of_offset),
            n(self.adjusted),
            n(self.dead_letter_code.as_ref()),
        ]
        .join(",")
            + "\r\n"
    }
}
