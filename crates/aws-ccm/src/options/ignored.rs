//! Upstream flags accepted and not acted on: removed from argv before clap
//! parses it, and logged once at start-up.

/// Upstream flags we accept and ignore so existing manifests keep working.
/// `true` = the flag takes a value (`--flag=v` or `--flag v`).
pub(super) const IGNORED_FLAGS: &[(&str, bool)] = &[
    ("use-service-account-credentials", false),
    ("feature-gates", true),
    ("profiling", false),
    ("contention-profiling", false),
    ("external-cloud-volume-plugin", true),
    ("controller-start-interval", true),
    ("node-sync-period", true),
    ("cidr-allocator-type", true),
    ("enable-leader-migration", false),
    ("leader-migration-config", true),
    ("client-ca-file", true),
    ("requestheader-client-ca-file", true),
    ("requestheader-allowed-names", true),
    ("requestheader-extra-headers-prefix", true),
    ("requestheader-group-headers", true),
    ("requestheader-username-headers", true),
    ("requestheader-uid-headers", true),
    ("cert-dir", true),
    ("tls-sni-cert-key", true),
    ("http2-max-streams-per-connection", true),
    // Go's TLS key-exchange groups by number: rustls offers its own safe set
    // (X25519, P-256, P-384 and the post-quantum hybrid).
    ("tls-curve-preferences", true),
    ("permit-port-sharing", false),
    ("permit-address-sharing", false),
    ("logtostderr", false),
    ("alsologtostderr", false),
    ("log-dir", true),
    ("log-file", true),
    ("log-file-max-size", true),
    ("log-flush-frequency", true),
    ("vmodule", true),
    ("stderrthreshold", true),
    ("skip-headers", false),
    ("skip-log-headers", false),
    ("one-output", false),
    ("add-dir-header", false),
    ("node-status-update-frequency-jitter", true),
    ("leader-elect-resource-lock-namespace", true),
    ("concurrent-node-status-updates", true),
    // The Go tagging controller's queue tuning: here tag calls are batched
    // and rate-limited at the one door to AWS, always.
    ("tagging-controller-rate-limit", true),
    ("tagging-controller-burst-limit", true),
    ("tagging-controller-concurrent-node-syncs", true),
    ("tagging-controller-enable-batching", false),
    // component-base logging: split streams and buffering are tuning of
    // klog's writers; here logs go to stderr, unbuffered, in one stream.
    ("log-text-split-stream", false),
    ("log-text-info-buffer-size", true),
    ("log-json-split-stream", false),
    ("log-json-info-buffer-size", true),
    // k8s.io/cloud-provider webhooks: the Go AWS CCM registers no webhook,
    // so there is nothing to serve; these flags select and serve none.
    ("webhooks", true),
    ("webhook-bind-address", true),
    ("webhook-secure-port", true),
    ("webhook-disable-http2-serving", false),
    ("webhook-cert-dir", true),
    ("webhook-tls-cert-file", true),
    ("webhook-tls-private-key-file", true),
    ("webhook-tls-cipher-suites", true),
    ("webhook-tls-min-version", true),
    ("webhook-tls-sni-cert-key", true),
    ("webhook-tls-curve-preferences", true),
];

/// Removes the flags of [`IGNORED_FLAGS`] (and their values) from argv;
/// returns what is left and the names removed.
pub(super) fn strip_ignored(args: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut ignored = Vec::new();
    let mut iter = args.into_iter().peekable();
    if let Some(program) = iter.next() {
        kept.push(program);
    }
    while let Some(arg) = iter.next() {
        let name = arg
            .strip_prefix("--")
            .map(|rest| rest.split_once('=').map_or(rest, |(n, _)| n));
        let matched = name.and_then(|n| IGNORED_FLAGS.iter().find(|(flag, _)| *flag == n));
        match matched {
            Some((flag, takes_value)) => {
                ignored.push((*flag).to_string());
                // `--flag value` form: the value is the next argument.
                if *takes_value
                    && !arg.contains('=')
                    && iter.peek().is_some_and(|next| !next.starts_with("--"))
                {
                    iter.next();
                }
            }
            None => kept.push(arg),
        }
    }
    (kept, ignored)
}
