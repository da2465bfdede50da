//! Every partition's host form is matched (and asks ECR in the host's
//! region); every other host is refused before any AWS call, naming the image.

use crate::support::{MOTO_PASSWORD, V1, World, request};

#[tokio::test]
async fn each_partition_s_host_form_asks_ecr_in_its_region() {
    let world = World::start().await;
    let hosts = [
        ("123456789012.dkr.ecr.us-west-2.amazonaws.com", "us-west-2"),
        (
            "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com",
            "us-gov-west-1",
        ),
        (
            "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
            "cn-north-1",
        ),
        (
            "123456789012.dkr.ecr.eusc-de-east-1.amazonaws.eu",
            "eusc-de-east-1",
        ),
        ("123456789012.dkr-ecr.us-east-2.on.aws", "us-east-2"),
        (
            "123456789012.dkr-ecr-fips.us-gov-east-1.on.aws",
            "us-gov-east-1",
        ),
        (
            "123456789012.dkr-ecr.cn-northwest-1.on.amazonwebservices.com.cn",
            "cn-northwest-1",
        ),
        (
            "123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov",
            "us-iso-east-1",
        ),
        (
            "123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov",
            "us-isob-east-1",
        ),
        (
            "123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk",
            "eu-isoe-west-1",
        ),
        (
            "123456789012.dkr.ecr.us-isof-south-1.csp.hci.ic.gov",
            "us-isof-south-1",
        ),
    ];
    for (i, (host, region)) in hosts.iter().enumerate() {
        let response = world
            .run(
                &request(V1, &format!("{host}/app@sha256:{:064}", 0)),
                &[],
                &[],
            )
            .await
            .response();
        assert_eq!(response.auth[*host].password, MOTO_PASSWORD, "{host}");
        let calls = world.proxy.ecr().calls();
        assert_eq!(calls.len(), i + 1);
        assert_eq!(calls[i].region.as_deref(), Some(*region), "{host}");
    }
}

/// With `--non-ecr-hosts=refuse`, an image whose host is not ECR's (or only
/// looks like it) is refused before any AWS call, naming the image.
#[tokio::test]
async fn other_hosts_are_refused_without_a_call_when_refusing() {
    let world = World::start().await;
    let images = [
        "registry.k8s.io/pause:3.10",
        "docker.io/library/nginx:latest",
        "nginx",
        // upstream's refused forms
        "1234567890123.dkr.ecr.us-west-2.amazonaws.com/app",
        "12345678901A.dkr.ecr.us-west-2.amazonaws.com/app",
        "123456789012.dkr.ecr.us-west-2.amazonaws.hacker.com/app",
        "123456789012.dkr.ecr.us-iso-east-1.amazonaws.gov/app",
        "123456789012.dkr.cat.us-west-2.amazonaws.com/app",
        "public.ecr.aws.evil.example/app",
    ];
    for image in images {
        let outcome = world
            .run(&request(V1, image), &["--non-ecr-hosts=refuse"], &[])
            .await;
        let stderr = outcome.failure();
        assert!(
            stderr.contains(&format!("{image:?}")),
            "names the image: {stderr}"
        );
    }
    assert!(
        world.proxy.calls().is_empty(),
        "no AWS call: {:?}",
        world.proxy.calls()
    );
}

#[tokio::test]
async fn malformed_requests_are_refused_with_the_reason() {
    let world = World::start().await;
    let cases = [
        ("not json", "not a JSON object"),
        (
            r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v2","image":"public.ecr.aws/a"}"#,
            "v1, v1beta1 and v1alpha1",
        ),
        (
            r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1"}"#,
            "names no image",
        ),
    ];
    for (input, reason) in cases {
        let outcome = world.run(input, &[], &[]).await;
        assert!(
            outcome.failure().contains(reason),
            "{input}: {}",
            outcome.stderr
        );
    }
    let usage = world.run("", &["--no-such-flag"], &[]).await;
    assert_eq!(usage.code, Some(2));
    assert!(
        usage.stderr.contains("unknown flag \"--no-such-flag\""),
        "{}",
        usage.stderr
    );
    assert!(world.proxy.calls().is_empty());
}

/// kOps runs the plugin with `args: [get-credentials]` and `AWS_REGION`;
/// its `useECRCredentialsForMirrors` sends registry mirrors' hosts, which
/// upstream answers with the default region's token (its test row
/// `registry.k8s.io/foo:latest`). So does this one by default, and with
/// `--non-ecr-hosts=default-region` said outright; `--non-ecr-hosts=refuse`
/// refuses them without a call.
#[tokio::test]
async fn kops_arguments_and_mirror_hosts_answered_as_upstream_by_default() {
    let world = World::start().await;
    let kops_env = [("AWS_REGION", "eu-central-1")];
    let private = format!("{}/app", crate::support::PRIVATE_HOST);
    world
        .run(&request(V1, &private), &["get-credentials"], &kops_env)
        .await
        .response();

    let mut calls = 1;
    for (image, host, args) in [
        (
            "registry.k8s.io/foo:latest",
            "registry.k8s.io",
            &["get-credentials"][..],
        ),
        (
            "docker.io/library/nginx:1.27",
            "docker.io",
            &["get-credentials", "--non-ecr-hosts=default-region"][..],
        ),
    ] {
        let response = world
            .run(&request(V1, image), args, &kops_env)
            .await
            .response();
        assert_eq!(response.auth[host].password, MOTO_PASSWORD, "{image}");
        calls += 1;
        let asked = world.proxy.ecr().calls();
        assert_eq!(asked.len(), calls, "{image}");
        assert_eq!(
            asked[calls - 1].region.as_deref(),
            Some("eu-central-1"),
            "{image}: the default region"
        );
    }

    let mirrored = "docker.io/library/nginx:1.27";
    let refuse = ["get-credentials", "--non-ecr-hosts=refuse"];
    let refused = world.run(&request(V1, mirrored), &refuse, &kops_env).await;
    assert!(
        refused.failure().contains("docker.io"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        world.proxy.ecr().calls().len(),
        calls,
        "a refused host makes no call"
    );

    // No default region anywhere: a clear error, no call.
    let outcome = world
        .run(&request(V1, mirrored), &["get-credentials"], &[])
        .await;
    assert!(
        outcome.failure().contains("set AWS_REGION"),
        "{}",
        outcome.stderr
    );
    assert_eq!(world.proxy.ecr().calls().len(), calls);
}

/// `--install-to` is how a node gets the binary out of the distroless image.
#[tokio::test]
async fn install_to_copies_the_binary_whole() {
    let world = World::start().await;
    let dir = tempfile::tempdir().expect("a directory");
    let target = dir.path().join("ecr-credential-provider");
    let dir_arg = dir.path().to_str().expect("UTF-8 path");
    let outcome = world.run("", &["--install-to", dir_arg], &[]).await;
    assert_eq!(outcome.code, Some(0), "{}", outcome.stderr);
    assert!(
        outcome.stdout.contains(target.to_str().expect("UTF-8")),
        "{}",
        outcome.stdout
    );
    let installed = std::fs::read(&target).expect("installed");
    assert_eq!(
        installed,
        std::fs::read(crate::support::binary()).expect("the binary")
    );
    let missing = world
        .run("", &["--install-to", "/nonexistent/dir"], &[])
        .await;
    assert!(
        missing.failure().contains("not a directory"),
        "{}",
        missing.stderr
    );
    assert!(world.proxy.calls().is_empty());
}
