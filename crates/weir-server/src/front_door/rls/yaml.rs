//! The YAML of a rules file as written, checked as it is read: unknown fields with a "did you
//! mean", units, `unlimited` with a rate, `replaces`, `share_threshold` only on patterns, each
//! mistake named by file, line and rule.

use std::collections::BTreeSet;
use std::path::Path;

use marked_yaml::Spanned;
use serde::Deserialize;

use super::config::{Algorithm, DomainRules, Limit, Node, Place, RuleError, Unit};

/// A file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    domain: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<NodeYaml>,
    #[serde(default)]
    weir_algorithm: Option<Spanned<String>>,
}

/// A descriptor node as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeYaml {
    key: Spanned<String>,
    #[serde(default)]
    value: Option<Spanned<String>>,
    #[serde(default)]
    rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    descriptors: Vec<NodeYaml>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    quota_mode: bool,
    /// Read and not used: Weir does not answer `dynamic_metadata`.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    weir_algorithm: Option<Spanned<String>>,
}

/// A `rate_limit` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitYaml {
    #[serde(default)]
    unit: Option<Spanned<String>>,
    #[serde(default)]
    requests_per_unit: Option<Spanned<String>>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplaceYaml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceYaml {
    #[serde(default)]
    name: Option<Spanned<String>>,
}

fn place_of<T>(file: &Path, spanned: &Spanned<T>) -> Place {
    place_at(file, spanned.span().start())
}

/// The place of a YAML mark in `file` (line and column 0 when there is none).
fn place_at(file: &Path, mark: Option<&marked_yaml::Marker>) -> Place {
    let (line, column) = mark.map_or((0, 0), |m| (m.line(), m.column()));
    Place {
        file: file.to_owned(),
        line,
        column,
    }
}

fn parse_algorithm(
    file: &Path,
    written: &Option<Spanned<String>>,
    rule: Option<&str>,
    errors: &mut Vec<RuleError>,
) -> Option<Algorithm> {
    let written = written.as_ref()?;
    let algorithm = Algorithm::named(written.as_str());
    if algorithm.is_none() {
        let names: Vec<String> = Algorithm::names().map(|n| format!("`{n}`")).collect();
        errors.push(RuleError {
            place: place_of(file, written),
            rule: rule.map(str::to_owned),
            problem: format!(
                "`weir_algorithm` must be one of {}, got `{}`",
                names.join(", "),
                written.as_str()
            ),
        });
    }
    algorithm
}

/// The fields each level of a rules file may have: a file, a descriptor node, a `rate_limit`,
/// one of its `replaces`.
const FILE_FIELDS: &[&str] = &["domain", "descriptors", "weir_algorithm"];
const NODE_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
    "weir_algorithm",
];
const RATE_LIMIT_FIELDS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces"];
const REPLACE_FIELDS: &[&str] = &["name"];

