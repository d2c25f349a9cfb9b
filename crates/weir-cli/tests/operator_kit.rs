//! The operator's kit — the Grafana dashboard, the Prometheus alerting rules and their
//! PrometheusRule, the Kubernetes manifests — held to the binary and to the tools that read them:
//!
//! - `docs/grafana/weir.json` is a dashboard Grafana imports as it is: JSON, its data source a
//!   `datasource` variable of type Prometheus (no `${DS_…}` inputs), `job`, `instance` and
//!   `policy` variables, every panel but the rows with queries, each query scoped to `$job` and
//!   `$instance`;
//! - every metric the dashboard's queries, variables and annotations name, and every metric the
//!   rules' expressions name, is a series a live node exports (a `# HELP` line alone is not
//!   enough), and every label value they select literally (`outcome="rejected"`, each word of
//!   `outcome=~"fail_open|fail_closed"`) is one of its series' — so a renamed metric or label
//!   value fails here.
//!   The node runs in cluster mode, alone (every `weir_cluster_*` and `weir_policy_log_*` series
//!   is exported from the start; only `weir_cluster_units_lent{peer}`, which neither file uses,
//!   waits for a loan to another member), with a policy of each kind, a `[redis]` (for
//!   `weir_redis_decisions_total`) and the RLS rules of `docs/envoy/ratelimit.yaml` (one
//!   `weir_rls_*_total` series per rule). Some series need traffic, which the test drives: an
//!   API request (`weir_api_requests_total`, `weir_api_request_duration_seconds`), a busy signal
//!   that tightens an adaptive policy's key (`weir_backpressure_throttled_keys{kind}`) and calls
//!   to it made at once, so that one waits its turn (`weir_backpressure_wait_seconds{kind}`);
//! - `docs/prometheus/weir-rules.yaml`: groups named `weir…`, every alert with a severity, a
//!   summary, a description and a `for:`; `promtool check rules` accepts it and
//!   `promtool test rules` passes `docs/prometheus/weir-rules.test.yaml`, which shows every
//!   alert both firing and silent;
//! - `deploy/kubernetes/prometheusrule.yaml`'s `spec.groups` are the rules file's groups;
//! - `kubernetes-validate --strict` accepts every manifest in `deploy/kubernetes` against the
//!   API schemas of Kubernetes 1.33 (`KUBERNETES_VERSION`), offline: each resource passes, except
//!   the PrometheusRule, a custom resource it has no schema for, which it must say so of (and
//!   which the checks above hold instead); and it rejects broken copies (a port that is not a
//!   number, a field the API does not have, an API version that does not exist).
//!
//! promtool (Debian's `prometheus`) and kubernetes-validate (PyPI's) are skipped, saying so,
//! where they are missing, unless `WEIR_REQUIRE_PROMTOOL` and `WEIR_REQUIRE_KUBERNETES_VALIDATE`
//! are set, as CI sets them.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, available, eventually};
use yaml_rust2::{Yaml, YamlLoader};

/// The Kubernetes release whose API schemas the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.33.0";

/// Custom resources kubernetes-validate has no schema for, by kind, each held by its own test.
const CUSTOM_KINDS: [&str; 1] = ["PrometheusRule"];

const DASHBOARD: &str = "docs/grafana/weir.json";
const RULES: &str = "docs/prometheus/weir-rules.yaml";
const RULE_TESTS: &str = "docs/prometheus/weir-rules.test.yaml";
const PROMETHEUS_RULE: &str = "deploy/kubernetes/prometheusrule.yaml";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The one YAML document of `path`.
fn yaml(path: &str) -> Yaml {
    let mut docs = YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(docs.len(), 1, "{path}: one YAML document expected");
    docs.remove(0)
}

fn list(yaml: &Yaml) -> &[Yaml] {
    yaml.as_vec()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("a list expected: {yaml:?}"))
}

fn string(yaml: &Yaml) -> &str {
    yaml.as_str()
        .unwrap_or_else(|| panic!("a string expected: {yaml:?}"))
}

// --- The live exposition ----------------------------------------------------------------------

