//! Which registry an image is in, and so which API, region and partition to
//! ask for its credentials.
//!
//! Private ECR hosts are `<12-digit account>.dkr.ecr[-fips].<region>.<suffix>`
//! or the dual-stack `…dkr-ecr[-fips]…`, with the suffixes of every partition
//! that upstream's `ecrPrivateHostPattern` accepts (the same language: any
//! `dkr.ecr`/`dkr-ecr` form with any suffix, region `[A-Za-z0-9][A-Za-z0-9_-]*`).
//! ECR Public is `public.ecr.aws` or its dual-stack `ecr-public.aws.com`,
//! whose API lives in `us-east-1` only. Any other host is answered, as
//! upstream answers it, with the default region's private ECR token (its
//! main.go: no region in the host falls back to the SDK's default; its
//! test row `registry.k8s.io/foo:latest`); kOps' `useECRCredentialsForMirrors`
//! relies on that. `--non-ecr-hosts=refuse` refuses it instead, before any
//! AWS call.

/// The DNS suffixes of private ECR registries and the partition each belongs to.
const PRIVATE_SUFFIXES: [(&str, &str); 9] = [
    ("amazonaws.com", "aws or aws-us-gov"),
    ("amazonaws.com.cn", "aws-cn"),
    ("amazonaws.eu", "aws-eusc"),
    ("on.aws", "aws or aws-us-gov (dual-stack)"),
    ("on.amazonwebservices.com.cn", "aws-cn (dual-stack)"),
    ("c2s.ic.gov", "aws-iso"),
    ("sc2s.sgov.gov", "aws-iso-b"),
    ("cloud.adc-e.uk", "aws-iso-e"),
    ("csp.hci.ic.gov", "aws-iso-f"),
];

/// The service labels of a private registry host: (label, dual-stack, FIPS).
const SERVICE_FORMS: [(&str, bool, bool); 4] = [
    ("dkr.ecr-fips", false, true),
    ("dkr-ecr-fips", true, true),
    ("dkr.ecr", false, false),
    ("dkr-ecr", true, false),
];

/// ECR Public's registry hosts (IPv4, dual-stack).
pub const PUBLIC_HOSTS: [&str; 2] = ["public.ecr.aws", "ecr-public.aws.com"];

/// ECR Public's API region: the only one.
pub const PUBLIC_REGION: &str = "us-east-1";

/// The registry of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registry {
    /// A private registry: `GetAuthorizationToken` of ECR in its region.
    Private {
        /// The host as written in the image (the key of the answer's `auth`).
        host: String,
        account: String,
        region: String,
        partition: &'static str,
        fips: bool,
        dual_stack: bool,
    },
    /// ECR Public: `GetAuthorizationToken` of ECR Public in `us-east-1`.
    Public { host: String },
    /// Any other host, unless `--non-ecr-hosts=refuse`: the private ECR
    /// token of the default region (upstream's answer for every host, which
    /// kOps' `useECRCredentialsForMirrors` relies on for registry mirrors
    /// backed by an ECR pull-through cache).
    Mirror { host: String },
}

impl Registry {
    /// The host as it appears in the image: the key of the answer's `auth`.
    pub fn host(&self) -> &str {
        match self {
            Registry::Private { host, .. }
            | Registry::Public { host }
            | Registry::Mirror { host } => host,
        }
    }

    /// The region whose API answers for this registry; `None`: the SDK's
    /// default region (`AWS_REGION`, the profile, IMDS).
    pub fn api_region(&self) -> Option<&str> {
        match self {
            Registry::Private { region, .. } => Some(region),
            Registry::Public { .. } => Some(PUBLIC_REGION),
            Registry::Mirror { .. } => None,
        }
    }
}

/// Why an image gets no credentials from this plugin.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("image {image:?} has no registry host")]
    NoHost { image: String },
    #[error(
        "image {image:?}: registry host {host:?} is neither a private ECR registry (<12-digit account>.dkr.ecr.<region>.amazonaws.com, .com.cn, .eu, dkr-ecr dual-stack, -fips, on.aws, or an ISO/EUSC domain) nor ECR Public (public.ecr.aws, ecr-public.aws.com), and --non-ecr-hosts=refuse is set; no AWS call was made. Narrow matchImages in the kubelet's CredentialProviderConfig to ECR hosts, or drop --non-ecr-hosts=refuse to answer other hosts with the default region's token as upstream does"
    )]
    NotEcr { image: String, host: String },
}

