//! Policy names the protocols keep for their own rows.
//!
//! The protocols' own rows share the "who is throttled" table, `weir top` and `/metrics` with
//! policies, so their names are kept from policies made in the config file or over the API.

/// The prefix of the policies of Envoy rate limit service rules: `rls:<domain>.<path>`.
pub const RLS_PREFIX: &str = "rls:";

/// Whether `name` is an RLS rule's policy (its YAML's, not the config file's or the API's).
pub fn is_rule_policy(name: &str) -> bool {
    name.starts_with(RLS_PREFIX)
}

/// The policy name the Redis protocol's `CL.THROTTLE` keys are shown under.
pub const CELLS_POLICY: &str = "CL.THROTTLE";

/// Why `name` is kept from policies made in the config file or over the API, if it is: `rls:…`
/// for the policies of RLS rules (their YAML's: a change over the API would be undone at the
/// next start), and `CL.…` (in any case) for the Redis protocol's `CL.THROTTLE` keys.
pub fn reserved_name(name: &str) -> Option<String> {
    if name.starts_with(RLS_PREFIX) {
        return Some(format!(
            "the `{}` prefix names the policies of RLS rules: change the rule in its YAML file (`[rls] config`), not here",
            RLS_PREFIX
        ));
    }
    if name
        .get(..3)
        .is_some_and(|head| head.eq_ignore_ascii_case("cl."))
    {
        return Some(format!(
            "the `CL.` prefix is the Redis protocol's: `{}` rows are its CL.THROTTLE keys",
            CELLS_POLICY
        ));
    }
    None
}