/// A policy of each kind (`ms-tables` adaptive, its busy signal tightening for a minute), one of
/// them kept in a Redis nobody listens for: it is never asked, so none is needed.
const CONFIG: &str = r#"
[redis]
url = "redis://127.0.0.1:1"
on_unavailable = "open"

[[policy]]
name = "tables"
scope = "cluster"
on_exhausted = "reject"
token_bucket = { rate = 5, burst = 5 }

[[policy]]
name = "getpage"
on_exhausted = "wait"
max_wait = "1s"
leaky_bucket = { initial = 0, refill_interval = "100ms", refill_amount = 10, max = 100, fair = true }

[[policy]]
name = "spaced"
on_exhausted = "reject"
strict = { qps = 10 }

[[policy]]
name = "per-minute"
on_exhausted = "reject"
fixed_window = { limit = 100, window = "1m" }

[[policy]]
name = "sliding"
on_exhausted = "reject"
sliding_window = { limit = 100, window = "1m" }

[[policy]]
name = "daily"
scope = "redis"
on_exhausted = "reject"
fixed_window = { limit = 100, window = "1d" }

[[policy]]
name = "search"
on_exhausted = "reject"
concurrency = { node_limit = 1, shared_limit = 2, lease_ttl = "10s", on_unavailable = "open" }

[[policy]]
name = "ms-tables"
on_exhausted = "wait"
max_wait = "5s"
adaptive = { top_k = 2, ratio = 0.75, floor = 1.0, window = "3s", upgrade_interval = "3s", downgrade_interval = "60s" }
"#;

/// One sample line of an exposition: its metric name and labels.
struct Series {
    name: String,
    labels: Vec<(String, String)>,
}

/// The samples of a Prometheus text exposition (comments left out).
fn series_of(exposition: &str) -> Vec<Series> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = if line[end..].starts_with('{') {
                let close = closing_brace(&line[end..]).expect("a closed label set") + end;
                matchers(&line[end + 1..close])
                    .into_iter()
                    .map(|(label, _, value)| (label, value))
                    .collect()
            } else {
                Vec::new()
            };
            Series {
                name: line[..end].to_owned(),
                labels,
            }
        })
        .collect()
}

async fn post(server: &Server, path: &str, body: Value) -> Value {
    reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The series a node on [`CONFIG`] exports once the traffic that makes the last of them has
/// been driven.
async fn live_series() -> Vec<Series> {
    let dir = tempfile::tempdir().unwrap();
    let rls = repo().join("docs/envoy/ratelimit.yaml");
    let server = Server::start_full(
        CONFIG,
        &dir.path().join("node"),
        &[],
        &[
            "--node-id",
            "n1",
            "--gossip",
            "127.0.0.1:0",
            "--rls-config",
            rls.to_str().unwrap(),
            // The Redis protocol's counters are exported by its listener.
            "--resp",
            "127.0.0.1:0",
        ],
    );
    let call = json!({"policy": "ms-tables", "key": "t1", "kind": "PREPARE_ROWSET"});
    // A call on a key, then a busy signal: the adaptive policy cuts the key to less than the
    // rate it measured (a call a look at most: tens a second).
    eventually(
        Duration::from_secs(30),
        "a busy signal tightening ms-tables's key",
        || async {
            post(&server, "/v1/acquire", call.clone()).await;
            post(&server, "/v1/busy", json!({"policy": "ms-tables"})).await["tightened"]
                == json!(true)
        },
    )
    .await;
    // Calls to the tightened key at once: all but one wait for their slots. (One at a time, a
    // look apart, would each find a slot free.)
    eventually(
        Duration::from_secs(30),
        "a call to the tightened key waiting its turn",
        || async {
            let calls = (0..4).map(|_| post(&server, "/v1/acquire", call.clone()));
            futures_util::future::join_all(calls)
                .await
                .iter()
                .any(|answer| {
                    answer["waited_ms"]
                        .as_u64()
                        .is_some_and(|waited| waited > 0)
                })
        },
    )
    .await;
    let exposition = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    series_of(&exposition)
}

// --- Reading PromQL ---------------------------------------------------------------------------

/// Whether `c` may be part of a metric or label name.
fn is_name(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether a matcher's value is a plain word (not a pattern, not a dashboard variable).
fn is_plain(value: &str) -> bool {
    value.chars().all(is_name)
}

/// The offset of the `}` closing the `{` that `text` starts with (quoted strings skipped).
fn closing_brace(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (at, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(at),
            _ => {}
        }
    }
    None
}

/// The matchers of a label set (`a="x", b=~"y|z"`) as (label, operator, value).
fn matchers(set: &str) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    let mut rest = set.trim_start();
    while !rest.is_empty() {
        let name_end = rest.find(|c| !is_name(c)).unwrap_or(rest.len());
        let label = rest[..name_end].to_owned();
        rest = rest[name_end..].trim_start();
        let op_end = rest
            .find('"')
            .unwrap_or_else(|| panic!("a quoted value in {{{set}}}"));
        let op = rest[..op_end].trim().to_owned();
        rest = &rest[op_end + 1..];
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = at;
                    break;
                }
                c => value.push(c),
            }
        }
        found.push((label, op, value));
        rest = rest[(end + 1).min(rest.len())..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    found
}

