//! The plugin stays small: what it links (normal dependencies, as the
//! release binary is built) has no controller, no Kubernetes client, no test
//! tool, and no second HTTP/TLS stack.

use std::process::Command;

#[test]
fn the_binary_links_neither_the_ccm_nor_a_kubernetes_client() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "ecr-credential-provider",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8(output.stdout).expect("UTF-8");
    let packages: Vec<&str> = tree
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        packages.iter().any(|p| p.starts_with("aws-sdk-ecr ")),
        "{tree}"
    );
    let forbidden = [
        "kube ",
        "kube-client ",
        "kube-runtime ",
        "k8s-openapi ",
        "aws-ccm ",
        "ccm-testkit ",
        "aws-sdk-ec2 ",
        "hyper v0.",
        "rustls v0.21",
        "ring ",
        "clap ",
        "tracing-subscriber ",
    ];
    for package in &packages {
        for name in forbidden {
            assert!(!package.starts_with(name), "the plugin links {package}");
        }
    }
}
