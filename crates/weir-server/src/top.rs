//! `weir top`: the keys being held back, as a table that refreshes in place like top(1).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use serde_json::Value;

use crate::client::Client;

/// What to show.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// Gather every node's rows (`scope=cluster`).
    pub cluster: bool,
    /// The sort column.
    pub sort: Option<String>,
    /// Only this policy.
    pub policy: Option<String>,
    /// Refresh every second until interrupted.
    pub watch: bool,
    /// At most this many rows.
    pub limit: usize,
}

fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".to_owned(),
    }
}

/// `text` safe to print on an operator's terminal: keys and kinds come from clients, and a key
/// holding `ESC ] 0 ; … BEL` or `ESC [ 2 J` would retitle or clear the terminal, a newline
/// would break the table, and a bidirectional override would reorder what is shown. Each such
/// character is shown as its Rust escape (`\u{1b}`, `\n`); a backslash is doubled, so an escape
/// shown is never ambiguous with a key that spells one.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi || c == '\\' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// The columns of the table: who, then the rates a second (offered, admitted at once, refused
/// or made to wait) and what the key holds now.
const HEADER: [&str; 10] = [
    "NODE",
    "POLICY",
    "KEY",
    "KIND",
    "LIMIT",
    "OFFERED",
    "ADMITTED",
    "HELD",
    "IN_FLIGHT",
    "WAITERS",
];
/// The first column aligned right: the numbers.
const FIRST_NUMBER: usize = 4;

/// A row's cells: `node` as given, the rest from the row. `HELD` (and so `ADMITTED`) is `-`
/// where the server did not measure it (a key an adaptive policy limits).
fn cells(node: String, r: &Value) -> [String; 10] {
    let offered = r["current_qps"].as_f64();
    let held = r["throttled_qps"].as_f64();
    let admitted = offered.zip(held).map(|(o, h)| (o - h).max(0.0));
    let rate = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    [
        node,
        printable(r["policy"].as_str().unwrap_or("")),
        printable(r["key"].as_str().unwrap_or("")),
        printable(r["kind"].as_str().unwrap_or("")),
        number(&r["qps_limit"]),
        rate(offered),
        rate(admitted),
        rate(held),
        number(&r["in_flight"]),
        number(&r["waiters"]),
    ]
}