/// A metric named in a query, with the label values it selects literally: `label="value"`, or
/// `label=~"a|b"` where the alternatives are plain words. Values naming a dashboard variable
/// (`$job`) or a pattern, and negative matchers, select nothing to check.
struct Selected {
    metric: String,
    values: Vec<(String, String)>,
}

/// The metrics (`weir_…`, `process_…`) that the PromQL `query` names.
fn selected(query: &str) -> Vec<Selected> {
    let mut found = Vec::new();
    for prefix in ["weir_", "process_"] {
        for (at, _) in query.match_indices(prefix) {
            if query[..at].chars().next_back().is_some_and(is_name) {
                continue;
            }
            let end = query[at..]
                .find(|c| !is_name(c))
                .map_or(query.len(), |n| at + n);
            let mut values = Vec::new();
            let after = query[end..].trim_start();
            if after.starts_with('{') {
                let close = closing_brace(after).expect("a closed selector");
                for (label, op, value) in matchers(&after[1..close]) {
                    match op.as_str() {
                        "=" if is_plain(&value) => values.push((label, value)),
                        "=~" if value.split('|').all(is_plain) => {
                            values.extend(value.split('|').map(|v| (label.clone(), v.to_owned())))
                        }
                        _ => {}
                    }
                }
            }
            found.push(Selected {
                metric: query[at..end].to_owned(),
                values,
            });
        }
    }
    found
}

/// Holds every metric `queries` name (each with where it comes from) to the node's series: the
/// metric is exported, and so is each label value selected.
fn assert_exported(file: &str, queries: &[(String, String)], series: &[Series]) {
    let mut named = BTreeSet::new();
    for (place, query) in queries {
        for Selected { metric, values } in selected(query) {
            assert!(
                series.iter().any(|s| s.name == metric),
                "{file}: {place} names `{metric}`, which a live node does not export:\n{query}"
            );
            for (label, value) in values {
                assert!(
                    series.iter().any(|s| s.name == metric
                        && s.labels.iter().any(|(l, v)| *l == label && *v == value)),
                    "{file}: {place} selects {metric}{{{label}=\"{value}\"}}, a series a live \
                     node does not export:\n{query}"
                );
            }
            named.insert(metric);
        }
    }
    // A scan that found nothing would prove nothing.
    assert!(named.len() >= 10, "{file} names few metrics: {named:?}");
}

// --- The dashboard ----------------------------------------------------------------------------

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every panel, those inside rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        found.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            found.extend(inner);
        }
    }
    found
}

/// Every query of the dashboard, each with where it is: panels' targets, the variables'
/// queries, the annotations'.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let place = format!("panel `{}`", panel["title"].as_str().unwrap_or("?"));
            queries.push((place, target["expr"].as_str().unwrap_or("").to_owned()));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        let query = &variable["query"];
        let text = query.as_str().or_else(|| query["query"].as_str());
        if let (Some(text), Some("query")) = (text, variable["type"].as_str()) {
            let place = format!("variable `{}`", variable["name"].as_str().unwrap_or("?"));
            queries.push((place, text.to_owned()));
        }
    }
    for annotation in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(expr) = annotation["expr"].as_str() {
            let place = format!(
                "annotation `{}`",
                annotation["name"].as_str().unwrap_or("?")
            );
            queries.push((place, expr.to_owned()));
        }
    }
    queries
}

