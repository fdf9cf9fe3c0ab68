//! `check-config --print`: the config written back in the file's own
//! schema (the same structs a file is read into), every default filled in,
//! so it can be read again. Secrets never appear: URL passwords become
//! `<redacted>`, and the cluster secret and the etcd password become
//! `${VAR}` references to set at run time.

use super::{file, Config};

/// The variable `--print` writes in place of `proxy.cluster_secret`.
pub(crate) const CLUSTER_SECRET_VAR: &str = "ROLEGATE_CLUSTER_SECRET";

impl Config {
    /// The resolved config as YAML in the file's own schema: every default
    /// filled in, `retry_after` computed, secrets redacted (see the module
    /// doc). `check-config` accepts it again.
    pub fn to_yaml(&self) -> String {
        let mut printed = self.clone();
        printed.proxy.retry_after = Some(self.retry_after_secs());
        file::render(&printed)
    }
}