/// The registry `image` is pulled from; with `mirrors`, a host that is not
/// ECR's is a [`Registry::Mirror`] instead of an error.
pub fn registry_of(image: &str, mirrors: bool) -> Result<Registry, RegistryError> {
    let host = image_host(image).ok_or_else(|| RegistryError::NoHost {
        image: image.to_owned(),
    })?;
    let lower = host.to_ascii_lowercase();
    if PUBLIC_HOSTS.contains(&lower.as_str()) {
        return Ok(Registry::Public {
            host: host.to_owned(),
        });
    }
    if let Some(private) = private_registry(host) {
        return Ok(private);
    }
    if mirrors {
        return Ok(Registry::Mirror {
            host: host.to_owned(),
        });
    }
    Err(RegistryError::NotEcr {
        image: image.to_owned(),
        host: host.to_owned(),
    })
}

/// The host of an image reference (`host[:port]/path[:tag][@digest]`, with
/// an optional `scheme://`), without its port, as upstream takes it.
fn image_host(image: &str) -> Option<&str> {
    let rest = image.split_once("://").map_or(image, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    valid.then_some(host)
}

/// `host` as a private ECR registry, when it is one.
fn private_registry(host: &str) -> Option<Registry> {
    let lower = host.to_ascii_lowercase();
    PRIVATE_SUFFIXES.iter().find_map(|(suffix, partition)| {
        let prefix = lower.strip_suffix(suffix)?.strip_suffix('.')?;
        let (account, rest) = prefix.split_once('.')?;
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (service, dual_stack, fips) = SERVICE_FORMS.iter().copied().find(|(service, ..)| {
            rest.strip_prefix(service)
                .is_some_and(|r| r.starts_with('.'))
        })?;
        let region = region_in(rest, service)?;
        Some(Registry::Private {
            host: host.to_owned(),
            account: account.to_owned(),
            region: region.to_owned(),
            partition,
            fips,
            dual_stack: dual_stack || suffix.starts_with("on."),
        })
    })
}

/// The region label after `service.` in `rest`, when it is one label of
/// `[A-Za-z0-9][A-Za-z0-9_-]*`.
fn region_in<'a>(rest: &'a str, service: &str) -> Option<&'a str> {
    // `service` may itself contain a dot ("dkr.ecr"): the region is what
    // follows it, and must be a single label.
    let region = rest.strip_prefix(service)?.strip_prefix('.')?;
    let first = region.bytes().next()?;
    let valid = first.is_ascii_alphanumeric()
        && region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    valid.then_some(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private_region(host: &str) -> Option<String> {
        match private_registry(host)? {
            Registry::Private { region, .. } => Some(region),
            Registry::Public { .. } | Registry::Mirror { .. } => None,
        }
    }

    /// Upstream's `TestRegistryPatternMatch` table, case for case.
    #[test]
    fn upstream_pattern_table() {
        let grid = [
            ("123456789012.dkr.ecr.lala-land-1.amazonaws.com", true),
            ("123456789012.dkr.ecr-fips.lala-land-1.amazonaws.com", true),
            ("123456789012.dkr.ecr.lala-land-1.amazonaws.com.cn", true),
            ("123456789012.dkr.ecr.eusc-de-east-1.amazonaws.eu", true),
            (
                "123456789012.dkr.ecr-fips.eusc-de-east-1.amazonaws.eu",
                true,
            ),
            ("1234567890123.dkr.ecr.lala-land-1.amazonaws.com", false),
            ("12345678901.dkr.ecr.lala-land-1.amazonaws.com", false),
            ("12345678901A.dkr.ecr.lala-land-1.amazonaws.com", false),
            ("123456789012.dkr.ecr.lala-land-1!.amazonaws.com", false),
            ("123456789012.dkr.ecr.#lala-land-1.amazonaws.com", false),
            (
                "123456789012.dkr.ecr.lala-land-1.amazonaws.hacker.com",
                false,
            ),
            ("123456789012.dkr.ecr.lala-land-1.hacker.com", false),
            ("123456789012.dkr.ecr.lala-land-1.amazonaws.lol", false),
            ("123456789012.dog.ecr.lala-land-1.amazonaws.com", false),
            ("123456789012.dkr.cat.lala-land-1.amazonaws.com", false),
            ("123456789012.dkr.cat.lala-land-1.awsamazon.com", false),
            ("123456789012.lala-land-1.amazonaws.com", false),
            ("123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov", true),
            ("123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov", true),
            ("123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk", true),
            ("123456789012.dkr.ecr.us-isof-east-1.csp.hci.ic.gov", true),
            ("123456789012.dkr.ecr.us-iso-east-1.amazonaws.gov", false),
            ("123456789012.dkr-ecr.lala-land-1.on.aws", true),
            ("123456789012.dkr-ecr-fips.lala-land-1.on.aws", true),
            (
                "123456789012.dkr-ecr.lala-land-1.on.amazonwebservices.com.cn",
                true,
            ),
        ];
        for (host, expected) in grid {
            assert_eq!(private_registry(host).is_some(), expected, "{host}");
        }
    }

    /// Upstream's `Test_parseRegionFromECRPrivateHost` table.
    #[test]
    fn upstream_region_table() {
        let grid = [
            (
                "123456789123.dkr.ecr.us-west-2.amazonaws.com",
                Some("us-west-2"),
            ),
            (
                "123456789123.dkr.ecr.cn-north-1.amazonaws.com.cn",
                Some("cn-north-1"),
            ),
            (
                "123456789123.dkr.ecr.us-gov-east-1.amazonaws.com",
                Some("us-gov-east-1"),
            ),
            (
                "123456789123.dkr.ecr.us-iso-east-1.c2s.ic.gov",
                Some("us-iso-east-1"),
            ),
            (
                "123456789123.dkr.ecr.eusc-de-east-1.amazonaws.eu",
                Some("eusc-de-east-1"),
            ),
            ("123456789123.dkr-ecr.us-west-2.on.aws", Some("us-west-2")),
            (
                "123456789123.dkr-ecr-fips.us-west-2.on.aws",
                Some("us-west-2"),
            ),
            (
                "123456789123.dkr-ecr.cn-north-1.on.amazonwebservices.com.cn",
                Some("cn-north-1"),
            ),
            (
                "123456789123.dkr-ecr.us-gov-east-1.on.aws",
                Some("us-gov-east-1"),
            ),
            (
                "123456789123.dkr-ecr-fips.us-gov-east-1.on.aws",
                Some("us-gov-east-1"),
            ),
            ("foobar", None),
        ];
        for (host, region) in grid {
            assert_eq!(private_region(host).as_deref(), region, "{host}");
        }
    }

    #[test]
    fn the_regex_language_is_kept_at_its_edges() {
        // Upstream's pattern lets underscores into the region and any
        // dkr.ecr/dkr-ecr form onto any suffix; so does this parser.
        assert_eq!(
            private_region("123456789012.dkr.ecr.a_b-1.amazonaws.com").as_deref(),
            Some("a_b-1")
        );
        assert!(private_registry("123456789012.dkr.ecr.us-west-2.on.aws").is_some());
        assert!(private_registry("123456789012.dkr-ecr.us-west-2.amazonaws.com").is_some());
        // ...but a region is one label, never empty, never starting with '-'.
        assert!(private_registry("123456789012.dkr.ecr.a.b.amazonaws.com").is_none());
        assert!(private_registry("123456789012.dkr.ecr..amazonaws.com").is_none());
        assert!(private_registry("123456789012.dkr.ecr.-a.amazonaws.com").is_none());
        assert!(private_registry("123456789012.dkr.ecr.amazonaws.com").is_none());
        assert!(private_registry("123456789012.dkr.ecr-fipsx.us-west-2.amazonaws.com").is_none());
    }

    #[test]
    fn images_name_their_registry() {
        let private = registry_of(
            "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/app:v1",
            false,
        )
        .expect("private");
        assert_eq!(
            private.host(),
            "123456789012.dkr.ecr.us-west-2.amazonaws.com"
        );
        assert_eq!(private.api_region(), Some("us-west-2"));
        // A public host further down the path is not the registry (upstream's case).
        let nested = registry_of(
            "123456789123.dkr.ecr.us-west-2.amazonaws.com/public.ecr.aws/foo:latest",
            false,
        )
        .expect("private");
        assert!(matches!(nested, Registry::Private { .. }));
        for image in [
            "public.ecr.aws/nginx/nginx:1",
            "ecr-public.aws.com/a/b@sha256:00",
            "https://public.ecr.aws/x",
        ] {
            let public = registry_of(image, false).expect("public");
            assert!(matches!(public, Registry::Public { .. }), "{image}");
            assert_eq!(public.api_region(), Some("us-east-1"));
        }
        let with_port = registry_of(
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com:443/app",
            false,
        )
        .expect("private");
        assert_eq!(
            with_port.host(),
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
        );
        let fips =
            registry_of("123456789012.dkr-ecr-fips.us-gov-west-1.on.aws/app", false).expect("fips");
        assert!(matches!(
            fips,
            Registry::Private {
                fips: true,
                dual_stack: true,
                ..
            }
        ));
    }

    #[test]
    fn other_registries_are_refused_naming_the_image_when_refusing() {
        for image in [
            "registry.k8s.io/pause:3.10",
            "nginx:latest",
            "docker.io/library/nginx",
            "foobar  ",
        ] {
            let err = registry_of(image, false).expect_err("not ECR");
            assert!(err.to_string().contains(&format!("{image:?}")), "{err}");
        }
        // By default, other hosts are mirrors; a missing host is still an error.
        let mirror = registry_of("docker.io/library/nginx:1", true).expect("a mirror");
        assert_eq!(
            mirror,
            Registry::Mirror {
                host: "docker.io".into()
            }
        );
        assert_eq!(mirror.api_region(), None);
        assert!(registry_of("/x", true).is_err());
        assert_eq!(
            registry_of("/x", false),
            Err(RegistryError::NoHost { image: "/x".into() })
        );
    }
}