#[test]
fn the_dashboard_is_one_grafana_imports() {
    let dashboard = dashboard();
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let schema = dashboard["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    // Imported as it is: no `__inputs` to fill in, the data source chosen with a variable.
    assert!(
        !read(DASHBOARD).contains("${DS_"),
        "{DASHBOARD} names an import input; it takes its data source from $datasource"
    );
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == json!(name))
            .unwrap_or_else(|| panic!("{DASHBOARD} has no variable `{name}`"))
    };
    let source = variable("datasource");
    assert_eq!(source["type"], json!("datasource"));
    assert_eq!(source["query"], json!("prometheus"));
    for name in ["job", "instance", "policy"] {
        assert_eq!(variable(name)["type"], json!("query"), "variable `{name}`");
    }
    let policy = &variable("policy")["query"];
    let policy = policy
        .as_str()
        .or_else(|| policy["query"].as_str())
        .unwrap();
    assert!(
        policy.starts_with("label_values(weir_decisions_total") && policy.ends_with(", policy)"),
        "{policy}"
    );

    let this_source = json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = BTreeSet::new();
    let mut queried = 0;
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().expect("a panel without a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a panel id")),
            "two panels' id: {title}"
        );
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && grid["h"].as_u64().unwrap() > 0,
            "`{title}` off the grid"
        );
        let kind = panel["type"].as_str().unwrap();
        if kind == "row" {
            continue;
        }
        assert!(
            ["timeseries", "stat", "table"].contains(&kind),
            "`{title}` is a {kind} panel"
        );
        assert_eq!(panel["datasource"], this_source, "`{title}`'s data source");
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert!(!targets.is_empty(), "panel `{title}` has no queries");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or("");
            assert!(
                !expr.trim().is_empty(),
                "`{title}`: a query without an expression"
            );
            assert_eq!(target["datasource"], this_source, "`{title}`: {expr}");
            assert!(target["refId"].as_str().is_some(), "`{title}`: {expr}");
            assert!(
                expr.contains("job=~\"$job\"") && expr.contains("instance=~\"$instance\""),
                "`{title}` queries outside the chosen job and instances: {expr}"
            );
            queried += 1;
        }
    }
    assert!(queried >= 20, "{queried} queries");
}

// --- The rules --------------------------------------------------------------------------------

/// Every alerting rule of the rules file: (group, rule).
fn alerts(rules: &Yaml) -> Vec<(&str, &Yaml)> {
    list(&rules["groups"])
        .iter()
        .flat_map(|group| {
            let name = string(&group["name"]);
            list(&group["rules"]).iter().map(move |rule| (name, rule))
        })
        .collect()
}

#[test]
fn every_alert_says_how_bad_what_and_for_how_long_and_is_unit_tested_both_ways() {
    let rules = yaml(RULES);
    let alerts = alerts(&rules);
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    let tests = yaml(RULE_TESTS);
    assert_eq!(
        list(&tests["rule_files"]),
        [Yaml::String("weir-rules.yaml".into())]
    );
    let cases: Vec<&Yaml> = list(&tests["tests"])
        .iter()
        .flat_map(|test| list(&test["alert_rule_test"]))
        .collect();
    let mut names = BTreeSet::new();
    for (group, rule) in alerts {
        assert!(group.starts_with("weir"), "group `{group}`");
        let alert = string(&rule["alert"]);
        assert!(names.insert(alert), "two alerts named {alert}");
        assert!(!string(&rule["expr"]).trim().is_empty(), "{alert}");
        assert!(
            rule["for"].as_str().is_some_and(|f| f.ends_with('m')),
            "{alert}: no `for:` in minutes"
        );
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            severity.is_some_and(|s| ["critical", "warning", "info"].contains(&s)),
            "{alert}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|a| !a.trim().is_empty()),
                "{alert} has no {annotation}"
            );
        }
        let of_alert = || {
            cases
                .iter()
                .filter(move |case| case["alertname"].as_str() == Some(alert))
        };
        assert!(
            of_alert().any(|case| !list(&case["exp_alerts"]).is_empty()),
            "{RULE_TESTS} never shows {alert} firing"
        );
        assert!(
            of_alert().any(|case| list(&case["exp_alerts"]).is_empty()),
            "{RULE_TESTS} never shows {alert} silent"
        );
    }
}

