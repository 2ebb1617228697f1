//! What the benchmark examples share.

/// A matrix shape from the environment variable `var` as `rows,cols`, else `default`.
pub fn shape_from_env(var: &str, default: (usize, usize)) -> (usize, usize) {
    std::env::var(var)
        .ok()
        .and_then(|v| {
            let (r, c) = v.split_once(',')?;
            Some((r.trim().parse().ok()?, c.trim().parse().ok()?))
        })
        .unwrap_or(default)
}
