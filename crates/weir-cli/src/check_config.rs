//! `weir check-config`: a config file and the RLS rules it names (or rules alone) checked, every
//! problem printed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use weir::SystemClock;
use weir::policy::Scope;
use weir_server::ConfigFile;
use weir_server::Overrides;
use weir_server::rls::RulesConfig;
use weir_server::rls::policies_of;

pub(crate) fn check_config(
    file: Option<&PathBuf>,
    rls_config: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let Some(file) = file else {
        // The rules alone, with the `[rls]` table's defaults.
        let path = rls_config.expect("clap requires FILE or --rls-config");
        let table = weir_server::rls::RlsTable::default();
        return Ok(match check_rules(&path, &table) {
            Ok(summary) => {
                println!("{}: ok ({summary})", path.display());
                ExitCode::SUCCESS
            }
            Err(problems) => {
                for problem in &problems {
                    println!("{problem}");
                }
                println!("{} problem(s)", problems.len());
                ExitCode::FAILURE
            }
        });
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    match ConfigFile::parse(&text) {
        Ok(config) => {
            // What `weir serve` would refuse at start is a problem too: the same loading (the
            // environment's token and secret included) and the same exposure check.
            let overrides = Overrides {
                rls_config,
                ..Overrides::default()
            };
            let loaded = weir_server::load_config(Some(file), &overrides);
            let loaded = loaded.and_then(|l| {
                weir_server::check_exposure(&l)?;
                weir_server::check_tls(&l)?;
                Ok(l)
            });
            let loaded = match loaded {
                Ok(loaded) => loaded,
                Err(error) => {
                    println!("{}: {error:#}", file.display());
                    println!("1 problem(s)");
                    return Ok(ExitCode::FAILURE);
                }
            };
            let rules = match &loaded.rls.config {
                None => String::new(),
                Some(path) => match check_rules(path, &loaded.rls) {
                    Ok(summary) => format!(", {summary}"),
                    Err(problems) => {
                        for problem in &problems {
                            println!("{problem}");
                        }
                        println!("{} problem(s)", problems.len());
                        return Ok(ExitCode::FAILURE);
                    }
                },
            };
            for (old, new) in &config.old_names {
                println!(
                    "{}: note: `{old}` is now `{new}` (read as it; rename it)",
                    file.display()
                );
            }
            println!(
                "{}: ok ({} policies{rules})",
                file.display(),
                config.policy.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(problems) => {
            for problem in &problems {
                println!("{}: {problem}", file.display());
            }
            println!("{} problem(s)", problems.len());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Loads the RLS rules at `path` and builds their policies as `serve` builds them (a rate a
/// token bucket cannot hold is found here, not at start): a summary, or every problem.
pub(crate) fn check_rules(
    path: &std::path::Path,
    table: &weir_server::rls::RlsTable,
) -> Result<String, Vec<String>> {
    let rules = RulesConfig::load(path, table.same_domain())
        .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>())?;
    let policies = policies_of(&rules, &table.settings(), Scope::Node);
    // Besides the rules', each domain has a counter per unit for limits sent with requests.
    let count = policies.len() - rules.domains.len() * weir_server::rls::Unit::ALL.len();
    weir::policy::PolicySet::new(policies, SystemClock::new())
        .map_err(|error| vec![format!("{}: {error}", path.display())])?;
    Ok(format!(
        "{} RLS domain(s), {count} counted rule(s)",
        rules.domains.len()
    ))
}