#[test]
fn promtool_accepts_the_rules_and_passes_their_unit_tests() {
    if !available("promtool", &["--version"], "WEIR_REQUIRE_PROMTOOL") {
        return;
    }
    for args in [["check", "rules", RULES], ["test", "rules", RULE_TESTS]] {
        let run = Command::new("promtool")
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
    }
}

#[test]
fn the_prometheus_rule_holds_the_rules_files_groups() {
    let rules = yaml(RULES);
    let resource = yaml(PROMETHEUS_RULE);
    assert_eq!(string(&resource["apiVersion"]), "monitoring.coreos.com/v1");
    assert_eq!(string(&resource["kind"]), "PrometheusRule");
    assert_eq!(string(&resource["metadata"]["name"]), "weir");
    assert_eq!(
        string(&resource["metadata"]["labels"]["app.kubernetes.io/name"]),
        "weir"
    );
    let keys = |yaml: &Yaml| {
        yaml.as_hash()
            .expect("a mapping")
            .keys()
            .map(|k| string(k).to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&rules), ["groups"], "{RULES}");
    assert_eq!(
        keys(&resource["spec"]),
        ["groups"],
        "{PROMETHEUS_RULE}'s spec"
    );
    let (ours, theirs) = (list(&rules["groups"]), list(&resource["spec"]["groups"]));
    assert_eq!(
        ours.len(),
        theirs.len(),
        "groups in {RULES} and {PROMETHEUS_RULE}"
    );
    for (group, held) in ours.iter().zip(theirs) {
        let name = string(&group["name"]);
        let (group_rules, held_rules) = (list(&group["rules"]), list(&held["rules"]));
        assert_eq!(group_rules.len(), held_rules.len(), "rules of group {name}");
        for (rule, in_resource) in group_rules.iter().zip(held_rules) {
            assert_eq!(
                rule, in_resource,
                "group {name}: {PROMETHEUS_RULE} differs from {RULES}"
            );
        }
    }
    assert_eq!(rules["groups"], resource["spec"]["groups"]);
}

// --- Both, against a live node ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_rules_name_only_series_weir_exports() {
    let series = live_series().await;
    assert_exported(DASHBOARD, &dashboard_queries(&dashboard()), &series);
    let rules = yaml(RULES);
    let expressions: Vec<(String, String)> = alerts(&rules)
        .into_iter()
        .map(|(_, rule)| {
            let place = format!("alert {}", string(&rule["alert"]));
            (place, string(&rule["expr"]).to_owned())
        })
        .collect();
    assert_exported(RULES, &expressions, &series);
}