/// `rows` under [`HEADER`], each column as wide as its widest cell; a line saying nobody is
/// held back when there are none.
fn table(rows: &[[String; 10]]) -> String {
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|i| {
            rows.iter()
                .map(|c| c[i].chars().count())
                .chain([HEADER[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cols: &[&str]| {
        let row: Vec<String> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i >= FIRST_NUMBER {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", row.join("  ").trim_end());
    };
    line(&mut out, &HEADER);
    for row in rows {
        let cols: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &cols);
    }
    if rows.is_empty() {
        out.push_str("(no key is being held back)\n");
    }
    out
}

/// Renders rows as a plain table, a row per node and key.
pub fn render(rows: &[Value]) -> String {
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| cells(printable(r["node_id"].as_str().unwrap_or("")), r))
        .collect();
    table(&cells)
}

/// Renders the rows of every node by key: a key decided on one node is that node's row; a key
/// decided on several is a `cluster` row with their sums (what the cluster was offered,
/// admitted and held back of that key), then each node's row under it. Keys come busiest (most
/// offered across the cluster) first unless `sorted` by another column, in which case they keep
/// the order of their first row.
pub fn render_by_key(rows: &[Value], sorted: bool) -> String {
    let mut keys: Vec<(String, Vec<&Value>)> = Vec::new();
    for row in rows {
        let id =
            serde_json::to_string(&[&row["policy"], &row["kind"], &row["key"]]).unwrap_or_default();
        match keys.iter_mut().find(|(k, _)| *k == id) {
            Some((_, group)) => group.push(row),
            None => keys.push((id, vec![row])),
        }
    }
    let offered =
        |group: &[&Value]| -> f64 { group.iter().filter_map(|r| r["current_qps"].as_f64()).sum() };
    if !sorted {
        keys.sort_by(|(_, a), (_, b)| offered(b).total_cmp(&offered(a)));
    }
    let mut all = Vec::new();
    for (_, group) in keys {
        let node = |r: &Value| printable(r["node_id"].as_str().unwrap_or(""));
        if let [only] = group[..] {
            all.push(cells(node(only), only));
            continue;
        }
        let sum = |field: &str| -> Value {
            let values: Option<Vec<f64>> = group.iter().map(|r| r[field].as_f64()).collect();
            values.map_or(Value::Null, |v| v.iter().sum::<f64>().into())
        };
        let mut total = group[0].clone();
        for field in ["current_qps", "throttled_qps", "in_flight", "waiters"] {
            total[field] = sum(field);
        }
        all.push(cells("cluster".to_owned(), &total));
        all.extend(group.iter().map(|r| cells(format!("  {}", node(r)), r)));
    }
    table(&all)
}

/// The members `/v1/cluster` lists, on one line: each with its state, how long a member not
/// alive has gone unseen, and whether it has no vote in the policy log.
pub fn render_members(view: &Value) -> String {
    let members = view["members"].as_array().cloned().unwrap_or_default();
    let each: Vec<String> = members
        .iter()
        .map(|m| {
            let mut text = format!(
                "{} {}",
                printable(m["id"].as_str().unwrap_or("?")),
                printable(m["state"].as_str().unwrap_or("?"))
            );
            if let Some(ms) = m["unseen_for_ms"].as_u64() {
                let _ = write!(text, " (unseen {} s)", ms / 1000);
            }
            if m["votes"] == Value::Bool(false) && view["policy_log"].is_object() {
                text.push_str(" (no vote)");
            }
            text
        })
        .collect();
    format!("members: {}\n", each.join(", "))
}

/// The query string for `options`, each value percent-encoded (a policy name may hold `&`).
fn throttles_query(options: &TopOptions) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("limit", &options.limit.to_string());
    if options.cluster {
        query.append_pair("scope", "cluster");
    }
    if let Some(sort) = &options.sort {
        query.append_pair("sort", sort);
    }
    if let Some(policy) = &options.policy {
        query.append_pair("policy", policy);
    }
    query.finish()
}

/// Runs `weir top` against `client`.
pub async fn run(client: &Client, options: &TopOptions) -> anyhow::Result<()> {
    let query = format!("/v1/throttles?{}", throttles_query(options));
    let tty = std::io::stdout().is_terminal();
    loop {
        let body = client.get(&query).await?;
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        let mut table = String::new();
        if options.cluster {
            // Who answers, and who the cluster is waiting for: a paused member has no rows.
            table.push_str(&render_members(&client.get("/v1/cluster").await?));
        }
        match options.cluster {
            true => table.push_str(&render_by_key(&rows, options.sort.is_some())),
            false => table.push_str(&render(&rows)),
        }
        let mut stdout = std::io::stdout();
        if options.watch && tty {
            // Clear the screen and home the cursor, then redraw.
            let _ = write!(stdout, "\x1b[2J\x1b[H");
        }
        let _ = write!(stdout, "{table}");
        let _ = stdout.flush();
        if !options.watch {
            return Ok(());
        }
        if !tty {
            let _ = writeln!(stdout);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_render_with_their_state_and_how_long_one_has_gone_unseen() {
        let view = json!({
            "policy_log": {},
            "members": [
                {"id": "n1", "state": "alive", "votes": true},
                {"id": "n2", "state": "leaving", "votes": false},
                {"id": "n3", "state": "suspect", "votes": true, "unseen_for_ms": 12_400},
            ]
        });
        assert_eq!(
            render_members(&view),
            "members: n1 alive, n2 leaving (no vote), n3 suspect (unseen 12 s)\n"
        );
    }

    #[test]
    fn rows_render_as_an_aligned_table() {
        let rows = vec![
            json!({
                "node_id": "local", "policy": "tables", "key": "orders", "kind": "scan",
                "qps_limit": 10.0, "current_qps": 42.25, "throttled_qps": 32.0,
                "in_flight": 0, "waiters": 3
            }),
            json!({
                "node_id": "local", "policy": "adaptive", "key": "t", "kind": "read",
                "qps_limit": 5.0, "current_qps": 7.0, "throttled_qps": null,
                "in_flight": 0, "waiters": 0
            }),
        ];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "NODE   POLICY    KEY     KIND  LIMIT  OFFERED  ADMITTED  HELD  IN_FLIGHT  WAITERS",
                "local  tables    orders  scan     10     42.2      10.2  32.0          0        3",
                "local  adaptive  t       read      5      7.0         -     -          0        0",
            ]
        );
        assert!(render(&[]).contains("no key is being held back"));
    }

    #[test]
    fn a_key_decided_on_several_nodes_shows_the_clusters_sums_then_each_node() {
        let row = |node: &str, key: &str, offered: f64, held: f64| {
            json!({
                "node_id": node, "policy": "api", "key": key, "kind": "",
                "qps_limit": 100.0, "current_qps": offered, "throttled_qps": held,
                "in_flight": 0, "waiters": 0
            })
        };
        // As the server sends them: each node's row, busiest first.
        let rows = vec![
            row("n2", "k0", 100.0, 40.0),
            row("n1", "k1", 90.0, 10.0),
            row("n3", "k0", 80.0, 30.0),
            row("n1", "k0", 70.0, 30.0),
        ];
        let table = render_by_key(&rows, false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "NODE     POLICY  KEY  KIND  LIMIT  OFFERED  ADMITTED   HELD  IN_FLIGHT  WAITERS",
                "cluster  api     k0           100    250.0     150.0  100.0          0        0",
                "  n2     api     k0           100    100.0      60.0   40.0          0        0",
                "  n3     api     k0           100     80.0      50.0   30.0          0        0",
                "  n1     api     k0           100     70.0      40.0   30.0          0        0",
                "n1       api     k1           100     90.0      80.0   10.0          0        0",
            ]
        );
        // Sorted by another column, keys keep the order of their first row.
        let sorted = render_by_key(&rows[1..2], true);
        assert!(
            sorted.lines().nth(1).unwrap().starts_with("n1 "),
            "{sorted}"
        );
    }

    #[test]
    fn the_query_encodes_what_it_is_given() {
        let options = TopOptions {
            cluster: true,
            sort: Some("key".into()),
            policy: Some("a&b=c d".into()),
            watch: false,
            limit: 5,
        };
        assert_eq!(
            throttles_query(&options),
            "limit=5&scope=cluster&sort=key&policy=a%26b%3Dc+d"
        );
    }

    #[test]
    fn client_supplied_text_cannot_drive_the_terminal() {
        let hostile = "a\u{1b}]0;owned\u{7}\u{1b}[2J\nb\u{9b}c\u{202e}d\\u{1b}";
        let rows = vec![json!({
            "node_id": "n", "policy": "p", "key": hostile, "kind": "k\r",
            "qps_limit": 1.0, "current_qps": 1.0, "throttled_qps": 1.0, "in_flight": 0, "waiters": 0
        })];
        let table = render(&rows);
        assert_eq!(
            table.lines().count(),
            2,
            "one row stays one line: {table:?}"
        );
        assert!(
            !table.chars().any(|c| c.is_control() && c != '\n'),
            "{table:?}"
        );
        assert!(
            table.contains(r"a\u{1b}]0;owned\u{7}\u{1b}[2J\nb\u{9b}c\u{202e}d\\u{1b}"),
            "{table:?}"
        );
        assert!(table.contains(r"k\r"), "{table:?}");
    }
}
