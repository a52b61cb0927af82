//! The roles of a sandbox's network namespaces: the suffixes their names
//! carry after the sandbox's tag, which cleanup reads back.

/// Roles (namespace suffixes, and directory names under the tag's `/run`
/// directory) of the two-node sandbox's nodes, which each have their own pin
/// root `<PIN_BASE>/<tag>/<role>/bpf` and cgroup `switchboard-test-<tag>-<role>`.
pub const NODE_ROLES: [&str; 2] = ["na", "nb"];

/// Namespace roles: the one-node sandbox's `node`, `cli` and `p<i>`, and the
/// two-node sandbox's `lan`, `na`, `nb`, `c<i>` (clients) and `pa<i>`, `pb<i>`
/// (pods of node A and B).
pub fn is_role(role: &str) -> bool {
    let numbered = |prefix: &str| {
        role.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    matches!(role, "node" | "cli" | "lan")
        || NODE_ROLES.contains(&role)
        || numbered("p")
        || numbered("pa")
        || numbered("pb")
        || numbered("c")
}