/// The selectors are read as Prometheus reads them: a scan that misread them would let the
/// test above pass on anything.
#[test]
fn the_selectors_are_read_with_their_label_values() {
    let query = concat!(
        r#"sum by (policy) (rate(weir_decisions_total{job=~"$job", "#,
        r#"outcome=~"rejected|throttled", policy!="x"}[5m]))"#,
        " / on (job) group_left () count by (job) (up) + process_open_fds",
    );
    let found = selected(query);
    let names: Vec<&str> = found.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(names, ["weir_decisions_total", "process_open_fds"]);
    let pairs = |s: &Selected| {
        s.values
            .iter()
            .map(|(l, v)| format!("{l}={v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&found[0]), ["outcome=rejected", "outcome=throttled"]);
    assert!(found[1].values.is_empty());
    let series = series_of(
        "# TYPE weir_decisions_total counter\n\
         weir_decisions_total{policy=\"a,b\",outcome=\"rejected\"} 3\n\
         weir_build_info{version=\"0.1.0\",commit=\"x\\\"y\"} 1\n\
         process_open_fds 9\n",
    );
    let read: Vec<(&str, Vec<(String, String)>)> = series
        .iter()
        .map(|s| (s.name.as_str(), s.labels.clone()))
        .collect();
    let pair = |l: &str, v: &str| (l.to_owned(), v.to_owned());
    assert_eq!(
        read,
        [
            (
                "weir_decisions_total",
                vec![pair("policy", "a,b"), pair("outcome", "rejected")]
            ),
            (
                "weir_build_info",
                vec![pair("version", "0.1.0"), pair("commit", "x\"y")]
            ),
            ("process_open_fds", vec![]),
        ]
    );
}

// --- Kubernetes -------------------------------------------------------------------------------

/// The manifests of `deploy/kubernetes`, as paths from the repository's root.
fn manifest_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .map(|name| format!("deploy/kubernetes/{name}"))
        .collect();
    files.sort();
    files
}

/// kubernetes-validate's verdict on `files` (paths under `root`): `Err` with what it said
/// unless it exits 0 having passed every resource — a custom resource of [`CUSTOM_KINDS`]
/// excepted, which it must say it has no schema for. (It passes a resource of a kind or API
/// version it does not know, with a warning: that counts as a failure here.)
fn validate(root: &Path, files: &[String]) -> Result<(), String> {
    let run = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .args(files)
        .current_dir(root)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    if !run.status.success() {
        return Err(said);
    }
    let minor = KUBERNETES_VERSION.rsplit_once('.').unwrap().0;
    let mut resources = 0;
    for file in files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for doc in YamlLoader::load_from_str(&text).unwrap() {
            let (kind, name) = (string(&doc["kind"]), string(&doc["metadata"]["name"]));
            let expected = if CUSTOM_KINDS.contains(&kind) {
                format!(
                    "WARN {file} Couldn't find schema for kind {kind} with api version {}",
                    string(&doc["apiVersion"])
                )
            } else {
                format!(
                    "INFO {file} passed for resource {}/{name} against version {minor}\n",
                    kind.to_lowercase()
                )
            };
            if !said.contains(&expected) {
                return Err(format!("no `{}` in:\n{said}", expected.trim()));
            }
            resources += 1;
        }
    }
    let warnings = said.lines().filter(|l| l.starts_with("WARN")).count();
    let custom = said
        .lines()
        .filter(|l| {
            CUSTOM_KINDS
                .iter()
                .any(|k| l.contains(&format!(" kind {k} ")))
        })
        .count();
    if warnings != custom || resources == 0 {
        return Err(said);
    }
    Ok(())
}

#[test]
fn kubernetes_validate_accepts_the_manifests_and_rejects_broken_ones() {
    if !available(
        "kubernetes-validate",
        &["--version"],
        "WEIR_REQUIRE_KUBERNETES_VALIDATE",
    ) {
        return;
    }
    let files = manifest_files();
    assert!(files.contains(&PROMETHEUS_RULE.to_owned()), "{files:?}");
    if let Err(said) = validate(&repo(), &files) {
        panic!("kubernetes-validate {KUBERNETES_VERSION}: {said}");
    }

    // Broken copies of the StatefulSet, each refused.
    let statefulset = read("deploy/kubernetes/statefulset.yaml");
    let dir = tempfile::tempdir().unwrap();
    for (what, from, to) in [
        (
            "a port that is not a number",
            "containerPort: 8080",
            "containerPort: \"abc\"",
        ),
        (
            "a field the API does not have",
            "  replicas: 3\n",
            "  replicas: 3\n  replica: 3\n",
        ),
        (
            "an API version that does not exist",
            "apiVersion: apps/v1",
            "apiVersion: apps/v9",
        ),
    ] {
        assert!(statefulset.contains(from), "{from}");
        std::fs::write(
            dir.path().join("statefulset.yaml"),
            statefulset.replacen(from, to, 1),
        )
        .unwrap();
        let copy = ["statefulset.yaml".to_owned()];
        assert!(
            validate(dir.path(), &copy).is_err(),
            "kubernetes-validate passed a StatefulSet with {what}"
        );
    }
}