/// Every field of `node` (a mapping at a level whose fields are `known`) that is not one, at
/// its line and column and with the nearest field meant when one is close; then the same in
/// the levels below. serde would stop at the first, and without a place.
fn unknown_fields(
    file: &Path,
    node: &marked_yaml::Node,
    known: &[&str],
    errors: &mut Vec<RuleError>,
) {
    let Some(mapping) = node.as_mapping() else {
        return;
    };
    for (key, value) in mapping.iter() {
        let name = key.as_str();
        if !known.contains(&name) {
            let meant = crate::suggest::nearest_name(name, known.iter().copied())
                .map_or(String::new(), |field| format!(" (did you mean `{field}`?)"));
            errors.push(RuleError {
                place: place_at(file, key.span().start()),
                rule: None,
                problem: format!(
                    "unknown field `{name}`{meant}; a {} has {}",
                    match known {
                        k if k == FILE_FIELDS => "file",
                        k if k == NODE_FIELDS => "descriptor",
                        k if k == RATE_LIMIT_FIELDS => "rate_limit",
                        _ => "replaces entry",
                    },
                    known
                        .iter()
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
            continue;
        }
        let (below, each) = match name {
            "descriptors" => (NODE_FIELDS, true),
            "rate_limit" => (RATE_LIMIT_FIELDS, false),
            "replaces" => (REPLACE_FIELDS, true),
            _ => continue,
        };
        match (each, value.as_sequence()) {
            (true, Some(items)) => {
                for item in items.iter() {
                    unknown_fields(file, item, below, errors);
                }
            }
            _ => unknown_fields(file, value, below, errors),
        }
    }
}

pub(super) fn parse_file(
    file: &Path,
    text: &str,
    errors: &mut Vec<RuleError>,
) -> Option<DomainRules> {
    let tree = match super::yaml_tree::parse(text) {
        Ok(tree) => tree,
        Err(error) => {
            errors.push(RuleError {
                place: place_at(file, error.mark.as_ref()),
                rule: None,
                problem: format!("is not valid YAML: {}", error.problem),
            });
            return None;
        }
    };
    // Every unknown field first, each at its place: a file with any is not read further.
    let before = errors.len();
    unknown_fields(file, &tree, FILE_FIELDS, errors);
    if errors.len() > before {
        return None;
    }
    let parsed: FileYaml = match marked_yaml::from_node(&tree) {
        Ok(parsed) => parsed,
        Err(error) => {
            errors.push(RuleError {
                place: place_at(file, error.start_mark().as_ref()),
                rule: None,
                problem: format!("is not a valid rules file: {error}"),
            });
            return None;
        }
    };
    let domain = parsed.domain.as_str().to_owned();
    if domain.is_empty() {
        errors.push(RuleError {
            place: place_of(file, &parsed.domain),
            rule: None,
            problem: "`domain` must not be empty".to_owned(),
        });
        return None;
    }
    let before = errors.len();
    let algorithm = parse_algorithm(file, &parsed.weir_algorithm, None, errors).unwrap_or_default();
    let mut context = Context {
        file,
        algorithm,
        errors,
    };
    let descriptors = context.level(&domain, parsed.descriptors);
    (errors.len() == before).then_some(DomainRules {
        domain,
        file: file.to_owned(),
        descriptors,
    })
}

struct Context<'a> {
    file: &'a Path,
    algorithm: Algorithm,
    errors: &'a mut Vec<RuleError>,
}

impl Context<'_> {
    fn error(&mut self, place: Place, rule: &str, problem: impl Into<String>) {
        self.errors.push(RuleError {
            place,
            rule: Some(rule.to_owned()),
            problem: problem.into(),
        });
    }

    /// The nodes of one level under `parent` (a path), checked.
    fn level(&mut self, parent: &str, written: Vec<NodeYaml>) -> Vec<Node> {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut nodes = Vec::new();
        for node in written {
            let place = place_of(self.file, &node.key);
            let key = node.key.as_str().to_owned();
            // An empty value is no value, as the reference server reads it: any value.
            let value = node
                .value
                .as_ref()
                .map(|v| v.as_str().to_owned())
                .filter(|v| !v.is_empty());
            let step = match &value {
                Some(value) => format!("{key}_{value}"),
                None => key.clone(),
            };
            let path = format!("{parent}.{step}");
            if key.is_empty() {
                self.error(place.clone(), &path, "`key` must not be empty");
            }
            if !seen.insert(step) {
                self.error(
                    place.clone(),
                    &path,
                    "is defined twice at this level: each key (and value) may appear once",
                );
            }
            let is_pattern = value.as_deref().is_some_and(|v| v.contains('*'));
            if node.share_threshold && !is_pattern {
                self.error(
                    place.clone(),
                    &path,
                    "`share_threshold` needs a `value` with `*`: it makes every value the pattern matches share one counter",
                );
            }
            let algorithm =
                parse_algorithm(self.file, &node.weir_algorithm, Some(&path), self.errors)
                    .unwrap_or(self.algorithm);
            let limit = node
                .rate_limit
                .and_then(|written| self.limit(&path, &place, written, algorithm));
            let children = self.level(&path, node.descriptors);
            nodes.push(Node {
                key,
                value,
                path,
                place,
                limit,
                shadow_mode: node.shadow_mode,
                quota_mode: node.quota_mode,
                detailed_metric: node.detailed_metric,
                value_to_metric: node.value_to_metric,
                share_threshold: node.share_threshold,
                children,
            });
        }
        nodes
    }

    fn limit(
        &mut self,
        path: &str,
        place: &Place,
        written: RateLimitYaml,
        algorithm: Algorithm,
    ) -> Option<Limit> {
        let mut replaces = Vec::new();
        for replace in written.replaces {
            match replace.name {
                Some(name) if !name.is_empty() => {
                    if written.name.as_deref() == Some(name.as_str()) {
                        let at = place_of(self.file, &name);
                        self.error(at, path, "`replaces` names the rule's own limit");
                    }
                    replaces.push(name.as_str().to_owned());
                }
                _ => self.error(place.clone(), path, "a `replaces` entry must have a `name`"),
            }
        }
        let unit = written.unit.as_ref().map(|u| (Unit::parse(u), u));
        if written.unlimited {
            if let Some((Some(_), spanned)) = &unit {
                let at = place_of(self.file, spanned);
                self.error(at, path, "`unit` must not be given with `unlimited: true`");
                return None;
            }
            return Some(Limit::Unlimited {
                name: written.name,
                replaces,
            });
        }
        let unit = match unit {
            Some((Some(unit), _)) => unit,
            Some((None, spanned)) => {
                let at = place_of(self.file, spanned);
                self.error(
                    at,
                    path,
                    format!(
                        "`unit` must be second, minute, hour, day, week, month or year, got `{}`",
                        spanned.as_str()
                    ),
                );
                return None;
            }
            None => {
                self.error(
                    place.clone(),
                    path,
                    "`rate_limit` needs a `unit` (or `unlimited: true`)",
                );
                return None;
            }
        };
        // Left out, it is 0, as the reference server reads it: every hit is over the limit.
        let requests_per_unit = match written
            .requests_per_unit
            .map(|c| (c.trim().parse::<u32>(), c))
        {
            None => 0,
            Some((Ok(n), _)) => n,
            Some((Err(_), count)) => {
                let at = place_of(self.file, &count);
                self.error(
                    at,
                    path,
                    format!(
                        "`requests_per_unit` must be a whole number from 0 (refuse every request) to {}, got `{}`",
                        u32::MAX,
                        count.as_str()
                    ),
                );
                return None;
            }
        };
        Some(Limit::Rate {
            requests_per_unit,
            unit,
            name: written.name,
            replaces,
            algorithm,
        })
    }
}
