//! The rules files read and parsed whole: a file or a directory (its subdirectories too), one
//! domain to a file or domains merged, every mistake of every file returned together.

use std::path::{Path, PathBuf};

use super::config::{DomainRules, Node, Place, RuleError, RulesConfig};
use super::yaml::parse_file;

/// How deep subdirectories are followed: a symlink back up the tree ends here.
const MAX_DEPTH: usize = 16;

/// Every file under `dir`, in its subdirectories too, but for names starting with `.`.
fn rules_files(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    walk(dir, files, 0)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>, depth: usize) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "{} is more than {MAX_DEPTH} directories deep (a symlink loop?)",
            dir.display()
        )));
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if path.is_dir() {
            walk(&path, files, depth + 1)?;
        } else if path.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

/// What two files that define one domain mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SameDomain {
    /// A mistake, named (the reference server's default).
    #[default]
    Refused,
    /// The later file's descriptors join the domain's (`[rls] merge_domains`, the reference
    /// server's `MERGE_DOMAIN_CONFIG`); one key and value defined in both is a mistake.
    Merged,
}

/// Adds `more`'s descriptors to `domain`'s, each one whose key and value `domain` already
/// has named as a mistake where `more` writes it.
fn merge(domain: &mut DomainRules, more: DomainRules, errors: &mut Vec<RuleError>) {
    for node in more.descriptors {
        let same = |d: &&Node| d.key == node.key && d.value == node.value;
        if let Some(first) = domain.descriptors.iter().find(same) {
            errors.push(RuleError {
                place: node.place.clone(),
                rule: Some(node.path.clone()),
                problem: format!(
                    "the domain's files define this key and value twice (first at {})",
                    first.place
                ),
            });
            continue;
        }
        domain.descriptors.push(node);
    }
}

impl RulesConfig {
    /// Reads `path`: a rules file, or a directory whose every file is one, in its
    /// subdirectories too, whatever their names, as the reference server loads its directory
    /// (several ConfigMaps mounted side by side). Names starting with `.` are skipped: a
    /// mounted ConfigMap keeps its files' real copies in `..data` and dated `..` directories
    /// beside the links to them, which would otherwise be read twice. Files are read in path
    /// order; `same_domain` says what two files defining one domain mean. Every mistake of
    /// every file is returned.
    pub fn load(path: &Path, same_domain: SameDomain) -> Result<RulesConfig, Vec<RuleError>> {
        let at_path = |problem: String| {
            vec![RuleError {
                place: Place::file(path),
                rule: None,
                problem,
            }]
        };
        let files = if path.is_dir() {
            let mut files = Vec::new();
            rules_files(path, &mut files)
                .map_err(|e| at_path(format!("cannot read the directory: {e}")))?;
            files.sort();
            if files.is_empty() {
                return Err(at_path(
                    "holds no file (names starting with `.` are skipped): there are no rules to load"
                        .to_owned(),
                ));
            }
            files
        } else {
            vec![path.to_owned()]
        };
        let mut texts = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| {
                vec![RuleError {
                    place: Place::file(&file),
                    rule: None,
                    problem: format!("cannot be read: {e}"),
                }]
            })?;
            texts.push((file, text));
        }
        RulesConfig::parse_with(
            texts.iter().map(|(f, t)| (f.as_path(), t.as_str())),
            same_domain,
        )
    }

    /// Parses files given as (name, text), one domain to a file. Every mistake of every file
    /// is returned.
    pub fn parse<'a>(
        files: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<RulesConfig, Vec<RuleError>> {
        RulesConfig::parse_with(files, SameDomain::Refused)
    }

    /// Parses files given as (name, text), `same_domain` saying what two files defining one
    /// domain mean. Every mistake of every file is returned.
    pub fn parse_with<'a>(
        files: impl IntoIterator<Item = (&'a Path, &'a str)>,
        same_domain: SameDomain,
    ) -> Result<RulesConfig, Vec<RuleError>> {
        let mut errors = Vec::new();
        let mut domains: Vec<DomainRules> = Vec::new();
        for (file, text) in files {
            let Some(rules) = parse_file(file, text, &mut errors) else {
                continue;
            };
            match (
                domains.iter_mut().find(|d| d.domain == rules.domain),
                same_domain,
            ) {
                (Some(first), SameDomain::Merged) => merge(first, rules, &mut errors),
                (Some(first), SameDomain::Refused) => errors.push(RuleError {
                    place: Place::file(file),
                    rule: None,
                    problem: format!(
                        "domain `{}` is already defined in {}: one file per domain (or `merge_domains = true` in [rls])",
                        rules.domain,
                        first.file.display()
                    ),
                }),
                (None, _) => domains.push(rules),
            }
        }
        // A path names a rule's policy: two rules may not share one, whatever levels or
        // domains they come from (`b.c` at the top, or `b` then `c`).
        let mut paths: std::collections::HashMap<&str, &Place> = std::collections::HashMap::new();
        let mut stack: Vec<&Node> = domains.iter().flat_map(|d| &d.descriptors).collect();
        while let Some(node) = stack.pop() {
            stack.extend(&node.children);
            if node.limit.is_none() {
                continue;
            }
            if let Some(first) = paths.insert(&node.path, &node.place) {
                let (first, again) = if (first.file.as_path(), first.line)
                    <= (node.place.file.as_path(), node.place.line)
                {
                    (first, &node.place)
                } else {
                    (&node.place, first)
                };
                errors.push(RuleError {
                    place: again.clone(),
                    rule: Some(node.path.clone()),
                    problem: format!(
                        "has the same path as the rule at {first}: two rules would count as one policy (rename a key or a domain)"
                    ),
                });
            }
        }
        if errors.is_empty() {
            Ok(RulesConfig { domains })
        } else {
            Err(errors)
        }
    }
}
